// The device API of gift_cuda.h: the CPU codec's argument checks, then those only device
// pointers need (a misaligned access would be a sticky error that breaks the caller's CUDA
// context, so it is refused up front), then the kernels.
#include <cinttypes>

#include "common/error.h"
#include "gift/gift_cuda.h"
#include "kernels/codec.h"
#include "numerics/codec.h"
#include "numerics/shapes.h"

using gift::fail;

namespace {

giftResult_t check_alignment(const giftQuantParams& p, const void* data, giftDType_t dtype,
                             const void* scales) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(data), s = reinterpret_cast<uintptr_t>(scales);
  if (d % gift::dtype_size(dtype) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "device data pointer is not aligned to its element size");
  }
  if (s % gift::scale_size(p.scale_dtype) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "device fp32 scales pointer is not 4-byte aligned");
  }
  return GIFT_OK;
}

giftResult_t check_stats_alignment(const giftEncodeStats* stats) {
  if (reinterpret_cast<uintptr_t>(stats) % alignof(giftEncodeStats) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "device stats pointer is not %zu-byte aligned",
                alignof(giftEncodeStats));
  }
  return GIFT_OK;
}

}  // namespace

extern "C" {

int giftCudaDeviceCount(void) { return gift::kernels::device_count(); }

giftResult_t giftEncodeDeviceWorkspaceSize(const giftQuantParams* params, uint64_t rows,
                                           uint64_t cols, uint64_t* bytes) {
  gift::clear_error();
  giftQuantParams p;
  if (const giftResult_t r = gift::load_params(params, &p)) return r;
  uint64_t count = 0;
  if (const giftResult_t r = giftScaleCount(&p, rows, cols, &count)) return r;
  if (!bytes) return fail(GIFT_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  *bytes = gift::kernels::encode_workspace_bytes(p, rows, cols);
  return GIFT_OK;
}

giftResult_t giftEncodeDevice(const giftQuantParams* params, const void* src, giftDType_t src_dtype,
                              uint64_t rows, uint64_t cols, uint8_t* codes, void* scales,
                              uint64_t scales_bytes, giftEncodeStats* stats, void* workspace,
                              uint64_t workspace_bytes, cudaStream_t stream) {
  gift::clear_error();
  giftQuantParams p;
  if (const giftResult_t r = gift::load_params(params, &p)) return r;
  if (const giftResult_t r =
          gift::check_codec_buffers(p, src, src_dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  if (const giftResult_t r = check_alignment(p, src, src_dtype, scales)) return r;
  if (const giftResult_t r = check_stats_alignment(stats)) return r;
  const uint64_t need = gift::kernels::encode_workspace_bytes(p, rows, cols);
  if (workspace && workspace_bytes < need) {
    return fail(GIFT_ERROR_BUFFER_TOO_SMALL,
                "workspace holds %" PRIu64 " bytes, %" PRIu64 " needed", workspace_bytes, need);
  }
  if (workspace && reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "workspace is not 256-byte aligned");
  }
  return gift::kernels::encode(p, src, src_dtype, rows, cols, codes, scales, stats, workspace,
                               stream);
}

giftResult_t giftDecodeDevice(const giftQuantParams* params, const uint8_t* codes,
                              const void* scales, uint64_t scales_bytes, uint64_t rows,
                              uint64_t cols, void* dst, giftDType_t dst_dtype,
                              cudaStream_t stream) {
  gift::clear_error();
  giftQuantParams p;
  if (const giftResult_t r = gift::load_params(params, &p)) return r;
  if (const giftResult_t r =
          gift::check_codec_buffers(p, dst, dst_dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  if (const giftResult_t r = check_alignment(p, dst, dst_dtype, scales)) return r;
  return gift::kernels::decode(p, codes, scales, rows, cols, dst, dst_dtype, stream);
}

}  // extern "C"
