// giftConvert: the 16-bit float rules of numerics/elementwise.h for callers of the C API.
#include <cinttypes>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "gift/gift.h"
#include "numerics/codec.h"
#include "numerics/elementwise.h"
#include "numerics/fp_env.h"

namespace {

using gift::fail;

// Elements are read and written through memcpy: callers' buffers (an .npz member, a network
// packet) need not be aligned to the element size.
float load(const uint8_t* p, giftDType_t d) {
  if (d == GIFT_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == GIFT_DTYPE_BF16 ? gift::num::bf16_to_float(h) : gift::num::f16_to_float(h);
}

void store(uint8_t* p, giftDType_t d, float f) {
  if (d == GIFT_DTYPE_F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h =
      d == GIFT_DTYPE_BF16 ? gift::num::bf16_from_float(f) : gift::num::f16_from_float(f);
  std::memcpy(p, &h, 2);
}

bool known(giftDType_t d) {
  return d == GIFT_DTYPE_F32 || d == GIFT_DTYPE_BF16 || d == GIFT_DTYPE_F16;
}

}  // namespace

extern "C" giftResult_t giftConvert(const void* src, giftDType_t src_dtype, void* dst,
                                    giftDType_t dst_dtype, uint64_t n) {
  gift::clear_error();
  if (!known(src_dtype))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", int(src_dtype));
  if (!known(dst_dtype))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", int(dst_dtype));
  if (n == 0) return GIFT_OK;
  if (!src || !dst) return fail(GIFT_ERROR_INVALID_ARGUMENT, "src or dst pointer is NULL");
  const uint64_t src_size = gift::dtype_size(src_dtype), dst_size = gift::dtype_size(dst_dtype);
  if (n > UINTPTR_MAX / 4) {  // 4: the widest dtype, so no byte count below wraps
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%" PRIu64 " elements exceed the address space", n);
  }
  const uintptr_t s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst);
  if (s == d && src_dtype == dst_dtype) return GIFT_OK;
  if (s < d + n * dst_size && d < s + n * src_size) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "src and dst overlap");
  }
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * src_size);
    return GIFT_OK;
  }
  const gift::num::FpEnvGuard fp_env;  // fp16 subnormals are rounded in float arithmetic
  const uint8_t* in = static_cast<const uint8_t*>(src);
  uint8_t* out = static_cast<uint8_t*>(dst);
  // Through fp32: widening is exact, so bf16 <-> fp16 rounds once.
  for (uint64_t i = 0; i < n; ++i)
    store(out + i * dst_size, dst_dtype, load(in + i * src_size, src_dtype));
  return GIFT_OK;
}
