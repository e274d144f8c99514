// Opens a frame from untrusted bytes: everything is verified before any byte is used.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/ctx.h"
#include "container/sections.h"
#include "gift/gift.h"

namespace gift::fb {
struct Frame;
struct Tensor;
struct Section;
}  // namespace gift::fb

namespace gift::container {

// Bytes a frame reads from: a caller's buffer or a memory-mapped file.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual const uint8_t* data() const = 0;
  virtual uint64_t size() const = 0;
};

std::unique_ptr<ByteSource> borrow_bytes(const void* data, uint64_t size);
giftResult_t map_file(const std::string& path, std::unique_ptr<ByteSource>* out);

struct TensorEntry {
  const fb::Tensor* fb;
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t rows, cols, elements;
  giftDType_t dtype;
  bool raw;
  giftQuantParams params;
  uint64_t codes_bytes, scale_bytes;  // raw lengths the tensor needs
};

class FrameReader {
 public:
  // Verifies preamble, header and every reference; `name` is used in messages.
  static giftResult_t open(std::unique_ptr<ByteSource> bytes, const std::string& name,
                           std::unique_ptr<FrameReader>* out);

  uint16_t minor_version() const { return minor_; }
  uint64_t frame_length() const { return frame_length_; }
  const std::string& name() const { return name_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const fb::Frame* header() const { return header_; }
  // The frame's bytes as opened (for a basis frame, which is parsed again as a basis).
  const uint8_t* bytes() const { return bytes_->data(); }

  // The raw (decompressed, checksum-verified) bytes of a section. Uncompressed sections are
  // returned in place; compressed ones are expanded into *scratch.
  giftResult_t section_bytes(const fb::Section* s, const std::string& what,
                             std::vector<uint8_t>* scratch, const uint8_t** bytes) const;

  // The checks every decode makes first, before anything else can fail: the tensor exists,
  // the output type is known, the caller's buffer is there and large enough (for `elements`
  // of the tensor; by default all).
  giftResult_t check_output(size_t index, const void* dst, uint64_t dst_bytes,
                            giftDType_t dst_dtype, uint64_t elements = UINT64_MAX) const;

  // A tensor in GIFT coordinates needs its basis (coords/select.h applies it); with
  // `coded_values` its codes are decoded as they are, in the basis' coordinates.
  giftResult_t decode(size_t index, void* dst, uint64_t dst_bytes, giftDType_t dst_dtype,
                      bool coded_values = false) const;

  // A tensor's sections for a run of decode_rows calls, checked when the run starts:
  // compressed codes and scales are read forward through windows (bands in order decompress
  // each section once, but for a row of tiles with over 256 KiB of scales whose rows are taken
  // in parts: each row goes back to the row's first scales). With late_checksums
  // (giftFrameSetLateChecksums), uncompressed codes are instead hashed band by band as bands
  // are decoded in order, and the last band's call compares the sum; a band out of order
  // checks the whole section first, and so does every run of a tensor found damaged.
  struct SectionCache {
    bool late_checksums = false;
    size_t index = SIZE_MAX;
    const uint8_t *codes = nullptr, *scales = nullptr;  // null when windowed
    SectionWindow codes_window, scales_window;
    bool scales_windowed = false;
    std::vector<uint8_t> scales_scratch;
    // While late checksums are pending: the hash of codes [0, hashed).
    std::optional<Checksum64> hash;
    uint64_t hashed = 0;
    std::vector<size_t> damaged;  // tensors whose late checksum failed
    // Bytes [at, at + n) of the codes (or raw data).
    giftResult_t codes_at(uint64_t at, uint64_t n, const uint8_t** bytes) {
      if (codes) return *bytes = codes + at, GIFT_OK;
      return codes_window.get(at, n, bytes);
    }
    // Bytes [at, at + n) of the scales (a compressed section's through its own window, so
    // that a tensor's scales are not held whole either).
    giftResult_t scales_at(uint64_t at, uint64_t n, const uint8_t** bytes) {
      if (scales_windowed) return scales_window.get(at, n, bytes);
      return *bytes = scales ? scales + at : nullptr, GIFT_OK;
    }
  };
  // A part of a tensor's rows x cols view: whole rows [row, row + rows), or with rows = 1,
  // columns [col, col + cols) of one row.
  struct Band {
    uint64_t row, rows, col, cols;
  };
  // Whether rows [first_row, first_row + rows) of tensor `index` (which exists) may be
  // decoded as a band: within the tensor, and not across a tile's edge (see decode_rows).
  giftResult_t check_rows(size_t index, uint64_t first_row, uint64_t rows) const;
  // Rows [first_row, first_row + rows) of the rows x cols view, as decode() gives them.
  // first_row must be a multiple of row_unit(), or the rows lie within one such unit (a tile's
  // rows). The tensor's sections are checked when `cache` does not hold them yet (a
  // compressed one expanded into it).
  giftResult_t decode_rows(size_t index, uint64_t first_row, uint64_t rows, void* dst,
                           uint64_t dst_bytes, giftDType_t dst_dtype, bool coded_values,
                           SectionCache* cache) const;
  // Columns [first_col, first_col + cols) of one row, as decode() gives them: rows too long
  // for one buffer. first_col must be a multiple of col_unit(), which a tensor in GIFT
  // coordinates does not have (its inverse transform takes whole rows).
  giftResult_t decode_row_part(size_t index, uint64_t row, uint64_t first_col, uint64_t cols,
                               void* dst, uint64_t dst_bytes, giftDType_t dst_dtype,
                               SectionCache* cache) const;
  // Where a band of rows may start: a tile's height, or any row.
  static uint64_t row_unit(const TensorEntry& e);
  // Where a part of a row may start: a block's or a tile's width, or any column; 0 for a
  // tensor in GIFT coordinates (whole rows only).
  static uint64_t col_unit(const TensorEntry& e);

  // The embedded basis frame's bytes, or size 0 when there is none.
  giftResult_t embedded_basis(std::vector<uint8_t>* scratch, const uint8_t** bytes,
                              uint64_t* size) const;
  giftResult_t verify_all() const;

  // The codec decode() runs: giftDecode, or one with its contract on other hardware
  // (giftc --device cuda). verify_all() always decodes on the CPU.
  void set_decoder(decltype(&giftDecode) decoder) { decoder_ = decoder; }
  void set_threads(int threads) { ctx_.threads = threads; }
  // The threads its work runs on (thread_count of its context).
  int threads() const { return thread_count(&ctx_); }

 private:
  giftResult_t verify_structure();
  giftResult_t verify_strings() const;
  giftResult_t fetch(size_t index, SectionCache* cache) const;
  giftResult_t checksum_ok(const fb::Section* s, const std::string& what) const;
  giftResult_t checksum_is(uint64_t sum, const fb::Section* s, const std::string& what) const;
  giftResult_t decode_band(const TensorEntry& e, SectionCache& c, const Band& b, void* dst,
                           giftDType_t dst_dtype, decltype(&giftDecode) decoder) const;
  giftResult_t decode_codes(const TensorEntry& e, SectionCache& c, const Band& b, void* dst,
                            giftDType_t dst_dtype, decltype(&giftDecode) decoder) const;
  static std::string codes_name(const TensorEntry& e);
  static const uint8_t* aligned_scales(const TensorEntry& e, const uint8_t* scales,
                                       std::vector<uint8_t>* scratch);

  std::unique_ptr<ByteSource> bytes_;
  std::string name_;
  uint16_t minor_ = 0;
  uint64_t frame_length_ = 0, data_start_ = 0;
  std::vector<uint8_t> header_bytes_;
  const fb::Frame* header_ = nullptr;
  std::vector<TensorEntry> tensors_;
  decltype(&giftDecode) decoder_ = &giftDecode;
  giftCtx ctx_;
};

}  // namespace gift::container
