// The GIFT whitener on the GPU, and the gradients' second moment for fitting. Internal: the
// device plans use the exact transforms (whitener.cu); the cuBLAS forms and the second moment
// (whitener_cublas.cu, fp32 GEMMs, TF32 only when asked for) are in gift_core only, for the
// tests and benchmarks, so that libgift does not load cuBLAS.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "coords/whitener.h"
#include "gift/gift.h"

namespace gift::kernels {

// A whitener's factors in device memory: V with C and with C' folded in (V diag(c) and
// V diag(c_inv), computed once on the host), both diagonals, and C and C' (for the exact
// transforms).
class DeviceWhitener {
 public:
  DeviceWhitener() = default;
  DeviceWhitener(const DeviceWhitener&) = delete;
  DeviceWhitener& operator=(const DeviceWhitener&) = delete;
  ~DeviceWhitener();

  // Replaces what an earlier upload held. The transforms refuse to run (INVALID_ARGUMENT)
  // until an upload has succeeded.
  giftResult_t upload(const coords::Whitener& t);

  // W~ = W T and W = W~ T^-1, in place, for rows x dim row-major fp32 at device pointer w,
  // on the handle's stream. Uses rows x rank floats of scratch, allocated on that stream.
  giftResult_t whiten(float* w, uint64_t rows, cublasHandle_t h) const;
  giftResult_t unwhiten(float* w, uint64_t rows, cublasHandle_t h) const;

  // The same transforms with the CPU's bits (coords::whiten and unwhiten on machines with
  // fused multiply-add): the per-element order of coords/low_rank_element.h, one output per
  // thread, no cuBLAS. For the reduce plan, whose messages must equal the CPU plan's; slower
  // than the cuBLAS form (each projection reads its row once per rank column). Uses
  // rows x rank floats of scratch, allocated on `s`.
  giftResult_t whiten_exact(float* w, uint64_t rows, cudaStream_t s) const;
  giftResult_t unwhiten_exact(float* w, uint64_t rows, cudaStream_t s) const;

  uint32_t dim() const { return dim_; }
  uint32_t rank() const { return rank_; }

 private:
  giftResult_t check_size(uint64_t rows) const;
  giftResult_t low_rank_update(float* w, uint64_t rows, const float* v_scaled,
                               cublasHandle_t h) const;
  giftResult_t scale_columns(float* w, uint64_t rows, const float* d, cudaStream_t s) const;
  giftResult_t exact_update(float* w, uint64_t rows, const float* c, const float* pre,
                            const float* post, cudaStream_t s) const;

  bool ready_ = false;
  uint32_t dim_ = 0, rank_ = 0;
  float *v_ = nullptr, *v_c_ = nullptr, *v_c_inv_ = nullptr, *d_rsqrt_ = nullptr,
        *d_sqrt_ = nullptr, *c_ = nullptr, *c_inv_ = nullptr;
};

// A <- decay A + (1 - decay) W^T W / rows for rows x dim fp32 W (device pointers; A is
// dim x dim). decay 0 starts a fresh moment.
giftResult_t accumulate_second_moment(const float* w, uint64_t rows, uint32_t dim, float decay,
                                      float* a, cublasHandle_t h);

// A cuBLAS handle's math mode: fp32 throughout, or TF32 tensor cores when `tf32`.
giftResult_t set_math_mode(cublasHandle_t h, bool tf32);

}  // namespace gift::kernels
