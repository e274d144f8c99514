#include "transport/config.h"

#include <cinttypes>

#include "common/error.h"
#include "common/sized.h"
#include "numerics/shapes.h"

namespace gift::transport {

giftResult_t read_config(const giftAllReduceConfig* config, giftAllReduceConfig* out) {
  const giftAllReduceConfig defaults = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  *out = defaults;
  if (!config) return GIFT_OK;
  if (const giftResult_t r = read_sized(config, defaults, out, "giftAllReduceConfig")) return r;
  const int coords = enum_int(out->coords), op = enum_int(out->op);
  if (coords != GIFT_COORDS_MODE_EUCLIDEAN && coords != GIFT_COORDS_MODE_GIFT &&
      coords != GIFT_COORDS_MODE_AUTO) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown coordinates mode %d", coords);
  }
  if (out->threads < 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", out->threads);
  }
  if (op != GIFT_REDUCE_SUM && op != GIFT_REDUCE_AVG) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown reduce op %d", op);
  }
  const int nonfinite = enum_int(out->nonfinite);
  if (nonfinite != GIFT_NONFINITE_ERROR && nonfinite != GIFT_NONFINITE_KEEP) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown non-finite policy %d", nonfinite);
  }
  return GIFT_OK;
}

giftResult_t read_device_config(const giftAllReduceConfig* config, giftAllReduceConfig* out) {
  if (const giftResult_t rc = read_config(config, out)) return rc;
  if (!config) out->integrity = 0;
  if (out->integrity) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "integrity checksums are not computed on the device: set integrity to 0");
  }
  if (out->dump_every) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "dumps are not written from the device: set dump_every to 0");
  }
  return GIFT_OK;
}

giftQuantParams quant_params(const giftAllReduceConfig& c) {
  giftQuantParams q;
  giftQuantParamsInit(&q);
  q.kind = c.kind;
  q.layout = GIFT_SCALE_BLOCK;
  q.block = c.block;
  q.scale_dtype = c.scale_dtype;
  q.rounding = c.rounding;
  q.nonfinite = c.nonfinite;
  return q;
}

giftResult_t read_bucket(const giftBucketTensor* tensors, size_t n, BucketShape* out) {
  BucketShape& b = *out;
  if (n > 0 && !tensors) return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensors is NULL");
  b.offset.assign(1, 0);
  for (size_t i = 0; i < n; ++i) {
    const giftBucketTensor& t = tensors[i];
    if (!known_dtype(t.dtype)) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu: unknown dtype %d", i,
                  enum_int(t.dtype));
    }
    if (t.ndim > 0 && !t.shape) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu: shape is NULL", i);
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) {
      if (t.shape[d] != 0 && elements > UINT64_MAX / 2 / t.shape[d]) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu: shape overflows", i);
      }
      elements *= t.shape[d];
    }
    if (elements > UINT64_MAX / 2 - b.offset.back()) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "tensor %zu: the bucket's element count overflows (%" PRIu64 " + %" PRIu64 ")", i,
                  b.offset.back(), elements);
    }
    b.names.push_back(t.name ? t.name : "t" + std::to_string(i));
    b.dtypes.push_back(t.dtype);
    b.shapes.emplace_back(t.shape, t.shape + t.ndim);
    b.offset.push_back(b.offset.back() + elements);
  }
  return GIFT_OK;
}

giftResult_t check_tensor_pointers(const BucketShape& b, const void* const* tensors) {
  for (size_t i = 0; i + 1 < b.offset.size(); ++i) {
    if (b.offset[i + 1] > b.offset[i] && (!tensors || !tensors[i])) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu ('%s') has no buffer", i,
                  b.names[i].c_str());
    }
  }
  return GIFT_OK;
}

std::string bucket_key(const BucketShape& b) {
  // Every field is counted or ends at a separator it cannot hold, so that no two buckets read
  // alike: {[2, 3], "x"} and {[2], "3,x"} once shared a key, and with it a plan sized for the
  // other bucket.
  std::string key;
  for (size_t i = 0; i < b.dtypes.size(); ++i) {
    key += std::to_string(int(b.dtypes[i])) + ":" + std::to_string(b.shapes[i].size()) + ":";
    for (uint64_t d : b.shapes[i]) key += std::to_string(d) + ",";
    key += std::to_string(b.names[i].size()) + ":" + b.names[i];
  }
  return key;
}

}  // namespace gift::transport
