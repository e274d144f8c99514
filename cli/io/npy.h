// NumPy .npy files (format versions 1.0 to 3.0), little-endian fp32 and fp16 in C order:
// the gradient dumps people already have. Reading validates everything before trusting it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gift/gift.h"

namespace gift::io {

struct NpyArray {
  std::vector<uint64_t> shape;  // empty for a 0-d array
  giftDType_t dtype = GIFT_DTYPE_F32;
  std::vector<uint8_t> data;  // little-endian elements, C order

  uint64_t count() const;
};

// Reads `path`. On failure throws a giftc::Failure whose message names the file and the
// problem: kIoError for a file that cannot be read, kBadInput for one that is not a
// supported .npy.
void read_npy(const std::string& path, NpyArray* out);

// Parses an in-memory .npy image; `name` is used in messages.
void parse_npy(const uint8_t* bytes, uint64_t size, const std::string& name, NpyArray* out);

// A header is a Python dict literal padded to 64 bytes; NumPy writes a few hundred bytes.
// Anything larger than 64 KiB is not a header NumPy wrote. With the preamble before it, the
// most bytes parse_npy_header reads.
constexpr uint64_t kNpyMostHeaderBytes = 12 + (uint64_t(1) << 16);

// The same without copying the data: shape and dtype, and where the data starts. It reads
// no more than the first kNpyMostHeaderBytes of the size bytes.
void parse_npy_header(const uint8_t* bytes, uint64_t size, const std::string& name,
                      std::vector<uint64_t>* shape, giftDType_t* dtype, uint64_t* data_offset);

}  // namespace gift::io
