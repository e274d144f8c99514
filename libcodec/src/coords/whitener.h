// The whitener of GIFT coordinates (format/FORMAT.md 2.4): for the input-side second moment
// approximated as A^ = U diag(l) U^T + D (rank r, D diagonal and positive), the transform T
// with T^T A^ T = I, in the low-rank form
//     T    = D^-1/2 (I + V C  V^T),      T^-1 = (I + V C' V^T) D^1/2,
// V orthonormal (d x r), C and C' diagonal. Applying either to a d_out x d_in gradient costs
// O(d_out d_in r) in one pass over it (the per-band fused kernel of low_rank_update.h), and
// T^-1 is exact, not a solve.
#pragma once

#include <cstdint>
#include <vector>

#include "gift/gift.h"

namespace gift::coords {

struct Whitener {
  uint32_t dim = 0;            // d_in
  uint32_t rank = 0;           // r
  std::vector<float> v;        // dim x rank, row-major, orthonormal columns
  std::vector<float> c;        // rank: (1 + s)^-1/2 - 1
  std::vector<float> c_inv;    // rank: (1 + s)^1/2 - 1
  std::vector<float> d_rsqrt;  // dim: D^-1/2
  std::vector<float> d_sqrt;   // dim: D^1/2
};

// From the eigen-pairs (u: dim x k row-major, l: k, non-negative) and the diagonal (dim,
// positive). Factorizations run in double precision.
giftResult_t make_whitener(const std::vector<double>& u, const std::vector<double>& l,
                           const std::vector<double>& diag, uint32_t dim, Whitener* out);

// W~ = W T and W = W~ T^-1 for rows x dim row-major data, in place.
// On `threads` threads (0: the default, thread_count(nullptr)).
void whiten(const Whitener& t, float* w, uint64_t rows, int threads = 0);
void unwhiten(const Whitener& t, float* w, uint64_t rows, int threads = 0);

// Whether whitened values W~ (finite, rows x dim) come back through FP8 and T^-1 inside
// fp32's range: near FLT_MAX, whitening then unwhitening can overflow to Inf, and an encoder
// must never write a tensor that decodes to Inf from finite input.
bool inverse_stays_finite(const Whitener& t, const float* whitened, uint64_t rows);

// The paper's reference: the dense Cholesky factor L of A^ (L L^T = A^), applied as
// W~ = W L^-T (a triangular solve) and W = W~ L^T. For comparisons: in double precision for
// accuracy, in single precision to time it on equal terms with the fp32 low-rank form.
struct DenseWhitener {
  uint32_t dim = 0;
  std::vector<double> l;   // dim x dim, lower triangular, row-major
  std::vector<float> l32;  // the same, rounded to fp32
};

giftResult_t make_dense_whitener(const std::vector<double>& u, const std::vector<double>& l,
                                 const std::vector<double>& diag, uint32_t dim, DenseWhitener* out);
// Of a whitener make_dense_whitener made (which loaded BLAS).
void whiten_dense(const DenseWhitener& t, double* w, uint64_t rows);
void unwhiten_dense(const DenseWhitener& t, double* w, uint64_t rows);
void whiten_dense(const DenseWhitener& t, float* w, uint64_t rows);
void unwhiten_dense(const DenseWhitener& t, float* w, uint64_t rows);

}  // namespace gift::coords
