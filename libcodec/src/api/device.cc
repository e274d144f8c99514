// Frames coded on a CUDA device (gift_cuda.h): the writer's and reader's codec behind
// giftEncode's and giftDecode's contract on host buffers (each tensor is uploaded, coded by
// the kernels and downloaded), so every frame feature works unchanged on a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "api/handles.h"
#include "common/error.h"
#include "gift/gift_cuda.h"
#include "kernels/cuda_check.h"
#include "numerics/codec.h"
#include "numerics/shapes.h"

using gift::fail;

namespace {

using gift::kernels::cuda_failed;

// One device allocation, freed on every path.
struct DeviceMemory {
  void* p = nullptr;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { cudaFree(p); }
  giftResult_t alloc(uint64_t bytes) {
    const cudaError_t e = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
    return e == cudaSuccess ? GIFT_OK : cuda_failed(e, "cudaMalloc");
  }
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(p);
  }
};

giftResult_t copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return GIFT_OK;
  const cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  return e == cudaSuccess ? GIFT_OK : cuda_failed(e, "cudaMemcpy");
}

giftResult_t cuda_encode(const giftCtx*, const giftQuantParams* params, const void* src,
                         giftDType_t dtype, uint64_t rows, uint64_t cols, uint8_t* codes,
                         void* scales, uint64_t scales_bytes, giftEncodeStats* stats) {
  giftQuantParams q;
  if (const giftResult_t r = gift::load_params(params, &q)) return r;
  const giftQuantParams* p = &q;
  if (const giftResult_t r =
          gift::check_codec_buffers(q, src, dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  const uint64_t n = rows * cols;
  DeviceMemory d_src, d_codes, d_scales, d_stats;
  for (auto [m, bytes] : {std::pair{&d_src, n * gift::dtype_size(dtype)}, std::pair{&d_codes, n},
                          std::pair{&d_scales, scales_bytes},
                          std::pair{&d_stats, uint64_t(sizeof(giftEncodeStats))}}) {
    if (const giftResult_t r = m->alloc(bytes)) return r;
  }
  if (const giftResult_t r =
          copy(d_src.p, src, n * gift::dtype_size(dtype), cudaMemcpyHostToDevice))
    return r;
  if (const giftResult_t r =
          giftEncodeDevice(p, d_src.p, dtype, rows, cols, d_codes.get(), d_scales.p, scales_bytes,
                           d_stats.get<giftEncodeStats>(), nullptr, 0, nullptr))
    return r;
  giftEncodeStats seen;
  for (const auto& [to, from, bytes] :
       {std::tuple<void*, const void*, uint64_t>{codes, d_codes.p, n},
        std::tuple<void*, const void*, uint64_t>{scales, d_scales.p, scales_bytes},
        std::tuple<void*, const void*, uint64_t>{&seen, d_stats.p, sizeof seen}}) {
    if (const giftResult_t r = copy(to, from, bytes, cudaMemcpyDeviceToHost)) return r;
  }
  if (stats) *stats = seen;
  return gift::nonfinite_result(*p, seen, cols);
}

giftResult_t cuda_decode(const giftCtx*, const giftQuantParams* params, const uint8_t* codes,
                         const void* scales, uint64_t scales_bytes, uint64_t rows, uint64_t cols,
                         void* dst, giftDType_t dtype) {
  giftQuantParams q;
  if (const giftResult_t r = gift::load_params(params, &q)) return r;
  const giftQuantParams* p = &q;
  if (const giftResult_t r =
          gift::check_codec_buffers(q, dst, dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  const uint64_t n = rows * cols;
  DeviceMemory d_codes, d_scales, d_dst;
  if (const giftResult_t r = d_codes.alloc(n)) return r;
  if (const giftResult_t r = d_scales.alloc(scales_bytes)) return r;
  if (const giftResult_t r = d_dst.alloc(n * gift::dtype_size(dtype))) return r;
  if (const giftResult_t r = copy(d_codes.p, codes, n, cudaMemcpyHostToDevice)) return r;
  if (const giftResult_t r = copy(d_scales.p, scales, scales_bytes, cudaMemcpyHostToDevice))
    return r;
  if (const giftResult_t r = giftDecodeDevice(p, d_codes.get(), d_scales.p, scales_bytes, rows,
                                              cols, d_dst.p, dtype, nullptr))
    return r;
  return copy(dst, d_dst.p, n * gift::dtype_size(dtype), cudaMemcpyDeviceToHost);
}

}  // namespace

extern "C" {

giftResult_t giftFrameWriterUseCuda(giftFrameWriter* writer, int enable) {
  gift::clear_error();
  if (!writer) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer");
  if (enable && giftCudaDeviceCount() == 0) return fail(GIFT_ERROR_DEVICE, "no usable CUDA device");
  writer->writer.set_encoder(enable ? &cuda_encode : &giftEncode);
  return GIFT_OK;
}

giftResult_t giftFrameUseCuda(giftFrame* frame, int enable) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null frame");
  if (enable && giftCudaDeviceCount() == 0) return fail(GIFT_ERROR_DEVICE, "no usable CUDA device");
  frame->reader->set_decoder(enable ? &cuda_decode : &giftDecode);
  return GIFT_OK;
}

}  // extern "C"
