// Builds a frame: tensors are encoded as they are added, the layout is fixed at finish.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/ctx.h"
#include "container/sections.h"
#include "gift/gift.h"
#include "numerics/shapes.h"

namespace gift::container {

struct TensorShape : MatrixView {
  std::vector<uint64_t> dims;
};

// Checks dims (count, overflow) and derives the codec's view.
giftResult_t make_shape(const uint64_t* dims, uint32_t ndim, TensorShape* out);

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

class FrameWriter {
 public:
  void set_compression(int zstd_level) { zstd_level_ = zstd_level; }
  int compression() const { return zstd_level_; }
  void set_threads(int threads) { ctx_.threads = threads; }
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
  void embed_basis(std::vector<uint8_t> bytes, uint64_t lo, uint64_t hi) {
    embedded_ = store_section(std::move(bytes), zstd_level_);
    has_embedded_ = true;
    basis_lo_ = lo;
    basis_hi_ = hi;
  }
  giftResult_t add_metadata(std::string key, std::string value);
  // params == nullptr: stored losslessly; otherwise valid (gift::load_params). `dtype` is the
  // tensor's own type; data_dtype that of `data` (fp32 for values already moved into a GIFT frame).
  giftResult_t add_tensor(const std::string& name, const TensorShape& shape, giftDType_t dtype,
                          const void* data, const giftQuantParams* params,
                          const CoordsChoice* coords = nullptr, int data_dtype = -1);
  giftResult_t finish(std::vector<uint8_t>* out) const;

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
  bool basis_kind_ = false, has_embedded_ = false;
  uint64_t basis_lo_ = 0, basis_hi_ = 0;
  StoredSection embedded_;
  int zstd_level_ = 0;
  giftCtx ctx_;
  decltype(&giftEncode) encoder_ = &giftEncode;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<Pending> tensors_;
};

// Writes bytes to path via a temporary file in the same folder and a rename.
giftResult_t write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);
giftResult_t write_file_atomically(const std::string& path, const uint8_t* data, uint64_t size);

}  // namespace gift::container
