// The whitener on the device: its factors' upload, and the exact transforms with the CPU's
// bits, which the device plans use. The cuBLAS forms are in whitener_cublas.cu.
#include <climits>
#include <vector>

#include "coords/low_rank_element.h"
#include "kernels/cuda_check.h"
#include "kernels/whitener.h"

namespace gift::kernels {
namespace {

constexpr int kThreads = 256;

// p[r * rank + j] for every row r and column j of V (coords/low_rank_element.h).
__global__ void exact_projection_kernel(const float* w, uint64_t rows, uint32_t dim, uint32_t rank,
                                        const float* v, const float* c, const float* pre,
                                        float* p) {
  const uint64_t n = rows * rank;
  for (uint64_t k = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = k / rank;
    const uint32_t j = uint32_t(k % rank);
    p[k] = coords::low_rank_projection(w + r * dim, v, c, pre, dim, rank, j);
  }
}

// Every element of w from itself and its row's projections, in place.
__global__ void exact_output_kernel(float* w, uint64_t rows, uint32_t dim, uint32_t rank,
                                    const float* v, const float* p, const float* pre,
                                    const float* post) {
  const uint64_t n = rows * dim;
  for (uint64_t k = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = k / dim;
    const uint32_t i = uint32_t(k % dim);
    w[k] = coords::low_rank_output(w[k], p + r * rank, v, pre, post, rank, i);
  }
}

unsigned grid_for(uint64_t n) {
  return unsigned(std::max<uint64_t>(1, std::min<uint64_t>((n + kThreads - 1) / kThreads, 65535)));
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
  for (float* p : {v_, v_c_, v_c_inv_, d_rsqrt_, d_sqrt_, c_, c_inv_}) cudaFree(p);
}

giftResult_t DeviceWhitener::upload(const coords::Whitener& t) {
  for (float** p : {&v_, &v_c_, &v_c_inv_, &d_rsqrt_, &d_sqrt_, &c_, &c_inv_}) {
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
  if (const giftResult_t r = upload_floats(t.c, &c_)) return r;
  if (const giftResult_t r = upload_floats(t.c_inv, &c_inv_)) return r;
  dim_ = t.dim;
  rank_ = t.rank;
  ready_ = true;
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

giftResult_t DeviceWhitener::exact_update(float* w, uint64_t rows, const float* c, const float* pre,
                                          const float* post, cudaStream_t s) const {
  if (!rows || !dim_) return GIFT_OK;
  float* p = nullptr;
  // One float even for rank 0, so that the kernels always get a valid pointer.
  GIFT_CUDA_TRY(cudaMallocAsync(&p, std::max<uint64_t>(1, rows * rank_) * sizeof(float), s));
  if (rank_) {
    exact_projection_kernel<<<grid_for(rows * rank_), kThreads, 0, s>>>(w, rows, dim_, rank_, v_, c,
                                                                        pre, p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      cudaFreeAsync(p, s);
      return cuda_failed(e, "exact_projection_kernel launch");
    }
  }
  exact_output_kernel<<<grid_for(rows * dim_), kThreads, 0, s>>>(w, rows, dim_, rank_, v_, p, pre,
                                                                 post);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t freed = cudaFreeAsync(p, s);
  if (launched != cudaSuccess) return cuda_failed(launched, "exact_output_kernel launch");
  if (freed != cudaSuccess) return cuda_failed(freed, "cudaFreeAsync (whitener scratch)");
  return GIFT_OK;
}

giftResult_t DeviceWhitener::whiten_exact(float* w, uint64_t rows, cudaStream_t s) const {
  if (const giftResult_t r = check_size(rows)) return r;
  return exact_update(w, rows, c_, d_rsqrt_, nullptr, s);
}

giftResult_t DeviceWhitener::unwhiten_exact(float* w, uint64_t rows, cudaStream_t s) const {
  if (const giftResult_t r = check_size(rows)) return r;
  return exact_update(w, rows, c_inv_, nullptr, d_sqrt_, s);
}

}  // namespace gift::kernels
