// The whitener's hot loop (whitener.h): for a rows x dim row-major x, V (dim x rank,
// row-major) and diagonal c,
//     x <- ((x diag(pre)) + (x diag(pre)) V diag(c) V^T) diag(post)
// with pre or post null for no scaling. BLAS would take a column scaling and two thin GEMMs,
// streaming the gradient through memory five times; here each band of rows is scaled, then
// multiplied by V and by V^T while it stays in cache, so x crosses memory once each way.
// Vectorized with Highway (run-time dispatch), rows split over OpenMP threads. The sums run
// in fp32 in a fixed order with fused multiply-adds: the same values on every target with
// FMA (AVX2, AVX-512), others within fp32 rounding of them, as for any GEMM.
#pragma once

#include <cstdint>

namespace gift::coords {

// On `threads` threads (0: the default, thread_count(nullptr)), as the caller's context says.
void low_rank_update(const float* v, const float* c, uint32_t dim, uint32_t rank, const float* pre,
                     const float* post, float* x, uint64_t rows, int threads = 0);

}  // namespace gift::coords
