#include "coords/whitener.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/error.h"
#include "coords/low_rank_update.h"
#include "numerics/linalg.h"

namespace gift::coords {

giftResult_t make_whitener(const std::vector<double>& u, const std::vector<double>& l,
                           const std::vector<double>& diag, uint32_t dim, Whitener* out) {
  const uint32_t k = uint32_t(l.size());
  if (u.size() != uint64_t(dim) * k || diag.size() != dim || k > dim) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "whitener: inconsistent sizes");
  }
  if (const giftResult_t r = linalg::load()) return r;
  const linalg::Functions& la = linalg::functions();
  for (double x : diag) {
    if (!(x > 0) || !std::isfinite(x))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "whitener: D must be positive");
  }
  // A D past fp32's range (an extreme damping, or A's scale) would give a whitener that a
  // basis file cannot hold (its reader refuses non-finite parts) or that loses W (a zero);
  // checked first, since B = D^-1/2 ... then overflows, which LAPACK refuses (a damping of
  // 1e-318 failed as "whitener: QR failed").
  out->d_rsqrt.resize(dim);
  out->d_sqrt.resize(dim);
  for (uint32_t i = 0; i < dim; ++i) {
    out->d_rsqrt[i] = float(1.0 / std::sqrt(diag[i]));
    out->d_sqrt[i] = float(std::sqrt(diag[i]));
    if (!std::isfinite(out->d_sqrt[i]) || out->d_rsqrt[i] == 0.0f || out->d_sqrt[i] == 0.0f ||
        !std::isfinite(out->d_rsqrt[i])) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "whitener: D[%u] = %g is out of fp32's range for its square root and its "
                  "inverse (the damping, or A's scale)",
                  i, diag[i]);
    }
  }
  // B = D^-1/2 U diag(l)^1/2, so that A^ = D^1/2 (I + B B^T) D^1/2.
  std::vector<double> b(u.size());
  for (uint32_t i = 0; i < dim; ++i) {
    for (uint32_t j = 0; j < k; ++j)
      b[uint64_t(i) * k + j] = u[uint64_t(i) * k + j] * std::sqrt(std::max(l[j], 0.0) / diag[i]);
  }
  // B = Q R; B B^T = Q (R R^T) Q^T = V diag(s) V^T with R R^T = W diag(s) W^T and V = Q W.
  std::vector<double> tau(k ? k : 1), r(uint64_t(k) * k, 0.0);
  if (k) {
    if (la.dgeqrf(LAPACK_ROW_MAJOR, int(dim), int(k), b.data(), int(k), tau.data()) != 0) {
      return fail(GIFT_ERROR_INTERNAL, "whitener: QR failed");
    }
    for (uint32_t i = 0; i < k; ++i)
      for (uint32_t j = i; j < k; ++j) r[uint64_t(i) * k + j] = b[uint64_t(i) * k + j];
    if (la.dorgqr(LAPACK_ROW_MAJOR, int(dim), int(k), int(k), b.data(), int(k), tau.data()) != 0) {
      return fail(GIFT_ERROR_INTERNAL, "whitener: forming Q failed");
    }
  }
  std::vector<double> rrt(uint64_t(k) * k), s(k);
  if (k) {
    la.dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(k), int(k), int(k), 1.0, r.data(), int(k),
             r.data(), int(k), 0.0, rrt.data(), int(k));
    if (la.dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', int(k), rrt.data(), int(k), s.data()) != 0) {
      return fail(GIFT_ERROR_INTERNAL, "whitener: eigendecomposition failed");
    }
  }
  std::vector<double> v(uint64_t(dim) * k);
  if (k) {
    la.dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(dim), int(k), int(k), 1.0, b.data(),
             int(k), rrt.data(), int(k), 0.0, v.data(), int(k));
  }
  out->dim = dim;
  out->rank = k;
  out->v.assign(v.begin(), v.end());
  out->c.resize(k);
  out->c_inv.resize(k);
  for (uint32_t j = 0; j < k; ++j) {
    const double sj = std::max(s[j], 0.0);
    out->c[j] = float(1.0 / std::sqrt(1.0 + sj) - 1.0);
    out->c_inv[j] = float(std::sqrt(1.0 + sj) - 1.0);
  }
  const auto finite = [](const std::vector<float>& p) {
    return std::all_of(p.begin(), p.end(), [](float x) { return std::isfinite(x); });
  };
  if (!finite(out->v) || !finite(out->c) || !finite(out->c_inv)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "whitener: the low-rank part is not finite in fp32 (A's scale against D)");
  }
  return GIFT_OK;
}

void whiten(const Whitener& t, float* w, uint64_t rows, int threads) {
  low_rank_update(t.v.data(), t.c.data(), t.dim, t.rank, t.d_rsqrt.data(), nullptr, w, rows,
                  threads);
}

void unwhiten(const Whitener& t, float* w, uint64_t rows, int threads) {
  low_rank_update(t.v.data(), t.c_inv.data(), t.dim, t.rank, nullptr, t.d_sqrt.data(), w, rows,
                  threads);
}

giftResult_t make_dense_whitener(const std::vector<double>& u, const std::vector<double>& l,
                                 const std::vector<double>& diag, uint32_t dim,
                                 DenseWhitener* out) {
  const uint32_t k = uint32_t(l.size());
  if (const giftResult_t r = linalg::load()) return r;
  const linalg::Functions& la = linalg::functions();
  std::vector<double> a(uint64_t(dim) * dim, 0.0), ul(u);
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < k; ++j) ul[uint64_t(i) * k + j] *= l[j];
  if (k) {
    la.dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(dim), int(dim), int(k), 1.0, ul.data(),
             int(k), u.data(), int(k), 0.0, a.data(), int(dim));
  }
  for (uint32_t i = 0; i < dim; ++i) a[uint64_t(i) * dim + i] += diag[i];
  if (la.dpotrf(LAPACK_ROW_MAJOR, 'L', int(dim), a.data(), int(dim)) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "dense whitener: A^ is not positive definite");
  }
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = i + 1; j < dim; ++j) a[uint64_t(i) * dim + j] = 0.0;
  out->dim = dim;
  out->l = std::move(a);
  out->l32.assign(out->l.begin(), out->l.end());
  return GIFT_OK;
}

void whiten_dense(const DenseWhitener& t, double* w, uint64_t rows) {
  // X L^T = W  =>  X = W L^-T
  linalg::functions().dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit,
                            int(rows), int(t.dim), 1.0, t.l.data(), int(t.dim), w, int(t.dim));
}

void unwhiten_dense(const DenseWhitener& t, double* w, uint64_t rows) {
  linalg::functions().dtrmm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit,
                            int(rows), int(t.dim), 1.0, t.l.data(), int(t.dim), w, int(t.dim));
}

void whiten_dense(const DenseWhitener& t, float* w, uint64_t rows) {
  linalg::functions().strsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit,
                            int(rows), int(t.dim), 1.0f, t.l32.data(), int(t.dim), w, int(t.dim));
}

void unwhiten_dense(const DenseWhitener& t, float* w, uint64_t rows) {
  linalg::functions().strmm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit,
                            int(rows), int(t.dim), 1.0f, t.l32.data(), int(t.dim), w, int(t.dim));
}

bool inverse_stays_finite(const Whitener& t, const float* whitened, uint64_t rows) {
  // ||y T^-1|| <= ||y|| ||T^-1||, with ||T^-1|| = ||(I + V C' V^T) D^1/2|| at most
  // (1 + max|c'|) max d_sqrt; FP8 rounding grows a row by at most 2^-3 relative (E5M2's
  // half step), and the factor 4 below leaves room for fp32 rounding in the products.
  double inv = 0, d = 0;
  for (const float c : t.c_inv) inv = std::max(inv, double(std::fabs(c)));
  for (const float s : t.d_sqrt) d = std::max(d, double(s));
  const double bound = (1.0 + inv) * d * 1.125;
  double worst = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (uint32_t j = 0; j < t.dim; ++j) {
      const double x = whitened[r * t.dim + j];
      sq += x * x;
    }
    worst = std::max(worst, sq);
  }
  return std::isfinite(worst) && std::sqrt(worst) * bound < double(FLT_MAX) / 4;
}

}  // namespace gift::coords
