// Reading the caller's config and bucket description, shared by the plans (CPU and device)
// and the communicators.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gift/gift_transport.h"

namespace gift::transport {

// Copies at most config->size bytes of the caller's struct over the defaults (NULL gives the
// defaults), so that callers built against an older or newer header are read safely.
giftResult_t read_config(const giftAllReduceConfig* config, giftAllReduceConfig* out);

// read_config for the device path: NULL gives the defaults without integrity checksums,
// and what the device does not do (checksums, dumps) is refused.
giftResult_t read_device_config(const giftAllReduceConfig* config, giftAllReduceConfig* out);

// The codec parameters of every encode of a plan: block scales as the config says.
giftQuantParams quant_params(const giftAllReduceConfig& c);

// A bucket's tensors, checked: tensor i is flat[offset[i], offset[i+1]) of the bucket.
struct BucketShape {
  std::vector<std::string> names;  // "t<index>" for unnamed tensors
  std::vector<giftDType_t> dtypes;
  std::vector<std::vector<uint64_t>> shapes;
  std::vector<uint64_t> offset;
};
giftResult_t read_bucket(const giftBucketTensor* tensors, size_t n, BucketShape* out);

// Every non-empty tensor of the bucket has a buffer.
giftResult_t check_tensor_pointers(const BucketShape& b, const void* const* tensors);

// What a plan's layout and dumps depend on: communicators cache plans under this key.
std::string bucket_key(const BucketShape& b);

}  // namespace gift::transport
