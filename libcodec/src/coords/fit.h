// Fitting A^ = U diag(l) U^T + D to a second-moment matrix A: the top-r eigen-pairs (exact,
// or by randomized subspace iteration for large d) and the damped residual diagonal.
#pragma once

#include <cstdint>
#include <vector>

#include "gift/gift.h"

namespace gift::coords {

struct FitOptions {
  uint32_t rank = 32;
  // Damping, the floor of the residual diagonal: relative (times mean diag A) or absolute.
  double damping = 1e-3;
  bool damping_relative = true;
  // Exact eigendecomposition up to this d; randomized subspace iteration above it.
  uint32_t exact_max_dim = 1024;
  uint32_t oversample = 10;
  uint32_t power_iterations = 4;
  uint64_t seed = 1;
};

struct LowRankPlusDiagonal {
  uint32_t dim = 0, rank = 0;
  std::vector<double> u;     // dim x rank, row-major, orthonormal columns
  std::vector<double> l;     // rank, descending, >= 0
  std::vector<double> diag;  // dim, >= damping
};

// a: dim x dim symmetric positive semi-definite, row-major; read in place (a moment of
// d_in = 4096 is 128 MiB).
giftResult_t fit_low_rank(const double* a, uint32_t dim, const FitOptions& o,
                          LowRankPlusDiagonal* out);

// Recomputes the damped residual diagonal of `fit` (whose u and l came from A) for another
// damping: the eigen-pairs do not depend on it.
giftResult_t redamp(const double* a, double damping, bool relative, LowRankPlusDiagonal* fit);

// a = A_g = W^T W / rows (dim x dim, row-major) for a rows x dim gradient of any input dtype
// (the case without activation statistics), in double; with decay > 0, the smoothed
// a = decay a + (1 - decay) A_g, for `a` symmetric (with decay 0 it is only written).
giftResult_t gradient_second_moment(const void* w, giftDType_t dtype, uint64_t rows, uint32_t dim,
                                    double* a, double decay = 0);
// The same, into a new matrix (empty where it fails).
inline std::vector<double> gradient_second_moment(const void* w, giftDType_t dtype, uint64_t rows,
                                                  uint32_t dim) {
  std::vector<double> a(uint64_t(dim) * dim);
  if (gradient_second_moment(w, dtype, rows, dim, a.data()) != GIFT_OK) a.clear();
  return a;
}

}  // namespace gift::coords
