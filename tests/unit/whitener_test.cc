// The whitener of GIFT coordinates: exact identities, linearity across ranks, and the synthetic
// cases of issue 5 where the frame must win.
#include "coords/whitener.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <lapacke.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "api/coords_frames.h"
#include "container/reader.h"
#include "container/writer.h"
#include "coords/basis.h"
#include "coords/fit.h"
#include "coords/low_rank_element.h"
#include "coords/select.h"
#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "unit/edited.h"

namespace gift::coords {
namespace {

struct Model {
  std::vector<double> u, l, diag;
};

// Random orthonormal U (dim x rank), decaying l, positive D.
Model random_model(uint32_t dim, uint32_t rank, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd;
  Model m;
  m.u.resize(uint64_t(dim) * rank);
  for (double& x : m.u) x = nd(gen);
  std::vector<double> tau(rank ? rank : 1);
  if (rank) {
    LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, int(dim), int(rank), m.u.data(), int(rank), tau.data());
    LAPACKE_dorgqr(LAPACK_ROW_MAJOR, int(dim), int(rank), int(rank), m.u.data(), int(rank),
                   tau.data());
  }
  for (uint32_t j = 0; j < rank; ++j) m.l.push_back(100.0 / (1.0 + j));
  std::uniform_real_distribution<double> ud(0.5, 2.0);
  for (uint32_t i = 0; i < dim; ++i) m.diag.push_back(ud(gen));
  return m;
}

std::vector<double> dense(const Model& m, uint32_t dim) {
  const uint32_t r = uint32_t(m.l.size());
  std::vector<double> a(uint64_t(dim) * dim, 0.0);
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < dim; ++j) {
      double s = i == j ? m.diag[i] : 0.0;
      for (uint32_t k = 0; k < r; ++k)
        s += m.u[uint64_t(i) * r + k] * m.l[k] * m.u[uint64_t(j) * r + k];
      a[uint64_t(i) * dim + j] = s;
    }
  return a;
}

// A gradient's second moment W^T W / rows, taken in bands of rows from bf16 input, against
// the sums written out in long double: within a few ulps of double, the bands' seams
// included (2000 rows of 600 are two bands of 1747 and 253 rows).
TEST(SecondMoment, BandsOfBf16RowsGiveTheExactSumsToDoublePrecision) {
  const uint64_t rows = 2000;
  const uint32_t dim = 600;
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> w(rows * dim);
  std::vector<double> wd(w.size());
  for (size_t k = 0; k < w.size(); ++k) {
    const float x = nd(gen) * std::ldexp(1.0f, int(k % 7) - 3);
    uint32_t b;
    std::memcpy(&b, &x, 4);
    w[k] = uint16_t(b >> 16);  // truncated to bf16: the value is then exact
    const uint32_t back = uint32_t(w[k]) << 16;
    float v;
    std::memcpy(&v, &back, 4);
    wd[k] = v;
  }
  std::vector<double> a(uint64_t(dim) * dim);
  ASSERT_EQ(giftGradientSecondMoment(w.data(), GIFT_DTYPE_BF16, rows, dim, a.data()), GIFT_OK)
      << giftGetLastErrorMessage();
  for (uint32_t i = 0; i < dim; i += 7) {
    for (uint32_t j = 0; j < dim; j += 5) {
      long double sum = 0, mag = 0;
      for (uint64_t r = 0; r < rows; ++r) {
        sum += (long double)wd[r * dim + i] * wd[r * dim + j];
        mag += std::fabs((long double)wd[r * dim + i] * wd[r * dim + j]);
      }
      const double want = double(sum / rows), tol = double(mag / rows) * 1e-13;
      ASSERT_NEAR(a[uint64_t(i) * dim + j], want, tol) << i << ", " << j;
      ASSERT_EQ(a[uint64_t(i) * dim + j], a[uint64_t(j) * dim + i]) << i << ", " << j;
    }
  }
}

// Smoothing in place: a = decay a + (1 - decay) W2^T W2 / rows over a moment of W1 (taken into
// a buffer of NaN), in bands of rows (2000 rows of 600: two), against the sums in long double;
// the lower triangle stays the upper's mirror; a decay outside [0, 1), and NaN or Inf in the
// gradient, are refused and leave a as it was.
TEST(SecondMoment, UpdateSmoothsInPlace) {
  const uint64_t rows = 2000;
  const uint32_t dim = 600;
  const double decay = 0.9;
  std::mt19937 gen(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w1(rows * dim), w2(rows * dim);
  for (float& x : w1) x = nd(gen);
  for (float& x : w2) x = 0.5f * nd(gen) + 0.25f;
  std::vector<double> a(uint64_t(dim) * dim, NAN);  // never read: a caller's fresh buffer
  ASSERT_EQ(giftGradientSecondMoment(w1.data(), GIFT_DTYPE_F32, rows, dim, a.data()), GIFT_OK);
  ASSERT_EQ(giftGradientSecondMomentUpdate(w2.data(), GIFT_DTYPE_F32, rows, dim, decay, a.data()),
            GIFT_OK)
      << giftGetLastErrorMessage();
  for (uint32_t i = 0; i < dim; i += 7) {
    for (uint32_t j = 0; j < dim; j += 5) {
      long double s1 = 0, s2 = 0, mag = 0;
      for (uint64_t r = 0; r < rows; ++r) {
        s1 += (long double)w1[r * dim + i] * w1[r * dim + j];
        s2 += (long double)w2[r * dim + i] * w2[r * dim + j];
        mag += std::fabs((long double)w1[r * dim + i] * w1[r * dim + j]) +
               std::fabs((long double)w2[r * dim + i] * w2[r * dim + j]);
      }
      const double want = double((decay * s1 + (1 - decay) * s2) / rows);
      ASSERT_NEAR(a[uint64_t(i) * dim + j], want, double(mag / rows) * 1e-13) << i << ", " << j;
      ASSERT_EQ(a[uint64_t(i) * dim + j], a[uint64_t(j) * dim + i]) << i << ", " << j;
    }
  }
  const std::vector<double> kept = a;
  for (const double bad : {-0.1, 1.0, double(NAN)}) {
    EXPECT_EQ(giftGradientSecondMomentUpdate(w2.data(), GIFT_DTYPE_F32, rows, dim, bad, a.data()),
              GIFT_ERROR_INVALID_ARGUMENT)
        << bad;
  }
  EXPECT_EQ(a, kept);
  // NaN and Inf in the second band of rows (from row 1747): refused by count and first place,
  // before the first band touches a (they spread through the whole moment, which the builder
  // then refused by a place in A).
  w2[1900 * dim + 7] = NAN;
  w2[1999 * dim] = -INFINITY;
  EXPECT_EQ(giftGradientSecondMomentUpdate(w2.data(), GIFT_DTYPE_F32, rows, dim, decay, a.data()),
            GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_STREQ(giftGetLastErrorMessage(),
               "2 non-finite values in the input, the first at index 1140007 (row 1900, column 7)");
  EXPECT_EQ(a, kept);
}

TEST(Whitener, WhitensAHatAndInvertsExactly) {
  for (auto [dim, rank] : {std::pair<uint32_t, uint32_t>{64, 8}, {200, 32}, {96, 0}, {40, 40}}) {
    const Model m = random_model(dim, rank, dim * 31 + rank);
    Whitener t;
    ASSERT_EQ(make_whitener(m.u, m.l, m.diag, dim, &t), GIFT_OK);
    // T itself: the identity's rows, whitened.
    std::vector<float> tm(uint64_t(dim) * dim, 0.0f);
    for (uint32_t i = 0; i < dim; ++i) tm[uint64_t(i) * dim + i] = 1.0f;
    whiten(t, tm.data(), dim);
    const std::vector<double> a = dense(m, dim);
    double worst = 0;
    for (uint32_t i = 0; i < dim; ++i)
      for (uint32_t j = 0; j < dim; ++j) {
        double s = 0;  // (T^T A T)_ij
        for (uint32_t p = 0; p < dim; ++p) {
          double ap = 0;
          for (uint32_t q = 0; q < dim; ++q)
            ap += a[uint64_t(p) * dim + q] * tm[uint64_t(q) * dim + j];
          s += tm[uint64_t(p) * dim + i] * ap;
        }
        worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst, 2e-4) << "T^T A^ T = I, dim " << dim << " rank " << rank;
    std::vector<float> back = tm;
    unwhiten(t, back.data(), dim);
    double worst_inv = 0;
    for (uint32_t i = 0; i < dim; ++i)
      for (uint32_t j = 0; j < dim; ++j) {
        worst_inv = std::max(worst_inv,
                             std::fabs(double(back[uint64_t(i) * dim + j]) - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst_inv, 2e-5) << "T^-1 T = I, dim " << dim << " rank " << rank;
  }
}

// The per-element order that the device reduce plan's exact whitener runs (one output per
// CUDA thread) gives whiten()'s and unwhiten()'s bits, on sizes that exercise the bands of 8
// rows, the leftover rows, vector tails of the columns and ranks that are not whole vectors.
// Both sides fuse their multiply-adds only where the CPU target has FMA.
TEST(Whitener, PerElementOrderGivesTheBandedBits) {
#if HWY_ARCH_X86
  if (!(hwy::SupportedTargets() & (HWY_AVX2 | HWY_AVX3))) {
    GTEST_SKIP() << "no FMA target: the banded whitener rounds its products first";
  }
#endif
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  struct Size {
    uint32_t dim, rank;
    uint64_t rows;
  };
  for (const Size z : {Size{48, 5, 19}, Size{37, 3, 8}, Size{130, 17, 3}, Size{16, 0, 9}}) {
    const Model m = random_model(z.dim, z.rank, 100 + z.dim);
    Whitener t;
    ASSERT_EQ(make_whitener(m.u, m.l, m.diag, z.dim, &t), GIFT_OK);
    std::vector<float> w(z.rows * z.dim);
    for (float& x : w) x = nd(gen);
    for (const bool inverse : {false, true}) {
      std::vector<float> banded = w, element = w;
      inverse ? unwhiten(t, banded.data(), z.rows) : whiten(t, banded.data(), z.rows);
      const float* c = inverse ? t.c_inv.data() : t.c.data();
      const float* pre = inverse ? nullptr : t.d_rsqrt.data();
      const float* post = inverse ? t.d_sqrt.data() : nullptr;
      std::vector<float> p(t.rank);
      for (uint64_t r = 0; r < z.rows; ++r) {
        float* x = element.data() + r * z.dim;
        for (uint32_t j = 0; j < t.rank; ++j)
          p[j] = low_rank_projection(x, t.v.data(), c, pre, t.dim, t.rank, j);
        for (uint32_t i = 0; i < t.dim; ++i)
          x[i] = low_rank_output(x[i], p.data(), t.v.data(), pre, post, t.rank, i);
      }
      for (size_t k = 0; k < w.size(); ++k) {
        uint32_t a, b;
        memcpy(&a, &banded[k], 4);
        memcpy(&b, &element[k], 4);
        ASSERT_EQ(a, b) << "dim " << z.dim << " rank " << z.rank
                        << (inverse ? " unwhiten" : " whiten") << " element " << k << ": "
                        << banded[k] << " vs " << element[k];
      }
    }
  }
}

#if defined(__SSE2__)
// The caller's flush-to-zero and denormals-are-zero modes (torch.set_flush_denormal) do not
// reach the whitener: subnormal inputs and products keep the IEEE bits.
TEST(Whitener, KeepsSubnormalsUnderTheCallersFlushToZero) {
  const Model m = random_model(40, 4, 9);
  Whitener t;
  ASSERT_EQ(make_whitener(m.u, m.l, m.diag, 40, &t), GIFT_OK);
  std::mt19937 gen(4);
  std::normal_distribution<float> nd;
  std::vector<float> w(7 * 40);
  for (float& x : w) x = nd(gen) * 1e-39f;  // subnormal
  std::vector<float> want = w, got = w;
  whiten(t, want.data(), 7);
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ and DAZ
  whiten(t, got.data(), 7);
  const unsigned after = _mm_getcsr();
  _mm_setcsr(csr);
  EXPECT_EQ(after, csr | 0x8040u) << "the caller's mode is restored";
  EXPECT_EQ(0, memcmp(want.data(), got.data(), w.size() * sizeof(float)));
  EXPECT_NE(want[0], 0.0f);
}
#endif

TEST(Whitener, IsLinearAcrossRanks) {
  const uint32_t dim = 128, rows = 48;
  const Model m = random_model(dim, 16, 5);
  Whitener t;
  ASSERT_EQ(make_whitener(m.u, m.l, m.diag, dim, &t), GIFT_OK);
  std::mt19937 gen(2);
  std::normal_distribution<float> nd;
  std::vector<float> sum_of_whitened(rows * dim, 0.0f), sum(rows * dim, 0.0f);
  for (int r = 0; r < 4; ++r) {
    std::vector<float> w(rows * dim);
    for (float& x : w) x = nd(gen);
    for (size_t i = 0; i < w.size(); ++i) sum[i] += w[i];
    whiten(t, w.data(), rows);
    for (size_t i = 0; i < w.size(); ++i) sum_of_whitened[i] += w[i];
  }
  whiten(t, sum.data(), rows);
  double num = 0, den = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    num += std::pow(double(sum[i]) - sum_of_whitened[i], 2);
    den += double(sum[i]) * sum[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);
}

// W = S M^T + N: four dense directions with strengths 10:5:2:1 and isotropic noise whose RMS
// is `noise` times that of S M^T.
std::vector<float> synthetic(uint32_t rows, uint32_t dim, double noise, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd;
  const double strength[4] = {10, 5, 2, 1};
  std::vector<double> s(rows * 4), mt(4 * uint64_t(dim)), w(uint64_t(rows) * dim, 0.0);
  for (uint32_t i = 0; i < rows; ++i)
    for (int k = 0; k < 4; ++k) s[i * 4 + k] = nd(gen) * strength[k];
  for (double& x : mt) x = nd(gen) / std::sqrt(double(dim));
  double ss = 0;
  for (uint32_t i = 0; i < rows; ++i)
    for (uint32_t j = 0; j < dim; ++j) {
      double v = 0;
      for (int k = 0; k < 4; ++k) v += s[i * 4 + k] * mt[k * uint64_t(dim) + j];
      w[uint64_t(i) * dim + j] = v;
      ss += v * v;
    }
  const double rms = std::sqrt(ss / double(w.size()));
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = float(w[i] + noise * rms * nd(gen));
  return out;
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& x) {
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  EXPECT_EQ(giftComputeErrorMetrics(ref.data(), x.data(), 1, ref.size(), nullptr, &m), GIFT_OK);
  return m.rel_l2;
}

std::vector<float> round_trip(const std::vector<float>& w, uint32_t rows, uint32_t dim,
                              const giftQuantParams& p) {
  uint64_t sb = 0;
  giftScaleBytes(&p, rows, dim, &sb);
  std::vector<uint8_t> codes(w.size()), scales(sb);
  std::vector<float> out(w.size());
  EXPECT_EQ(giftEncode(nullptr, &p, w.data(), GIFT_DTYPE_F32, rows, dim, codes.data(),
                       scales.data(), sb, nullptr),
            GIFT_OK);
  EXPECT_EQ(giftDecode(nullptr, &p, codes.data(), scales.data(), sb, rows, dim, out.data(),
                       GIFT_DTYPE_F32),
            GIFT_OK);
  return out;
}

// Relative L2 error of W after W T -> FP8 -> T^-1.
double gift_round_trip_error(const std::vector<float>& w, uint32_t rows, uint32_t dim,
                             const Whitener& t, const giftQuantParams& p) {
  std::vector<float> wt = w;
  whiten(t, wt.data(), rows);
  std::vector<float> back = round_trip(wt, rows, dim, p);
  unwhiten(t, back.data(), rows);
  return rel_l2(w, back);
}

TEST(Whitener, SyntheticGradientsWhereTheFrameMustWin) {
  const uint32_t rows = 256, dim = 512;
  const std::vector<float> w = synthetic(rows, dim, 0.01, 11);
  FitOptions fo;  // r = 32, relative damping 1e-3
  LowRankPlusDiagonal fit;
  ASSERT_EQ(fit_low_rank(gradient_second_moment(w.data(), GIFT_DTYPE_F32, rows, dim).data(), dim,
                         fo, &fit),
            GIFT_OK);
  Whitener t;
  ASSERT_EQ(make_whitener(fit.u, fit.l, fit.diag, dim, &t), GIFT_OK);
  DenseWhitener ref;
  ASSERT_EQ(make_dense_whitener(fit.u, fit.l, fit.diag, dim, &ref), GIFT_OK);
  {  // the dense pair inverts itself
    std::vector<double> x(w.begin(), w.end());
    whiten_dense(ref, x.data(), rows);
    unwhiten_dense(ref, x.data(), rows);
    double e = 0, n = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      e += (x[i] - w[i]) * (x[i] - w[i]);
      n += double(w[i]) * w[i];
    }
    EXPECT_LT(std::sqrt(e / n), 1e-12);
    // The fp32 pair (the benchmark's like-for-like timing) computes the same transform.
    std::vector<float> xf = w;
    whiten_dense(ref, xf.data(), rows);
    std::vector<double> xd(w.begin(), w.end());
    whiten_dense(ref, xd.data(), rows);
    EXPECT_LT(rel_l2(std::vector<float>(xd.begin(), xd.end()), xf), 1e-4);
    unwhiten_dense(ref, xf.data(), rows);
    EXPECT_LT(rel_l2(w, xf), 1e-4);
  }
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (auto layout : {GIFT_SCALE_TENSOR, GIFT_SCALE_BLOCK}) {
      giftQuantParams p;
      giftQuantParamsInit(&p);
      p.kind = kind;
      p.layout = layout;
      const double euclid = rel_l2(w, round_trip(w, rows, dim, p));
      const double gift = gift_round_trip_error(w, rows, dim, t, p);
      EXPECT_LE(gift, 0.4 * euclid) << "kind " << kind << " layout " << layout << ": gift " << gift
                                    << " euclidean " << euclid;
      // The paper's dense Cholesky whitener on the same data: within 10%.
      std::vector<double> wd(w.begin(), w.end());
      whiten_dense(ref, wd.data(), rows);
      std::vector<float> wdt(wd.begin(), wd.end());
      std::vector<float> back_d = round_trip(wdt, rows, dim, p);
      std::vector<double> bd(back_d.begin(), back_d.end());
      unwhiten_dense(ref, bd.data(), rows);
      const double dense_err = rel_l2(w, std::vector<float>(bd.begin(), bd.end()));
      // Both whiten A^ exactly, but they are different square roots (L^-T is triangular,
      // the low-rank form symmetric), so FP8 sees differently rotated coordinates: measured
      // here, the symmetric form's error is about 3x lower (with per-tensor scales the
      // triangular factor concentrates magnitude in a few columns and does not even beat
      // Euclidean). The symmetric form must never be worse by more than 10%.
      EXPECT_LE(gift, 1.1 * dense_err) << "kind " << kind << " layout " << layout;
    }
}

// The same structure seen from the activation side: the layer's inputs x = M^T-directions
// with strengths 10:5:2:1 plus 1% isotropic noise, A = E[x x^T]; the gradient shares M.
TEST(Whitener, SyntheticGradientsWithActivationStatistics) {
  const uint32_t rows = 256, dim = 512;
  std::mt19937_64 gen(21);
  std::normal_distribution<double> nd;
  const double strength[4] = {10, 5, 2, 1};
  std::vector<double> mt(4 * uint64_t(dim));
  for (double& x : mt) x = nd(gen) / std::sqrt(double(dim));
  std::vector<float> w(uint64_t(rows) * dim);
  double ss = 0;
  for (uint32_t i = 0; i < rows; ++i) {
    double s4[4];
    for (int k = 0; k < 4; ++k) s4[k] = nd(gen) * strength[k];
    for (uint32_t j = 0; j < dim; ++j) {
      double v = 0;
      for (int k = 0; k < 4; ++k) v += s4[k] * mt[k * uint64_t(dim) + j];
      w[uint64_t(i) * dim + j] = float(v);
      ss += v * v;
    }
  }
  const double rms = std::sqrt(ss / double(w.size()));
  for (float& x : w) x += float(0.01 * rms * nd(gen));
  std::vector<double> a(uint64_t(dim) * dim, 0.0);
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < dim; ++j) {
      double v = i == j ? 1e-4 * 100.0 / dim : 0.0;
      for (int k = 0; k < 4; ++k)
        v += strength[k] * strength[k] * mt[k * uint64_t(dim) + i] * mt[k * uint64_t(dim) + j];
      a[uint64_t(i) * dim + j] = v;
    }
  LowRankPlusDiagonal fit;
  ASSERT_EQ(fit_low_rank(a.data(), dim, FitOptions{}, &fit), GIFT_OK);
  Whitener t;
  ASSERT_EQ(make_whitener(fit.u, fit.l, fit.diag, dim, &t), GIFT_OK);
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (auto layout : {GIFT_SCALE_TENSOR, GIFT_SCALE_BLOCK}) {
      giftQuantParams p;
      giftQuantParamsInit(&p);
      p.kind = kind;
      p.layout = layout;
      const double euclid = rel_l2(w, round_trip(w, rows, dim, p));
      EXPECT_LE(gift_round_trip_error(w, rows, dim, t, p), 0.4 * euclid)
          << "kind " << kind << " layout " << layout;
    }
}

// The selection bound documented in man/giftc.1: the chosen coordinates' full error exceeds the
// other's only by the estimates' sampling error (3 cv / sqrt(k), per-row squared errors).
TEST(Select, ChosenFrameIsNeverWorseBeyondTheSamplingError) {
  const uint32_t dim = 256;
  giftQuantParams p;
  giftQuantParamsInit(&p);
  for (uint64_t seed : {1, 2, 3, 4}) {
    for (double noise : {0.01, 0.3, 3.0}) {
      const uint32_t rows = seed % 2 ? 1024 : 200;  // sampled, and whole
      const std::vector<float> w = synthetic(rows, dim, noise, seed);
      // A basis fitted on another draw of the same structure.
      const std::vector<float> other = synthetic(rows, dim, noise, seed + 100);
      LowRankPlusDiagonal fit;
      FitOptions fo;
      fo.damping = 1.0;
      ASSERT_EQ(fit_low_rank(gradient_second_moment(other.data(), GIFT_DTYPE_F32, rows, dim).data(),
                             dim, fo, &fit),
                GIFT_OK);
      Whitener t;
      ASSERT_EQ(make_whitener(fit.u, fit.l, fit.diag, dim, &t), GIFT_OK);
      const Selection c = choose_coords(w.data(), rows, dim, &t, p, SelectOptions{});
      // Full errors, and the per-row squared errors in both coordinates.
      std::vector<float> e = round_trip(w, rows, dim, p), g = w;
      whiten(t, g.data(), rows);
      g = round_trip(g, rows, dim, p);
      unwhiten(t, g.data(), rows);
      const double full_e = rel_l2(w, e), full_g = rel_l2(w, g);
      auto cv = [&](const std::vector<float>& y) {
        double s1 = 0, s2 = 0;
        for (uint32_t i = 0; i < rows; ++i) {
          double r = 0;
          for (uint32_t j = 0; j < dim; ++j)
            r += std::pow(double(y[i * dim + j]) - w[i * dim + j], 2);
          s1 += r;
          s2 += r * r;
        }
        const double mean = s1 / rows;
        return std::sqrt(std::max(s2 / rows - mean * mean, 0.0)) / mean;
      };
      const double k = std::min<double>(rows, 256);
      const double slack = rows <= 256 ? 0.0 : 3 * std::max(cv(e), cv(g)) / std::sqrt(k);
      const double chosen = c.gift ? full_g : full_e;
      EXPECT_LE(chosen, full_e * (1 + slack) * (1 + 1e-9))
          << "seed " << seed << " noise " << noise << " rows " << rows << " gift " << c.gift;
      if (rows <= 256) {  // the whole tensor was the sample: the estimates are exact
        EXPECT_NEAR(c.euclidean_error, full_e, 1e-6 * full_e);
        EXPECT_NEAR(c.gift_error, full_g, 1e-4 * full_g);
      }
    }
  }
}

TEST(Fit, RandomizedSubspaceIterationFindsTheExactTopSpace) {
  const uint32_t dim = 300, rank = 16;
  const Model m = random_model(dim, rank, 77);
  const std::vector<double> a = dense(m, dim);
  FitOptions exact, randomized;
  exact.rank = randomized.rank = rank;
  randomized.exact_max_dim = 0;
  LowRankPlusDiagonal fe, fr;
  ASSERT_EQ(fit_low_rank(a.data(), dim, exact, &fe), GIFT_OK);
  ASSERT_EQ(fit_low_rank(a.data(), dim, randomized, &fr), GIFT_OK);
  for (uint32_t j = 0; j < rank; ++j) EXPECT_NEAR(fr.l[j], fe.l[j], 1e-6 * fe.l[0]) << j;
  for (uint32_t i = 0; i < dim; ++i) EXPECT_NEAR(fr.diag[i], fe.diag[i], 1e-3 * fe.diag[i]) << i;
}

TEST(Basis, RoundTripsThroughItsFrameAndItsIdTracksTheContents) {
  Basis b;
  for (const char* name : {"b.weight", "a.weight"}) {
    const Model m = random_model(48, 6, name[0]);
    BasisEntry e;
    e.name = name;
    e.damping = 1e-3;
    e.source = "gradients";
    ASSERT_EQ(make_whitener(m.u, m.l, m.diag, 48, &e.whitener), GIFT_OK);
    b.entries.push_back(e);
  }
  finish_basis(&b);
  EXPECT_EQ(b.entries[0].name, "a.weight");
  std::vector<uint8_t> bytes;
  ASSERT_EQ(serialize_basis(b, 3, &bytes), GIFT_OK);
  Basis back;
  ASSERT_EQ(parse_basis(bytes.data(), bytes.size(), "b.giftb", &back), GIFT_OK)
      << giftGetLastErrorMessage();
  EXPECT_TRUE(back.id == b.id);
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[1].whitener.v, b.entries[1].whitener.v);
  EXPECT_EQ(back.entries[1].damping, 1e-3);
  // One changed value, or another damping's whitener, is another basis.
  Basis changed = b;
  changed.entries[0].whitener.c[0] = std::nextafter(changed.entries[0].whitener.c[0], 1.0f);
  finish_basis(&changed);
  EXPECT_FALSE(changed.id == b.id);
  // A basis frame whose id does not match its contents is refused.
  std::vector<uint8_t> lying;
  Basis relabelled = b;
  relabelled.id.lo ^= 1;
  ASSERT_EQ(serialize_basis(relabelled, 0, &lying), GIFT_OK);
  EXPECT_EQ(parse_basis(lying.data(), lying.size(), "x.giftb", &back), GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "x.giftb: basis id does not match its contents");
  // Verification gives decoding's verdict: the frame is intact, the basis it holds is not.
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(lying.data(), lying.size(), &f), GIFT_OK);
  EXPECT_EQ(giftFrameVerify(f), GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "frame: basis id does not match its contents");
  giftFrameClose(f);
}

Basis one_entry_basis() {
  const Model m = random_model(48, 6, 7);
  Basis b;
  BasisEntry e;
  e.name = "a.weight";
  e.damping = 0.1;
  e.source = "activations";
  EXPECT_EQ(make_whitener(m.u, m.l, m.diag, 48, &e.whitener), GIFT_OK);
  b.entries.push_back(e);
  finish_basis(&b);
  return b;
}

// A second moment with a NaN, or a negative diagonal entry (which no second moment has), is
// refused by name and place; the negative one was fitted before, as if it were one.
TEST(Basis, BuilderRefusesWhatCannotBeASecondMoment) {
  const uint32_t dim = 4;
  const auto add = [&](double* a) {
    const giftFitParams fp = GIFT_FIT_PARAMS_INIT;
    giftBasisBuilder* b = nullptr;
    EXPECT_EQ(giftBasisBuilderCreate(&fp, &b), GIFT_OK);
    const giftResult_t r = giftBasisBuilderAdd(b, "w", a, dim, "activations", nullptr, 0, nullptr,
                                               0, nullptr, nullptr);
    giftBasisBuilderFree(b);
    return std::make_pair(r, std::string(giftGetLastErrorMessage()));
  };
  std::vector<double> a(dim * dim, 0.0);
  for (uint32_t k = 0; k < dim; ++k) a[k * dim + k] = 1.0 + k;
  EXPECT_EQ(add(a.data()).first, GIFT_OK);
  a[2 * dim + 2] = -0.5;
  EXPECT_EQ(add(a.data()), std::make_pair(GIFT_ERROR_INVALID_ARGUMENT,
                                          std::string("'w': the second moment is not positive "
                                                      "semi-definite: diagonal entry 2 is "
                                                      "negative (-0.5)")));
  a[2 * dim + 2] = 3.0;
  a[1 * dim + 3] = std::nan("");
  EXPECT_EQ(add(a.data()), std::make_pair(GIFT_ERROR_INVALID_ARGUMENT,
                                          std::string("'w': the second moment holds 1 non-finite "
                                                      "value, the first at (1, 3): its data has "
                                                      "NaN or Inf")));
}

// Fit parameters a C caller can get wrong: an oversample that made rank + oversample wrap
// (a subspace smaller than the rank, read out of bounds), a power iteration count of -1 (a
// loop without end), an infinite damping; and dampings whose whitener fp32 cannot hold, which
// the builder took and then wrote a basis its own reader refused.
TEST(Basis, BuilderRefusesFitParamsAndDampingsItCannotUse) {
  const uint32_t dim = 64;
  std::vector<double> a(dim * dim, 0.0);
  for (uint32_t k = 0; k < dim; ++k) a[k * dim + k] = 1.0 + k;
  const auto add = [&](giftFitParams fp, const double* damping = nullptr) {
    giftBasisBuilder* b = nullptr;
    giftResult_t r = giftBasisBuilderCreate(&fp, &b);
    if (r == GIFT_OK) {
      r = giftBasisBuilderAdd(b, "w", a.data(), dim, "activations", damping, damping ? 1 : 0,
                              nullptr, 0, nullptr, nullptr);
    }
    giftBasisBuilderFree(b);
    return std::make_pair(r, std::string(r ? giftGetLastErrorMessage() : ""));
  };
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = 4;
  fp.exact_max_dim = 8;  // the randomized fit
  EXPECT_EQ(add(fp).first, GIFT_OK);
  fp.oversample = 0xFFFFFFF0u;  // rank + oversample past 2^32: the exact fit, as past dim
  EXPECT_EQ(add(fp).first, GIFT_OK) << add(fp).second;
  fp.oversample = 10;
  fp.power_iterations = GIFT_FIT_MAX_POWER_ITERATIONS;
  EXPECT_EQ(add(fp).first, GIFT_OK);
  fp.power_iterations = UINT32_MAX;
  EXPECT_EQ(add(fp), std::make_pair(GIFT_ERROR_INVALID_ARGUMENT,
                                    std::string("power_iterations 4294967295 is above 64")));
  fp.power_iterations = 4;
  fp.damping = INFINITY;
  EXPECT_EQ(add(fp), std::make_pair(GIFT_ERROR_INVALID_ARGUMENT,
                                    std::string("damping inf is not a positive finite number")));
  fp.damping = 1e-3;
  for (const double huge : {1e300, 1e80}) {  // D's root or its inverse past fp32
    const auto r = add(fp, &huge);
    EXPECT_EQ(r.first, GIFT_ERROR_INVALID_ARGUMENT) << huge;
    EXPECT_NE(r.second.find("out of fp32's range"), std::string::npos) << r.second;
  }
  fp.damping_relative = 0;
  const double tiny = 1e-90;  // absolute: D = 1e-90 where A has no weight outside the rank
  std::fill(a.begin(), a.end(), 0.0);
  a[uint64_t(dim - 1) * dim + dim - 1] = 1.0;  // in the rank (a zero A is left out instead)
  const auto r = add(fp, &tiny);
  EXPECT_EQ(r.first, GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(r.second.find("D[0] = 1e-90 is out of fp32's range"), std::string::npos) << r.second;
  // A subnormal damping: the floor of D where A's weight is all in the rank made B overflow,
  // which LAPACK refused before D was checked ("whitener: QR failed", an internal error).
  for (uint32_t k = 0; k < dim; ++k) a[k * dim + k] = 1.0 + k;
  fp.damping_relative = 1;
  fp.damping = 1e-318;
  fp.exact_max_dim = dim;  // the exact fit: A's top diagonal entries leave a residual of 0
  const auto sub = add(fp);
  EXPECT_EQ(sub.first, GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(sub.second.find("is out of fp32's range"), std::string::npos) << sub.second;
}

// A basis whose contents match its id but break another rule of FORMAT.md 2.4.
TEST(Basis, ContentsThatBreakTheFormatAreRefusedByName) {
  struct Case {
    const char* what;
    void (*edit)(Whitener&);
    const char* message;
  };
  const Case cases[] = {
      {"NaN", [](Whitener& w) { w.c_inv[2] = std::nanf(""); },
       "b.giftb: 'a.weight#c_inv' holds a non-finite value"},
      {"Inf", [](Whitener& w) { w.d_sqrt[0] = INFINITY; },
       "b.giftb: 'a.weight#d_sqrt' holds a non-finite value"},
      {"short c", [](Whitener& w) { w.c.pop_back(); },
       "b.giftb: 'a.weight#c' is missing or not of shape [6]"},
      {"long d", [](Whitener& w) { w.d_rsqrt.push_back(1); },
       "b.giftb: 'a.weight#d_rsqrt' is missing or not of shape [48]"},
      {"rank > dim",
       [](Whitener& w) {
         w.dim = 2;
         w.v.resize(12);
         w.d_rsqrt.resize(2);
         w.d_sqrt.resize(2);
       },
       "b.giftb: 'a.weight#v' is not d_in x r with r <= d_in"},
  };
  for (const Case& c : cases) {
    Basis b = one_entry_basis();
    c.edit(b.entries[0].whitener);
    finish_basis(&b);
    std::vector<uint8_t> bytes;
    ASSERT_EQ(serialize_basis(b, 0, &bytes), GIFT_OK) << c.what;
    Basis back;
    EXPECT_EQ(parse_basis(bytes.data(), bytes.size(), "b.giftb", &back), GIFT_ERROR_CORRUPT_INPUT)
        << c.what;
    EXPECT_STREQ(giftGetLastErrorMessage(), c.message) << c.what;
  }
  // The metadata each whitener needs.
  std::vector<uint8_t> bytes;
  ASSERT_EQ(serialize_basis(one_entry_basis(), 0, &bytes), GIFT_OK);
  const std::vector<uint8_t> bare =
      gift::testing::edited(bytes, [](fb::FrameT& f) { f.metadata.pop_back(); });
  Basis back;
  EXPECT_EQ(parse_basis(bare.data(), bare.size(), "b.giftb", &back), GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_STREQ(giftGetLastErrorMessage(),
               "b.giftb: 'a.weight' lacks its #damping or #source metadata");
}

// The embedded basis must be the one Frame.basis_id names; decoding and verifying check it.
TEST(Basis, EmbeddedBasisMustMatchTheFramesBasisId) {
  const Basis b = one_entry_basis();
  std::vector<uint8_t> basis_bytes;
  ASSERT_EQ(serialize_basis(b, 0, &basis_bytes), GIFT_OK);
  for (const uint64_t flip : {uint64_t(0), uint64_t(1)}) {
    container::FrameWriter w;
    w.embed_basis(basis_bytes, b.id.lo ^ flip, b.id.hi);
    const std::vector<float> x(16, 1.0f);
    container::TensorShape shape;
    const uint64_t dims[] = {16};
    ASSERT_EQ(container::make_shape(dims, 1, &shape), GIFT_OK);
    ASSERT_EQ(w.add_tensor("bias", shape, GIFT_DTYPE_F32, x.data(), nullptr), GIFT_OK);
    std::vector<uint8_t> frame;
    ASSERT_EQ(w.finish(&frame), GIFT_OK);
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpen(frame.data(), frame.size(), &f), GIFT_OK);
    if (flip) {
      EXPECT_EQ(giftFrameVerify(f), GIFT_ERROR_FIELD_INVALID);
      EXPECT_STREQ(giftGetLastErrorMessage(),
                   ("frame: embedded basis has id " + b.id.hex() + ", the frame's basis_id says " +
                    BasisId{b.id.lo ^ 1, b.id.hi}.hex())
                       .c_str());
    } else {
      EXPECT_EQ(giftFrameVerify(f), GIFT_OK) << giftGetLastErrorMessage();
    }
    giftFrameClose(f);
  }
}

}  // namespace
}  // namespace gift::coords
