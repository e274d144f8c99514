// The whitener in its low-rank form (coords/whitener.h) with cuBLAS, row-major data seen as
// cuBLAS's column-major: a rows x dim row-major W is the dim x rows column-major W^T.
#include <climits>
#include <vector>

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

giftResult_t upload_floats(const std::vector<float>& h, float** d) {
  GIFT_CUDA_TRY(cudaMalloc(d, std::max<size_t>(1, h.size()) * sizeof(float)));
  GIFT_CUDA_TRY(cudaMemcpy(*d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  return GIFT_OK;
}

std::vector<float> scaled_columns(const std::vector<float>& v, const std::vector<float>& c,
                                  uint32_t dim, uint32_t rank) {
  std::vector<float> out(v.size());
  for (uint64_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < rank; ++j) out[i * rank + j] = v[i * rank + j] * c[j];
  return out;
}

}  // namespace

DeviceWhitener::~DeviceWhitener() {
  for (float* p : {v_, v_c_, v_c_inv_, d_rsqrt_, d_sqrt_}) cudaFree(p);
}

giftResult_t DeviceWhitener::upload(const coords::Whitener& t) {
  for (float** p : {&v_, &v_c_, &v_c_inv_, &d_rsqrt_, &d_sqrt_}) {
    cudaFree(*p);
    *p = nullptr;
  }
  // Ready and sized last: after a failed upload the transforms refuse to run, rather than
  // use null pointers or pass the data through untransformed.
  ready_ = false;
  dim_ = rank_ = 0;
  if (const giftResult_t r = upload_floats(t.v, &v_)) return r;
  if (const giftResult_t r = upload_floats(scaled_columns(t.v, t.c, t.dim, t.rank), &v_c_))
    return r;
  if (const giftResult_t r = upload_floats(scaled_columns(t.v, t.c_inv, t.dim, t.rank), &v_c_inv_))
    return r;
  if (const giftResult_t r = upload_floats(t.d_rsqrt, &d_rsqrt_)) return r;
  if (const giftResult_t r = upload_floats(t.d_sqrt, &d_sqrt_)) return r;
  dim_ = t.dim;
  rank_ = t.rank;
  ready_ = true;
  return GIFT_OK;
}

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

// Checked before either transform touches the data, so a refusal leaves it as it was.
giftResult_t DeviceWhitener::check_size(uint64_t rows) const {
  if (!ready_) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "whitener: no whitener was uploaded successfully");
  }
  if (rows > uint64_t(INT_MAX) || dim_ > uint32_t(INT_MAX)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "whitener: %llu rows exceed cuBLAS's int sizes",
                (unsigned long long)rows);
  }
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
