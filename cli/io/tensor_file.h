// Gradient dumps people already have: safetensors, NumPy .npy and .npz. Reading validates
// the container before trusting any byte and memory-maps large files; writing goes through
// a temporary name and a rename.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gift/gift.h"

namespace gift::io {

struct TensorRef {
  std::string name;
  std::vector<uint64_t> shape;
  giftDType_t dtype;
  const uint8_t* data;  // little-endian, C order; owned by the TensorFile
  uint64_t bytes;

  uint64_t elements() const;
};

// A set of named tensors and free key/value metadata, with the storage they point into.
struct TensorFile {
  std::vector<TensorRef> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  std::vector<std::shared_ptr<void>> storage;
};

// A tensor's values as fp32 (exact for every supported dtype).
std::vector<float> widen_to_float(const TensorRef& t);

enum class FileKind { kSafetensors, kNpy, kNpz, kUnknown };

// By extension (.safetensors, .npy, .npz).
FileKind kind_of_path(const std::string& path);

// Reads any supported kind. Errors are giftc::Failure naming the file (and tensor): kIoError
// for files that cannot be read, kBadInput for malformed or unsupported ones.
void read_tensor_file(const std::string& path, TensorFile* out);

void parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& name,
                       TensorFile* out);

// Tensors given as (name, shape, dtype, bytes).
struct OwnedTensor {
  std::string name;
  std::vector<uint64_t> shape;
  giftDType_t dtype;
  std::vector<uint8_t> data;
};

std::vector<uint8_t> serialize_safetensors(const std::vector<OwnedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata);
std::vector<uint8_t> serialize_npy(const OwnedTensor& tensor);

}  // namespace gift::io
