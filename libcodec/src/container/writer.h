// Builds a frame: tensors are encoded as they are added, the layout is fixed at finish.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "container/sections.h"
#include "gift/gift.h"

namespace gift::container {

struct TensorShape {
  std::vector<uint64_t> dims;
  uint64_t rows = 1, cols = 1;  // the codec's view: cols = last dim, rows = the rest
  uint64_t elements = 1;
};

// Checks dims (count, overflow) and derives the codec's view.
giftResult_t make_shape(const uint64_t* dims, uint32_t ndim, TensorShape* out);

class FrameWriter {
 public:
  void set_compression(int zstd_level) { zstd_level_ = zstd_level; }
  void add_metadata(std::string key, std::string value) {
    metadata_.emplace_back(std::move(key), std::move(value));
  }
  // params == nullptr: stored losslessly.
  giftResult_t add_tensor(const std::string& name, const TensorShape& shape, giftDType_t dtype,
                          const void* data, const giftQuantParams* params);
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
  };
  int zstd_level_ = 0;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<Pending> tensors_;
};

// Writes bytes to path via a temporary file in the same folder and a rename.
giftResult_t write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace gift::container
