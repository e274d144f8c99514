// The whitener's cuBLAS forms (fp32 GEMMs, TF32 only when asked for) and the gradients'
// second moment, row-major data seen as cuBLAS's column-major: a rows x dim row-major W is the
// dim x rows column-major W^T. A file of its own so that only what calls these links cuBLAS:
// libgift and its device plans use the exact forms (whitener.cu), and loading cuBLAS costs
// every process that loads them about 80 ms and 200 MiB of mapped pages.
#include <algorithm>
#include <climits>

#include "kernels/cuda_check.h"
#include "kernels/whitener.h"

namespace gift::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void scale_columns_kernel(float* w, uint64_t rows, uint32_t dim, const float* d) {
  for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (uint32_t j = threadIdx.x; j < dim; j += blockDim.x) w[r * dim + j] *= d[j];
  }
}

}  // namespace

giftResult_t DeviceWhitener::scale_columns(float* w, uint64_t rows, const float* d,
                                           cudaStream_t s) const {
  if (!rows || !dim_) return GIFT_OK;
  const unsigned blocks = unsigned(std::min<uint64_t>(rows, 65535));
  scale_columns_kernel<<<blocks, kThreads, 0, s>>>(w, rows, dim_, d);
  GIFT_CUDA_LAUNCHED(scale_columns_kernel);
  return GIFT_OK;
}

// W <- W + (W V) (V diag(c))^T: P^T = V^T W^T, then W^T += (V diag(c)) P^T.
giftResult_t DeviceWhitener::low_rank_update(float* w, uint64_t rows, const float* v_scaled,
                                             cublasHandle_t h) const {
  if (!rank_ || !rows) return GIFT_OK;
  cudaStream_t s = nullptr;
  GIFT_CUBLAS_TRY(cublasGetStream(h, &s));
  float* p = nullptr;
  GIFT_CUDA_TRY(cudaMallocAsync(&p, rows * rank_ * sizeof(float), s));
  const float one = 1.0f, zero = 0.0f;
  const int m = int(rank_), n = int(rows), k = int(dim_);
  cublasStatus_t st =
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, v_, m, w, k, &zero, p, m);
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, k, n, m, &one, v_scaled, m, p, m, &one, w, k);
  }
  const cudaError_t freed = cudaFreeAsync(p, s);
  if (st != CUBLAS_STATUS_SUCCESS) return cublas_failed(st, "cublasSgemm (whitener)");
  if (freed != cudaSuccess) return cuda_failed(freed, "cudaFreeAsync (whitener scratch)");
  return GIFT_OK;
}

giftResult_t DeviceWhitener::whiten(float* w, uint64_t rows, cublasHandle_t h) const {
  if (const giftResult_t r = check_size(rows)) return r;
  cudaStream_t s = nullptr;
  GIFT_CUBLAS_TRY(cublasGetStream(h, &s));
  if (const giftResult_t r = scale_columns(w, rows, d_rsqrt_, s)) return r;
  return low_rank_update(w, rows, v_c_, h);
}

giftResult_t DeviceWhitener::unwhiten(float* w, uint64_t rows, cublasHandle_t h) const {
  if (const giftResult_t r = check_size(rows)) return r;
  cudaStream_t s = nullptr;
  GIFT_CUBLAS_TRY(cublasGetStream(h, &s));
  if (const giftResult_t r = low_rank_update(w, rows, v_c_inv_, h)) return r;
  return scale_columns(w, rows, d_sqrt_, s);
}

giftResult_t accumulate_second_moment(const float* w, uint64_t rows, uint32_t dim, float decay,
                                      float* a, cublasHandle_t h) {
  if (!rows || !dim) return GIFT_OK;
  if (rows > uint64_t(INT_MAX) || dim > uint32_t(INT_MAX)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "second moment: sizes exceed cuBLAS's int sizes");
  }
  // W^T W is symmetric, so the column-major product W^T (W^T)^T is also the row-major one.
  const float alpha = (1.0f - decay) / float(rows), beta = decay;
  GIFT_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, int(dim), int(dim), int(rows), &alpha, w,
                              int(dim), w, int(dim), &beta, a, int(dim)));
  return GIFT_OK;
}

giftResult_t set_math_mode(cublasHandle_t h, bool tf32) {
  GIFT_CUBLAS_TRY(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return GIFT_OK;
}

}  // namespace gift::kernels
