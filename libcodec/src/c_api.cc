// The C API: argument checks with precise messages, then the numerics.
#include <cinttypes>
#include <new>

#include "common/error.h"
#include "gift/gift.h"
#include "numerics/codec.h"
#include "numerics/groups.h"

using gift::fail;

giftResult_t gift::check_codec_buffers(const giftQuantParams* p, const void* data,
                                       giftDType_t dtype, uint64_t rows, uint64_t cols,
                                       const void* codes, const void* scales,
                                       uint64_t scales_bytes) {
  uint64_t need = 0;
  if (const giftResult_t r = giftScaleBytes(p, rows, cols, &need)) return r;
  if (dtype != GIFT_DTYPE_F32 && dtype != GIFT_DTYPE_BF16 && dtype != GIFT_DTYPE_F16) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", int(dtype));
  }
  if (rows * cols > 0 && (!data || !codes)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "data or codes pointer is NULL");
  }
  if (need > 0 && !scales) return fail(GIFT_ERROR_INVALID_ARGUMENT, "scales pointer is NULL");
  if (scales_bytes < need) {
    return fail(GIFT_ERROR_BUFFER_TOO_SMALL,
                "scales buffer holds %" PRIu64 " bytes, %" PRIu64 " needed", scales_bytes, need);
  }
  return GIFT_OK;
}

extern "C" {

void giftQuantParamsInit(giftQuantParams* p) {
  if (!p) return;
  *p = giftQuantParams{};
  p->kind = GIFT_FP8_E4M3;
  p->layout = GIFT_SCALE_BLOCK;
  p->block = GIFT_BLOCK_DEFAULT;
  p->tile_rows = 128;
  p->tile_cols = 128;
  p->scale_dtype = GIFT_SCALE_DTYPE_F32;
  p->rounding = GIFT_ROUND_NEAREST;
  p->nonfinite = GIFT_NONFINITE_ERROR;
  p->threads = 0;
}

giftResult_t giftQuantParamsValidate(const giftQuantParams* p) {
  gift::clear_error();
  if (!p) return fail(GIFT_ERROR_INVALID_ARGUMENT, "params is NULL");
  if (p->kind != GIFT_FP8_E4M3 && p->kind != GIFT_FP8_E5M2) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown FP8 kind %d", int(p->kind));
  }
  switch (p->layout) {
    case GIFT_SCALE_TENSOR:
    case GIFT_SCALE_ROW:
      break;
    case GIFT_SCALE_BLOCK:
      if (p->block < GIFT_BLOCK_MIN || p->block > GIFT_BLOCK_MAX || (p->block & (p->block - 1))) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT,
                    "block size %" PRIu32 " is not a power of two in [%d, %d]", p->block,
                    GIFT_BLOCK_MIN, GIFT_BLOCK_MAX);
      }
      break;
    case GIFT_SCALE_TILE:
      if (p->tile_rows < 1 || p->tile_cols < 1) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT, "tile %" PRIu32 "x%" PRIu32 " has a zero side",
                    p->tile_rows, p->tile_cols);
      }
      break;
    default:
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown scale layout %d", int(p->layout));
  }
  if (p->scale_dtype != GIFT_SCALE_DTYPE_F32 && p->scale_dtype != GIFT_SCALE_DTYPE_E8M0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown scale dtype %d", int(p->scale_dtype));
  }
  if (p->rounding != GIFT_ROUND_NEAREST && p->rounding != GIFT_ROUND_STOCHASTIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown rounding mode %d", int(p->rounding));
  }
  if (p->nonfinite != GIFT_NONFINITE_ERROR && p->nonfinite != GIFT_NONFINITE_KEEP) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown non-finite policy %d", int(p->nonfinite));
  }
  if (p->threads < 0)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", p->threads);
  return GIFT_OK;
}

giftResult_t giftScaleCount(const giftQuantParams* p, uint64_t rows, uint64_t cols,
                            uint64_t* count) {
  if (const giftResult_t r = giftQuantParamsValidate(p)) return r;
  if (!count) return fail(GIFT_ERROR_INVALID_ARGUMENT, "count is NULL");
  if (cols && rows > UINT64_MAX / cols) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape %" PRIu64 "x%" PRIu64 " overflows 64 bits",
                rows, cols);
  }
  *count = gift::group_grid(*p, rows, cols).count();
  return GIFT_OK;
}

giftResult_t giftScaleBytes(const giftQuantParams* p, uint64_t rows, uint64_t cols,
                            uint64_t* bytes) {
  uint64_t count = 0;
  if (const giftResult_t r = giftScaleCount(p, rows, cols, &count)) return r;
  if (!bytes) return fail(GIFT_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  if (count > UINT64_MAX / 4) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%" PRIu64 " scales overflow a 64-bit byte count",
                count);
  }
  *bytes = count * (p->scale_dtype == GIFT_SCALE_DTYPE_F32 ? 4 : 1);
  return GIFT_OK;
}

giftResult_t giftEncode(const giftQuantParams* p, const void* src, giftDType_t src_dtype,
                        uint64_t rows, uint64_t cols, uint8_t* codes, void* scales,
                        uint64_t scales_bytes, giftEncodeStats* stats) {
  if (const giftResult_t r =
          gift::check_codec_buffers(p, src, src_dtype, rows, cols, codes, scales, scales_bytes)) {
    return r;
  }
  try {
    return gift::encode_tensor(*p, src, src_dtype, rows, cols, codes, scales, stats);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while encoding");
  }
}

giftResult_t giftDecode(const giftQuantParams* p, const uint8_t* codes, const void* scales,
                        uint64_t scales_bytes, uint64_t rows, uint64_t cols, void* dst,
                        giftDType_t dst_dtype) {
  if (const giftResult_t r =
          gift::check_codec_buffers(p, dst, dst_dtype, rows, cols, codes, scales, scales_bytes)) {
    return r;
  }
  gift::decode_tensor(*p, codes, scales, rows, cols, dst, dst_dtype);
  return GIFT_OK;
}

unsigned giftVersionNumber(void) { return GIFT_VERSION_NUMBER; }

}  // extern "C"
