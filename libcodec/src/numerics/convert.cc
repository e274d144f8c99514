#include "numerics/convert.h"

#include <cstring>

#include "numerics/elementwise.h"

namespace gift {
namespace {

float load(const void* src, giftDType_t dtype, uint64_t i) {
  if (dtype == GIFT_DTYPE_F32) return static_cast<const float*>(src)[i];
  const uint16_t h = static_cast<const uint16_t*>(src)[i];
  return dtype == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
}

}  // namespace

void convert_elements(const void* src, giftDType_t src_dtype, void* dst, giftDType_t dst_dtype,
                      uint64_t n) {
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memcpy(dst, src, n * (dst_dtype == GIFT_DTYPE_F32 ? 4 : 2));
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float x = load(src, src_dtype, i);
    if (dst_dtype == GIFT_DTYPE_F32) {
      static_cast<float*>(dst)[i] = x;
    } else {
      static_cast<uint16_t*>(dst)[i] =
          dst_dtype == GIFT_DTYPE_BF16 ? num::bf16_from_float(x) : num::f16_from_float(x);
    }
  }
}

}  // namespace gift
