// The C API of the codec: argument checks with precise messages, then the numerics.
#include "numerics/codec.h"

#include <omp.h>

#include <algorithm>
#include <cinttypes>
#include <new>

#include "common/ctx.h"
#include "common/error.h"
#include "common/processors.h"
#include "common/sized.h"
#include "gift/gift.h"
#include "numerics/groups.h"
#include "numerics/shapes.h"
#include "numerics/simd.h"

using gift::fail;

namespace {

const giftQuantParams kDefaultParams = GIFT_QUANT_PARAMS_INIT;

giftResult_t validate_fields(const giftQuantParams* p);

}  // namespace

giftResult_t gift::load_params(const giftQuantParams* in, giftQuantParams* out) {
  if (const giftResult_t r = read_sized(in, kDefaultParams, out, "giftQuantParams")) return r;
  return validate_fields(out);
}

giftResult_t gift::check_codec_buffers(const giftQuantParams& p, const void* data,
                                       giftDType_t dtype, uint64_t rows, uint64_t cols,
                                       const void* codes, const void* scales,
                                       uint64_t scales_bytes) {
  uint64_t need = 0;
  if (const giftResult_t r = giftScaleBytes(&p, rows, cols, &need)) return r;
  if (!gift::known_dtype(dtype)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", gift::enum_int(dtype));
  }
  if (rows * cols > 0 && (!data || !codes)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "data or codes pointer is NULL");
  }
  if (need > 0 && !scales) return fail(GIFT_ERROR_INVALID_ARGUMENT, "scales pointer is NULL");
  // Elements and fp32 scales are read and written as what they are: their addresses must
  // suit their size (a caller holding data at an odd address copies it first).
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "data pointer is not aligned to its %zu-byte elements",
                dtype_size(dtype));
  }
  if (p.scale_dtype == GIFT_SCALE_DTYPE_F32 && reinterpret_cast<uintptr_t>(scales) % 4 != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "fp32 scales pointer is not 4-byte aligned");
  }
  if (scales_bytes < need) {
    return fail(GIFT_ERROR_BUFFER_TOO_SMALL,
                "scales buffer holds %" PRIu64 " bytes, %" PRIu64 " needed", scales_bytes, need);
  }
  return GIFT_OK;
}

int gift::thread_count(const giftCtx* ctx) {
  // A region inside an active one gets a team of one where the runtime allows no more levels,
  // and no team exceeds the runtime's thread limit: counted here, so that buffers are sized
  // and processors deemed spare for the threads that run. More threads than processors never
  // helps a streaming pass, and an unbounded request could make the runtime fail to start them.
  if (omp_get_active_level() >= omp_get_max_active_levels()) return 1;
  const int want = ctx && ctx->threads > 0 ? ctx->threads : omp_get_max_threads();
  return std::min({want, processors(), omp_get_thread_limit()});
}

bool gift::spare_processor(const giftCtx* ctx) { return thread_count(ctx) < processors(); }

int giftCtxThreads(const giftCtx* ctx) { return gift::thread_count(ctx); }

int giftProcessors(void) { return gift::processors(); }

namespace {

// Enums are compared as integers: a C caller can pass any value.
giftResult_t validate_fields(const giftQuantParams* p) {
  using gift::enum_int;
  const int kind = enum_int(p->kind), layout = enum_int(p->layout);
  const int scale_dtype = enum_int(p->scale_dtype), rounding = enum_int(p->rounding);
  const int nonfinite = enum_int(p->nonfinite);
  if (kind != GIFT_FP8_E4M3 && kind != GIFT_FP8_E5M2) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown FP8 kind %d", kind);
  }
  switch (layout) {
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
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown scale layout %d", layout);
  }
  if (scale_dtype != GIFT_SCALE_DTYPE_F32 && scale_dtype != GIFT_SCALE_DTYPE_E8M0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown scale dtype %d", scale_dtype);
  }
  if (rounding != GIFT_ROUND_NEAREST && rounding != GIFT_ROUND_STOCHASTIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown rounding mode %d", rounding);
  }
  if (nonfinite != GIFT_NONFINITE_ERROR && nonfinite != GIFT_NONFINITE_KEEP) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown non-finite policy %d", nonfinite);
  }
  return GIFT_OK;
}

}  // namespace

extern "C" {

void giftQuantParamsInit(giftQuantParams* p) {
  if (p) *p = kDefaultParams;
}

giftResult_t giftQuantParamsValidate(const giftQuantParams* p) {
  gift::clear_error();
  giftQuantParams q;
  return gift::load_params(p, &q);
}

giftResult_t giftCtxCreate(giftCtx** ctx) {
  gift::clear_error();
  if (!ctx) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftCtxCreate: null pointer");
  *ctx = new (std::nothrow) giftCtx();
  return *ctx ? GIFT_OK : fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
}

void giftCtxFree(giftCtx* ctx) { delete ctx; }

giftResult_t giftCtxSetThreads(giftCtx* ctx, int threads) {
  gift::clear_error();
  if (!ctx) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftCtxSetThreads: null context");
  if (threads < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", threads);
  ctx->threads = threads;
  return GIFT_OK;
}

giftResult_t giftScaleCount(const giftQuantParams* params, uint64_t rows, uint64_t cols,
                            uint64_t* count) {
  gift::clear_error();
  giftQuantParams q;
  if (const giftResult_t r = gift::load_params(params, &q)) return r;
  const giftQuantParams* p = &q;
  if (!count) return fail(GIFT_ERROR_INVALID_ARGUMENT, "count is NULL");
  if (cols && rows > UINT64_MAX / cols) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape %" PRIu64 "x%" PRIu64 " overflows 64 bits",
                rows, cols);
  }
  *count = gift::group_grid(*p, rows, cols).count();
  return GIFT_OK;
}

giftResult_t giftScaleBytes(const giftQuantParams* params, uint64_t rows, uint64_t cols,
                            uint64_t* bytes) {
  uint64_t count = 0;
  if (const giftResult_t r = giftScaleCount(params, rows, cols, &count)) return r;
  giftQuantParams q;
  gift::load_params(params, &q);  // valid: giftScaleCount checked it
  const giftQuantParams* p = &q;
  if (!bytes) return fail(GIFT_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  if (count > UINT64_MAX / 4) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%" PRIu64 " scales overflow a 64-bit byte count",
                count);
  }
  *bytes = count * gift::scale_size(p->scale_dtype);
  return GIFT_OK;
}

giftResult_t giftEncode(const giftCtx* ctx, const giftQuantParams* params, const void* src,
                        giftDType_t src_dtype, uint64_t rows, uint64_t cols, uint8_t* codes,
                        void* scales, uint64_t scales_bytes, giftEncodeStats* stats) {
  gift::clear_error();
  giftQuantParams p;
  if (const giftResult_t r = gift::load_params(params, &p)) return r;
  if (const giftResult_t r =
          gift::check_codec_buffers(p, src, src_dtype, rows, cols, codes, scales, scales_bytes)) {
    return r;
  }
  try {
    return gift::encode_tensor(ctx, p, src, src_dtype, rows, cols, codes, scales, stats);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while encoding");
  }
}

giftResult_t giftDecode(const giftCtx* ctx, const giftQuantParams* params, const uint8_t* codes,
                        const void* scales, uint64_t scales_bytes, uint64_t rows, uint64_t cols,
                        void* dst, giftDType_t dst_dtype) {
  gift::clear_error();
  giftQuantParams p;
  if (const giftResult_t r = gift::load_params(params, &p)) return r;
  if (const giftResult_t r =
          gift::check_codec_buffers(p, dst, dst_dtype, rows, cols, codes, scales, scales_bytes)) {
    return r;
  }
  gift::decode_tensor(ctx, p, codes, scales, rows, cols, dst, dst_dtype);
  return GIFT_OK;
}

unsigned giftVersionNumber(void) { return GIFT_VERSION_NUMBER; }

const char* giftCpuTargetName(void) { return gift::simd::target_name(); }

giftResult_t giftCpuLimitTarget(const char* name) {
  if (gift::simd::limit_targets(name)) {
    gift::clear_error();
    return GIFT_OK;
  }
  return fail(GIFT_ERROR_INVALID_ARGUMENT, "no CPU instruction set named '%s' in this build: %s",
              name, gift::simd::target_names());
}

const char* giftCpuTargetNames(void) { return gift::simd::target_names(); }

}  // extern "C"
