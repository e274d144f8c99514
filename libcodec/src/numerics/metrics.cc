// Error metrics shared by tests, the CLI and benchmarks. Sums run in double so the metric
// itself adds no error visible at FP8 precision.
#include "numerics/metrics.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "numerics/fp_env.h"
#include "numerics/linalg.h"
#include "numerics/pair_sums.h"

namespace gift {
namespace {

// sum over rows of x_i^T A x_i, i.e. ||X A^1/2||_F^2, without forming A^1/2.
double a_quadratic(const float* x, uint64_t rows, uint64_t cols, const float* a) {
  constexpr uint64_t kRowsPerStep = 64;
  std::vector<float> xa(kRowsPerStep * cols);
  double sum = 0.0;
  for (uint64_t r0 = 0; r0 < rows; r0 += kRowsPerStep) {
    const uint64_t n = std::min(kRowsPerStep, rows - r0);
    linalg::functions().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(cols),
                              int(cols), 1.0f, x + r0 * cols, int(cols), a, int(cols), 0.0f,
                              xa.data(), int(cols));
    for (uint64_t i = 0; i < n * cols; ++i) sum += double(x[r0 * cols + i]) * xa[i];
  }
  return sum;
}

// The checks of A that need no data: finite entries, and a nonnegative diagonal (the cheap
// half of semi-definiteness).
giftResult_t check_entries(const float* a, uint64_t cols) {
  for (uint64_t k = 0; k < cols * cols; ++k) {
    if (!std::isfinite(a[k])) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "giftComputeErrorMetrics: A holds a non-finite value at (%llu, %llu)",
                  (unsigned long long)(k / cols), (unsigned long long)(k % cols));
    }
  }
  for (uint64_t k = 0; k < cols; ++k) {
    if (a[k * (cols + 1)] < 0) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "giftComputeErrorMetrics: A is not positive semi-definite: diagonal entry %llu "
                  "is negative (%g)",
                  (unsigned long long)k, double(a[k * (cols + 1)]));
    }
  }
  return GIFT_OK;
}

}  // namespace

// The ratios from the sums: the one place that defines them (FORMAT.md 1.11).
void finish_ratios(giftErrorMetrics* m) {
  const double rr = m->sum_ref_sq, aa = m->sum_approx_sq, ee = m->sum_err_sq;
  m->rel_l2 = rr > 0 ? std::sqrt(ee / rr) : (ee > 0 ? INFINITY : 0.0);
  m->cosine = (rr > 0 && aa > 0) ? std::clamp(m->sum_dot / std::sqrt(rr * aa), -1.0, 1.0)
                                 : (rr == aa ? 1.0 : 0.0);
  m->bias = m->count ? m->sum_err / double(m->count) : 0.0;
}

void merge_metrics(giftErrorMetrics* total, const giftErrorMetrics* part) {
  const num::FpEnvGuard fp_env;
  total->sum_ref_sq += part->sum_ref_sq;
  total->sum_approx_sq += part->sum_approx_sq;
  total->sum_err_sq += part->sum_err_sq;
  total->sum_dot += part->sum_dot;
  total->sum_err += part->sum_err;
  total->count += part->count;
  total->max_abs = std::max(total->max_abs, part->max_abs);
  total->nonfinite += part->nonfinite;
  total->sum_ref_asq += part->sum_ref_asq;
  total->sum_err_asq += part->sum_err_asq;
  total->rel_anorm = total->sum_ref_asq > 0
                         ? std::sqrt(std::max(total->sum_err_asq, 0.0) / total->sum_ref_asq)
                         : -1.0;
  finish_ratios(total);
}

giftResult_t compute_metrics(const float* ref, const float* approx, uint64_t rows, uint64_t cols,
                             const float* a, giftErrorMetrics* out) {
  if (cols && rows > UINT64_MAX / cols) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftComputeErrorMetrics: shape overflows 64 bits");
  }
  const num::FpEnvGuard fp_env;  // the same metrics whatever the caller's rounding mode
  const uint64_t n = rows * cols;
  if (n && (!ref || !approx)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftComputeErrorMetrics: null pointer");
  }
  if (a && cols > 0 && cols > uint64_t(INT32_MAX)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "giftComputeErrorMetrics: cols too large for the A-norm");
  }
  // Pairs holding a NaN or an Inf are left out and counted: one of them would turn every sum
  // into NaN or Inf and hide the error of all the others.
  const simd::PairSums s = simd::pair_sums(ref, approx, n);
  out->max_abs = s.max_abs;
  out->nonfinite = s.left_out;
  out->rel_anorm = -1.0;
  out->sum_ref_sq = s.ref_sq;
  out->sum_approx_sq = s.approx_sq;
  out->sum_err_sq = s.err_sq;
  out->sum_dot = s.dot;
  out->sum_err = s.err;
  out->count = n - s.left_out;
  out->sum_ref_asq = out->sum_err_asq = 0.0;
  finish_ratios(out);
  if (!a || !n) return GIFT_OK;
  if (const giftResult_t r = check_entries(a, cols)) return r;
  if (const giftResult_t r = linalg::load()) return r;
  try {
    std::vector<float> diff(n), kept(ref, ref + n);
    // The A-norms' diagonal parts, sum of a_kk x_k^2: the scale of their rounding.
    double ref_diag = 0, err_diag = 0;
    for (uint64_t r = 0, i = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c, ++i) {
        const bool finite = std::isfinite(ref[i]) && std::isfinite(approx[i]);
        diff[i] = finite ? approx[i] - ref[i] : 0.0f;
        if (!finite) kept[i] = 0.0f;
        const double akk = a[c * (cols + 1)], x = kept[i], e = diff[i];
        ref_diag += akk * x * x, err_diag += akk * e * e;
      }
    }
    const double num = a_quadratic(diff.data(), rows, cols, a);
    const double den = a_quadratic(kept.data(), rows, cols, a);
    // A negative A-norm squared shows an A that is not semi-definite (its norm would mean
    // nothing, or a plausible number where it stayed positive), past what rounding gives: the
    // fp32 products' (under 2e-7 of the diagonal part, rows in A's null space at 16384 columns)
    // and an A kept in bf16's (its entries rounded by up to 2^-9: -0.0025 of a row's diagonal
    // part at 8192 columns, where -1e-3 refused 6 rows of 16).
    constexpr double kIndefinite = 1.0 / 32;
    for (const auto& [sum, diag, what] :
         {std::make_tuple(den, ref_diag, "reference"), std::make_tuple(num, err_diag, "error")}) {
      if (sum < -kIndefinite * diag) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT,
                    "giftComputeErrorMetrics: A is not positive semi-definite: the A-norm "
                    "squared of the %s is negative (%g, its diagonal part %g)",
                    what, sum, diag);
      }
    }
    out->sum_err_asq = num;
    out->sum_ref_asq = den;
    out->rel_anorm = den > 0 ? std::sqrt(std::max(num, 0.0) / den) : (num > 0 ? INFINITY : 0.0);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "giftComputeErrorMetrics: out of memory for the A-norm");
  }
  return GIFT_OK;
}

}  // namespace gift
