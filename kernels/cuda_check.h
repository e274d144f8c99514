// Every CUDA and cuBLAS call of the kernels is checked, and every launch is followed by a
// check of the launch error: a failure becomes GIFT_ERROR_DEVICE naming the call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/error.h"

namespace gift::kernels {

inline giftResult_t cuda_failed(cudaError_t e, const char* what) {
  return fail(GIFT_ERROR_DEVICE, "CUDA: %s: %s (%s)", what, cudaGetErrorString(e),
              cudaGetErrorName(e));
}

inline giftResult_t cublas_failed(cublasStatus_t s, const char* what) {
  return fail(GIFT_ERROR_DEVICE, "cuBLAS: %s: %s", what, cublasGetStatusString(s));
}

}  // namespace gift::kernels

// Returns from the enclosing function with GIFT_ERROR_DEVICE when `call` fails.
#define GIFT_CUDA_TRY(call)                                                                      \
  do {                                                                                           \
    const cudaError_t gift_cuda_err_ = (call);                                                   \
    if (gift_cuda_err_ != cudaSuccess) return gift::kernels::cuda_failed(gift_cuda_err_, #call); \
  } while (0)

#define GIFT_CUBLAS_TRY(call)                                      \
  do {                                                             \
    const cublasStatus_t gift_cublas_st_ = (call);                 \
    if (gift_cublas_st_ != CUBLAS_STATUS_SUCCESS)                  \
      return gift::kernels::cublas_failed(gift_cublas_st_, #call); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, no kernel image).
#define GIFT_CUDA_LAUNCHED(kernel_name)                                             \
  do {                                                                              \
    const cudaError_t gift_cuda_err_ = cudaGetLastError();                          \
    if (gift_cuda_err_ != cudaSuccess)                                              \
      return gift::kernels::cuda_failed(gift_cuda_err_, "launch of " #kernel_name); \
  } while (0)
