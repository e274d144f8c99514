// giftConvert: argument checks around numerics/convert.h.
#include "numerics/convert.h"

#include <cinttypes>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "gift/gift.h"
#include "numerics/shapes.h"

using gift::fail;

extern "C" size_t giftDTypeSize(giftDType_t dtype) {
  return gift::known_dtype(dtype) ? gift::dtype_size(dtype) : 0;
}

extern "C" giftResult_t giftConvert(const void* src, giftDType_t src_dtype, void* dst,
                                    giftDType_t dst_dtype, uint64_t n) {
  gift::clear_error();
  if (!gift::known_dtype(src_dtype))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", gift::enum_int(src_dtype));
  if (!gift::known_dtype(dst_dtype))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", gift::enum_int(dst_dtype));
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
  gift::convert_elements(src, src_dtype, dst, dst_dtype, n);
  return GIFT_OK;
}
