// GIFT_HD marks functions that CPU code and CUDA kernels share (compiled for both sides by
// nvcc, plain inline functions for the host compiler).
#pragma once

#if defined(__CUDACC__)
#define GIFT_HD __host__ __device__ __forceinline__
#else
#define GIFT_HD inline
#endif
