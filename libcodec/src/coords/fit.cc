#include "coords/fit.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.h"
#include "numerics/convert.h"
#include "numerics/linalg.h"
#include "numerics/shapes.h"

namespace gift::coords {
namespace {

// Top `rank` eigen-pairs of the symmetric k x k matrix m (row-major), descending.
giftResult_t top_eigen(std::vector<double> m, uint32_t k, uint32_t rank, std::vector<double>* vecs,
                       std::vector<double>* vals) {
  std::vector<double> w(k);
  if (linalg::functions().dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', int(k), m.data(), int(k), w.data()) !=
      0) {
    return fail(GIFT_ERROR_INTERNAL, "fit: eigendecomposition failed");
  }
  vecs->assign(uint64_t(k) * rank, 0.0);
  vals->assign(rank, 0.0);
  for (uint32_t j = 0; j < rank; ++j) {
    const uint32_t src = k - 1 - j;  // dsyevd sorts ascending
    (*vals)[j] = std::max(w[src], 0.0);
    for (uint32_t i = 0; i < k; ++i) (*vecs)[uint64_t(i) * rank + j] = m[uint64_t(i) * k + src];
  }
  return GIFT_OK;
}

// Orthonormalizes the columns of the n x k matrix y in place.
giftResult_t orthonormalize(std::vector<double>* y, uint32_t n, uint32_t k) {
  std::vector<double> tau(k);
  const linalg::Functions& la = linalg::functions();
  if (la.dgeqrf(LAPACK_ROW_MAJOR, int(n), int(k), y->data(), int(k), tau.data()) != 0 ||
      la.dorgqr(LAPACK_ROW_MAJOR, int(n), int(k), int(k), y->data(), int(k), tau.data()) != 0) {
    return fail(GIFT_ERROR_INTERNAL, "fit: QR failed");
  }
  return GIFT_OK;
}

}  // namespace

giftResult_t fit_low_rank(const double* a, uint32_t dim, const FitOptions& o,
                          LowRankPlusDiagonal* out) {
  if (!a || dim == 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "fit: no A, or A of dimension 0");
  if (!(o.damping > 0)) return fail(GIFT_ERROR_INVALID_ARGUMENT, "fit: damping must be positive");
  if (const giftResult_t r = linalg::load()) return r;
  const linalg::Functions& la = linalg::functions();
  const uint32_t rank = std::min(o.rank, dim);
  out->dim = dim;
  out->rank = rank;
  if (dim <= o.exact_max_dim || uint64_t(rank) + o.oversample >= dim) {
    if (const giftResult_t r =
            top_eigen(std::vector<double>(a, a + uint64_t(dim) * dim), dim, rank, &out->u, &out->l))
      return r;
  } else {
    // Randomized subspace iteration (Halko, Martinsson, Tropp 2011, alg. 4.4).
    const uint32_t k = rank + o.oversample;  // below dim
    std::vector<double> omega(uint64_t(dim) * k), y(uint64_t(dim) * k);
    std::mt19937_64 gen(o.seed);
    std::normal_distribution<double> nd;
    for (double& x : omega) x = nd(gen);
    for (uint32_t it = 0; it <= o.power_iterations; ++it) {
      la.dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(dim), int(k), int(dim), 1.0, a,
               int(dim), omega.data(), int(k), 0.0, y.data(), int(k));
      if (const giftResult_t r = orthonormalize(&y, dim, k)) return r;
      omega.swap(y);
    }
    // Rayleigh-Ritz on the subspace: Q^T A Q (k x k).
    std::vector<double> aq(uint64_t(dim) * k), small(uint64_t(k) * k), vecs, vals;
    la.dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(dim), int(k), int(dim), 1.0, a,
             int(dim), omega.data(), int(k), 0.0, aq.data(), int(k));
    la.dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(k), int(k), int(dim), 1.0, omega.data(),
             int(k), aq.data(), int(k), 0.0, small.data(), int(k));
    if (const giftResult_t r = top_eigen(small, k, rank, &vecs, &vals)) return r;
    out->u.assign(uint64_t(dim) * rank, 0.0);
    la.dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(dim), int(rank), int(k), 1.0,
             omega.data(), int(k), vecs.data(), int(rank), 0.0, out->u.data(), int(rank));
    out->l = vals;
  }
  return redamp(a, o.damping, o.damping_relative, out);
}

giftResult_t redamp(const double* a, double damping, bool relative, LowRankPlusDiagonal* out) {
  // Residual diagonal diag(A - U diag(l) U^T), clamped below by the damping.
  const uint32_t dim = out->dim, rank = out->rank;
  double mean_diag = 0;
  for (uint32_t i = 0; i < dim; ++i) mean_diag += a[uint64_t(i) * dim + i];
  mean_diag /= dim;
  const double floor = relative ? damping * mean_diag : damping;
  if (!(floor > 0)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "fit: A has no positive diagonal to damp against");
  }
  out->diag.resize(dim);
  for (uint32_t i = 0; i < dim; ++i) {
    double r = a[uint64_t(i) * dim + i];
    for (uint32_t j = 0; j < rank; ++j) {
      r -= out->l[j] * out->u[uint64_t(i) * rank + j] * out->u[uint64_t(i) * rank + j];
    }
    out->diag[i] = std::max(r, floor);
  }
  return GIFT_OK;
}

giftResult_t gradient_second_moment(const void* w, giftDType_t dtype, uint64_t rows, uint32_t dim,
                                    double* a, double decay) {
  if (const giftResult_t r = linalg::load()) return r;
  // Bands of rows of about kBandElems elements, widened (exactly) and added in turn: memory
  // for one band, not a double copy of the gradient. BLAS updates the upper triangle only, the
  // first band scaling it by decay; the lower triangle is copied from it at the end. With decay 0
  // the caller's matrix may hold anything, NaN included: it is zeroed first, since some BLAS
  // multiply C by a beta of 0 rather than leave it unread (OpenBLAS before 0.3.10).
  constexpr uint64_t kBandElems = uint64_t(1) << 20;
  const uint64_t band = std::max<uint64_t>(1, kBandElems / dim);
  std::vector<float> wf(std::min(band, rows) * dim);
  std::vector<double> wd(wf.size());
  if (decay == 0) std::fill(a, a + uint64_t(dim) * dim, 0.0);
  const uint8_t* src = static_cast<const uint8_t*>(w);
  for (uint64_t r0 = 0; r0 < rows; r0 += band) {
    const uint64_t n = std::min(band, rows - r0);
    convert_elements(src + r0 * dim * dtype_size(dtype), dtype, wf.data(), GIFT_DTYPE_F32, n * dim);
    std::copy(wf.begin(), wf.begin() + ptrdiff_t(n * dim), wd.begin());
    linalg::functions().dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(dim), int(n),
                              (1.0 - decay) / double(rows), wd.data(), int(dim), r0 ? 1.0 : decay,
                              a, int(dim));
  }
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < i; ++j) a[uint64_t(i) * dim + j] = a[uint64_t(j) * dim + i];
  return GIFT_OK;
}

}  // namespace gift::coords
