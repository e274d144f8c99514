// Builds a frame: tensors are encoded as they are added, the layout is fixed at finish.
// With a scratch folder the encoded sections go to an unnamed file there as they are made,
// and large tensors are encoded in bands of rows, so memory stays bounded by a band.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/ctx.h"
#include "common/output_file.h"
#include "container/layout.h"
#include "container/sections.h"
#include "gift/gift.h"
#include "numerics/shapes.h"

namespace gift::container {

struct TensorShape : MatrixView {
  std::vector<uint64_t> dims;
};

// Checks dims (count, overflow) and derives the codec's view.
giftResult_t make_shape(const uint64_t* dims, uint32_t ndim, TensorShape* out);

// Tests reach the spilled scales of large tensors with small ones: scales held in memory up
// to `bytes` a tensor from now on; returns the bound before.
uint64_t set_held_scale_bytes_for_test(uint64_t bytes);

// How a tensor's codes relate to its values (Euclidean, or a GIFT basis), and why.
struct CoordsChoice {
  bool gift = false;
  uint64_t basis_lo = 0, basis_hi = 0;
  bool has_selection = false;
  // Estimated relative L2 round-trip errors; NaN where not estimated.
  float euclidean_error = NAN, gift_error = NAN;
  double transform_flops = 0;
  std::string reason;
};

// Where a frame writer's tensors are encoded in bands: the codes of a band (two, written in
// turn) and the tensor's held scales. Kept from tensor to tensor where they are of a common
// band's size: allocated anew, each tensor's pages were faulted in and zeroed again, 5,000
// faults in giftc encode of 512 MiB of bf16 in 8 tensors (about 5% of its time on one thread).
struct BandBuffers {
  std::unique_ptr<uint8_t[]> codes[2];
  uint64_t codes_bytes = 0;  // of each
  std::vector<uint8_t> scales;

  void release_codes() {
    codes[0].reset();
    codes[1].reset();
    codes_bytes = 0;
  }
};

class FrameWriter {
 public:
  FrameWriter() = default;
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;
  ~FrameWriter();
  void set_compression(int zstd_level) { zstd_level_ = zstd_level; }
  int compression() const { return zstd_level_; }
  void set_threads(int threads) { ctx_.threads = threads; }
  // The threads its work runs on (thread_count of its context).
  int threads() const { return thread_count(&ctx_); }
  // The codec add_tensor runs: giftEncode, or one with its contract on other hardware
  // (giftc --device cuda).
  void set_encoder(decltype(&giftEncode) encoder) { encoder_ = encoder; }
  // A frame of kind Basis whose own id is (lo, hi).
  void set_basis_kind(uint64_t lo, uint64_t hi) {
    basis_kind_ = true;
    basis_lo_ = lo;
    basis_hi_ = hi;
  }
  // A complete basis frame carried inside this one.
  giftResult_t embed_basis(std::vector<uint8_t> bytes, uint64_t lo, uint64_t hi);
  // Sections made from now on are kept in an unnamed file in `dir`, not in memory.
  giftResult_t use_scratch(const std::string& dir);
  // What the header's length depends on, for stream_to: each tensor's name, number of
  // dimensions and whether it is stored losslessly.
  struct Declared {
    std::string name;
    uint32_t ndim;
    bool lossless;
  };
  // Sections of tensors added from now on go straight into `out` (a file, empty), after room
  // for the header of a frame of the declared tensors (with the metadata and basis given so
  // far, no selections); write_to(out), once, then writes the header in front. A frame that
  // turns out different (other tensors, selections of coordinates, metadata added later) is
  // still right: write_to copies the sections once into the output started again. `out`
  // refuses to commit until then; freed first, it leaves this writer refusing everything.
  giftResult_t stream_to(OutputFile* out, const std::vector<Declared>& tensors);
  giftResult_t add_metadata(std::string key, std::string value);
  // params == nullptr: stored losslessly; otherwise valid (gift::load_params). `dtype` is the
  // tensor's own type; data_dtype that of `data` (fp32 for values already moved into a GIFT frame).
  giftResult_t add_tensor(const std::string& name, const TensorShape& shape, giftDType_t dtype,
                          const void* data, const giftQuantParams* params,
                          const CoordsChoice* coords = nullptr, int data_dtype = -1);
  // Writes rows [first_row, first_row + rows) of a tensor's fp32 values to dst, or refuses
  // them (false).
  using RowSource = std::function<bool(uint64_t first_row, uint64_t rows, float* dst)>;
  // add_tensor of fp32 values that `fill` produces in bands: as many rows at a time as the
  // writer encodes in bands (else all of them at once), so a writer with a scratch file never
  // holds the tensor. If fill refuses a band, nothing is added and *refused is set.
  giftResult_t add_tensor_rows(const std::string& name, const TensorShape& shape, giftDType_t dtype,
                               const giftQuantParams& params, const CoordsChoice& coords,
                               const RowSource& fill, bool* refused);
  giftResult_t finish(std::vector<uint8_t>* out) const;
  // The frame's bytes in order to `out` (not committed).
  giftResult_t write_to(OutputFile* out);

 private:
  struct Pending {
    std::string name;
    TensorShape shape;
    giftDType_t dtype;
    bool raw;
    giftQuantParams params;
    giftEncodeStats stats;
    float rms;  // over the finite values
    StoredSection codes, scales;
    CoordsChoice coords;
  };
  struct Placed {
    const StoredSection* section;
    uint64_t offset;
  };
  // A deque: a frame of many tensors holds their records once (a vector's growth held 1.5 of
  // them at a time, 400 bytes a tensor).
  using PendingList = std::deque<Pending>;
  // The header, with the sections placed after it, and where the frame ends.
  struct Layout {
    std::array<uint8_t, kPreambleBytes> preamble;
    flatbuffers::DetachedBuffer header;  // the builder's own bytes, not a copy
    std::vector<Placed> sections;
    uint64_t data_start = 0, end = 0;
  };
  giftResult_t layout(const PendingList& tensors, Layout* out) const;
  // Puts the section's bytes in `file`, if any, at the next multiple of 64 (in the output,
  // where it lies in the frame); begin_section only records that place.
  giftResult_t keep(StoredSection* s, SectionFile* file);
  giftResult_t begin_section(StoredSection* s, SectionFile* file);
  // write_to of a streamed frame whose sections lie where the layout puts them: the sections
  // not streamed (an embedded basis) after them, then the header in front.
  bool streamed_in_place(const OutputFile* out, const Layout& l) const;
  giftResult_t finish_in_place(OutputFile* out, const Layout& l) const;
  // The frame's bytes in order to `out`, spilled sections copied from the scratch file or,
  // streamed ones, from `streamed_fd`.
  giftResult_t copy_out(OutputFile* out, const Layout& l, int streamed_fd) const;
  // FP8 codes and scales made band by band straight into the sink (scratch file or output).
  // A band's rows [first_row, first_row + rows) in data_dtype, or null to refuse the tensor.
  using BandAt = std::function<const void*(uint64_t first_row, uint64_t rows)>;
  giftResult_t encode_in_bands(Pending* t, const BandAt& band_at, giftDType_t data_dtype,
                               bool* refused);
  // With `coords`, a tensor in GIFT coordinates must be in the embedded basis, if any.
  giftResult_t check_new_tensor(const std::string& name, giftDType_t dtype,
                                const CoordsChoice* coords = nullptr) const;
  // Whether `bytes` more of strings (a tensor's name, a metadata entry) leave the header
  // within kMaxHeaderBytes, counting the strings alone: a frame past it is refused when the
  // string is added, not only when the header is laid out.
  giftResult_t check_header_room(const std::string& what, uint64_t bytes) const;
  // A tensor in GIFT coordinates in another basis than (lo, hi), the embedded one, is refused:
  // the frame would not decode on its own.
  static giftResult_t check_basis(const std::string& name, const CoordsChoice& c, uint64_t lo,
                                  uint64_t hi);
  // A section's raw bytes, handed in order to `put`; a piece's bytes stay as they are until
  // the next put returns (or the walk ends), since put may write them behind.
  using Put = std::function<giftResult_t(const void* data, uint64_t size)>;
  using Pieces = std::function<giftResult_t(const Put& put)>;
  // Stores a section of raw_length bytes in the sink as `pieces` produces them,
  // compressed under zstd if that makes it smaller (else produced again, stored raw), with
  // `behind` the raw pieces written behind (SectionFile::write_behind).
  giftResult_t spill_section(StoredSection* s, uint64_t raw_length, const Pieces& pieces,
                             bool behind);
  bool bands_apply(const giftQuantParams& p) const;

  bool basis_kind_ = false, has_embedded_ = false;
  uint64_t basis_lo_ = 0, basis_hi_ = 0;
  uint64_t header_strings_ = 0;  // bytes of the tensors' names and of the metadata
  StoredSection embedded_;
  int zstd_level_ = 0;
  giftCtx ctx_;
  decltype(&giftEncode) encoder_ = &giftEncode;
  std::vector<std::pair<std::string, std::string>> metadata_;
  PendingList tensors_;
  std::unordered_set<std::string> names_;  // tensors_' names: a check per tensor, not a scan
  ScratchFile scratch_;
  BandBuffers buffers_;
  SectionFile* sink_ = nullptr;  // where sections go as they are made: scratch_, stream_ or memory
  // Streaming: none, into stream_ (until write_to), finished, or its output freed first.
  enum class Stream { kNone, kOpen, kFinished, kLost } stream_state_ = Stream::kNone;
  OutputFile* stream_ = nullptr;
  uint64_t stream_base_ = 0;  // where stream_to put the first section
  giftResult_t check_stream_open(const char* what) const;
};

}  // namespace gift::container
