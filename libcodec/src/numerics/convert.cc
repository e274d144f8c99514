#include "numerics/convert.h"

#include <cstring>

#include "numerics/elementwise.h"
#include "numerics/fp_env.h"
#include "numerics/shapes.h"

namespace gift {
namespace {

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
  return d == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
}

void store(uint8_t* p, giftDType_t d, float f) {
  if (d == GIFT_DTYPE_F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == GIFT_DTYPE_BF16 ? num::bf16_from_float(f) : num::f16_from_float(f);
  std::memcpy(p, &h, 2);
}

}  // namespace

void convert_elements(const void* src, giftDType_t src_dtype, void* dst, giftDType_t dst_dtype,
                      uint64_t n) {
  if (src_dtype == dst_dtype) {
    if (src != dst && n) std::memmove(dst, src, n * dtype_size(dst_dtype));
    return;
  }
  const uint8_t* in = static_cast<const uint8_t*>(src);
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (src_dtype == GIFT_DTYPE_BF16 && dst_dtype == GIFT_DTYPE_F32) {
    // bf16_to_float is a shift: this loop is vector code, and the hot one (bf16 gradients).
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      const uint32_t u = uint32_t(h) << 16;
      std::memcpy(out + 4 * i, &u, 4);
    }
    return;
  }
  const num::FpEnvGuard fp_env;  // fp16 subnormals are rounded in float arithmetic
  const size_t si = dtype_size(src_dtype), so = dtype_size(dst_dtype);
  // Through fp32: widening is exact, so bf16 <-> fp16 rounds once.
  for (uint64_t i = 0; i < n; ++i) store(out + i * so, dst_dtype, load(in + i * si, src_dtype));
}

}  // namespace gift
