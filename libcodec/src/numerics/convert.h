// Element type conversions between fp32, bf16 and fp16 (FORMAT.md 1.10): widening is exact,
// narrowing rounds to nearest even. The one loop every widening and narrowing goes through.
#pragma once

#include <cstdint>

#include "gift/gift.h"

namespace gift {

// n elements of src_dtype at src to dst_dtype at dst (no overlap, unless the same buffer
// and type).
void convert_elements(const void* src, giftDType_t src_dtype, void* dst, giftDType_t dst_dtype,
                      uint64_t n);

}  // namespace gift
