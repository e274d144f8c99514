// The whitener's arithmetic (low_rank_update.cc) one output at a time, for CUDA kernels that
// must give the CPU's bits (kernels/whitener.cu, the device reduce plan). low_rank_update.cc
// computes, for each row x (dim values) of a band,
//     x_i <- x_i pre_i                                     (when pre is given)
//     p_j  = fma(x_{dim-1}, V_{dim-1,j}, ... fma(x_1, V_1j, fma(x_0, V_0j, 0)) ...)   then p_j c_j
//     x_i <- fma(p_{rank-1}, V_{i,rank-1}, ... fma(p_0, V_i0, x_i) ...)               then x_i
//     post_i
// whatever its vector width, band or thread split (each lane is one j or one i), on every
// target with fused multiply-add (AVX2, AVX-512, NEON; without FMA, SSE4 and the scalar
// target round the product first and differ within fp32 rounding). These functions are that
// order, written once; tests/unit/whitener_test.cc checks them against whiten()/unwhiten().
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/hd.h"

namespace gift::coords {

// p_j of one row x (dim values, V dim x rank row-major), c_j applied.
GIFT_HD float low_rank_projection(const float* x, const float* v, const float* c, const float* pre,
                                  uint32_t dim, uint32_t rank, uint32_t j) {
  float acc = 0.0f;
  for (uint32_t i = 0; i < dim; ++i) {
    const float xi = pre ? x[i] * pre[i] : x[i];
    acc = fmaf(xi, v[uint64_t(i) * rank + j], acc);
  }
  return acc * c[j];
}

// The new x_i of one row from its old x_i and the row's projections p (rank values).
GIFT_HD float low_rank_output(float x_i, const float* p, const float* v, const float* pre,
                              const float* post, uint32_t rank, uint32_t i) {
  float s = pre ? x_i * pre[i] : x_i;
  for (uint32_t j = 0; j < rank; ++j) s = fmaf(p[j], v[uint64_t(i) * rank + j], s);
  return post ? s * post[i] : s;
}

}  // namespace gift::coords
