#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gift/gift.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace {

TEST(Metrics, HandComputedValues) {
  const std::vector<float> ref = {3, 4}, approx = {3, 5};
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 1, 2, nullptr, &m), GIFT_OK);
  EXPECT_DOUBLE_EQ(m.rel_l2, 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(m.cosine, (9.0 + 20.0) / (5.0 * std::sqrt(34.0)));
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(m.bias, 0.5);
  EXPECT_EQ(m.rel_anorm, -1.0);
}

TEST(Metrics, ANormWithIdentityIsL2AndWithDiagonalIsWeighted) {
  const uint64_t rows = 7, cols = 5;
  std::mt19937 gen(1);
  std::normal_distribution<float> n;
  std::vector<float> ref(rows * cols), approx(rows * cols), eye(cols * cols, 0.0f),
      diag(cols * cols, 0.0f);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = n(gen);
    approx[i] = ref[i] + 0.1f * n(gen);
  }
  const float d[5] = {1, 4, 9, 0.25f, 2};
  for (uint64_t i = 0; i < cols; ++i) {
    eye[i * cols + i] = 1;
    diag[i * cols + i] = d[i];
  }
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), rows, cols, eye.data(), &m),
            GIFT_OK);
  EXPECT_NEAR(m.rel_anorm, m.rel_l2, 1e-6 * m.rel_l2);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), rows, cols, diag.data(), &m),
            GIFT_OK);
  double num = 0, den = 0;
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c) {
      const double e = double(approx[r * cols + c]) - ref[r * cols + c];
      num += d[c] * e * e;
      den += d[c] * double(ref[r * cols + c]) * ref[r * cols + c];
    }
  EXPECT_NEAR(m.rel_anorm, std::sqrt(num / den), 1e-5 * m.rel_anorm);
}

TEST(Metrics, MergedHalvesEqualTheWhole) {
  std::mt19937 gen(9);
  std::normal_distribution<float> n;
  std::vector<float> ref(600), approx(600);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = n(gen);
    approx[i] = ref[i] + 0.05f * n(gen) + 0.01f;
  }
  giftErrorMetrics whole = GIFT_ERROR_METRICS_INIT, a = whole, b = whole, total = whole;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 1, 600, nullptr, &whole), GIFT_OK);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 1, 250, nullptr, &a), GIFT_OK);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data() + 250, approx.data() + 250, 7, 50, nullptr, &b),
            GIFT_OK);
  giftErrorMetricsMerge(&total, &a);
  giftErrorMetricsMerge(&total, &b);
  EXPECT_NEAR(total.rel_l2, whole.rel_l2, 1e-12);
  EXPECT_NEAR(total.cosine, whole.cosine, 1e-12);
  EXPECT_NEAR(total.bias, whole.bias, 1e-12);
  EXPECT_EQ(total.max_abs, whole.max_abs);
  EXPECT_EQ(total.count, 600u);
}

TEST(Metrics, MergedANormCoversThePartsMeasuredWithA) {
  std::mt19937 gen(10);
  std::normal_distribution<float> n;
  const uint32_t rows = 12, cols = 20;
  std::vector<float> ref(rows * cols), approx(rows * cols), m(cols * cols), a(cols * cols, 0.0f);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = n(gen);
    approx[i] = ref[i] + 0.1f * n(gen);
  }
  for (float& x : m) x = n(gen);
  for (uint32_t i = 0; i < cols; ++i) {  // A = M M^T, positive semi-definite
    for (uint32_t j = 0; j < cols; ++j) {
      for (uint32_t k = 0; k < cols; ++k) a[i * cols + j] += m[i * cols + k] * m[j * cols + k];
    }
  }
  giftErrorMetrics whole = GIFT_ERROR_METRICS_INIT, top = whole, bottom = whole, plain = whole,
                   total = whole;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), rows, cols, a.data(), &whole),
            GIFT_OK);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 5, cols, a.data(), &top), GIFT_OK);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data() + 5 * cols, approx.data() + 5 * cols, 7, cols,
                                    a.data(), &bottom),
            GIFT_OK);
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), rows, cols, nullptr, &plain),
            GIFT_OK);
  giftErrorMetricsMerge(&total, &plain);
  EXPECT_EQ(total.rel_anorm, -1.0);  // no part had an A yet
  giftErrorMetricsMerge(&total, &top);
  giftErrorMetricsMerge(&total, &bottom);
  EXPECT_NEAR(total.rel_anorm, whole.rel_anorm, 1e-6 * whole.rel_anorm);
  EXPECT_NE(total.rel_anorm, top.rel_anorm);
}

// An A that is not positive semi-definite gives an A-norm that means nothing: refused, saying
// why, where it returned rel_anorm 0 (a negative norm squared of the reference) or a plausible
// number. A singular semi-definite A, whose norms of some rows are zero up to rounding, is not.
TEST(Metrics, RefusesAnANormOfAnAThatIsNotSemiDefinite) {
  const uint32_t rows = 3, cols = 4;
  const std::vector<float> ref = {1, 1, 0, 0, 0.5f, 0.5f, 0, 0, 2, 2, 1, 0};
  std::vector<float> approx(ref);
  for (float& x : approx) x *= 1.01f;
  const auto run = [&](const std::vector<float>& a) {
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
    const giftResult_t r =
        giftComputeErrorMetrics(ref.data(), approx.data(), rows, cols, a.data(), &m);
    return std::make_tuple(r, std::string(r ? giftGetLastErrorMessage() : ""), m.rel_anorm);
  };
  // Eigenvalues 1 +- 4 on the first two coordinates, where the rows are (t, t): their norms
  // squared are t^2 (1 + 1 - 8), negative; the diagonal part, sum of a_kk x_k^2, is
  // 2 + 0.5 + 9 (the third row's 1 on coordinate 2).
  std::vector<float> a(cols * cols, 0.0f);
  a[0] = a[cols + 1] = 1.0f;
  a[1] = a[cols] = -4.0f;
  a[2 * cols + 2] = a[3 * cols + 3] = 1.0f;
  EXPECT_EQ(std::get<0>(run(a)), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::get<1>(run(a)),
            "giftComputeErrorMetrics: A is not positive semi-definite: the A-norm squared of the "
            "reference is negative (-30.5, its diagonal part 11.5)");
  // The same A made semi-definite but singular (eigenvalues 2 and 0 there): accepted, and
  // the norms are those of the quadratic forms computed here in double.
  a[1] = a[cols] = 1.0f;
  const auto [ok, none, singular] = run(a);
  EXPECT_EQ(ok, GIFT_OK) << none;
  double num = 0, den = 0;
  for (uint32_t i = 0; i < rows; ++i) {
    for (uint32_t j = 0; j < cols; ++j) {
      for (uint32_t k = 0; k < cols; ++k) {
        const double e_j = double(approx[i * cols + j]) - ref[i * cols + j];
        const double e_k = double(approx[i * cols + k]) - ref[i * cols + k];
        num += e_j * a[j * cols + k] * e_k;
        den += double(ref[i * cols + j]) * a[j * cols + k] * ref[i * cols + k];
      }
    }
  }
  EXPECT_NEAR(singular, std::sqrt(num / den), 1e-6 * std::sqrt(num / den));
  // The checks that need no data: a negative diagonal entry, a non-finite entry.
  a[2 * cols + 2] = -1.0f;
  EXPECT_EQ(std::get<1>(run(a)),
            "giftComputeErrorMetrics: A is not positive semi-definite: diagonal entry 2 is "
            "negative (-1)");
  a[2 * cols + 2] = 1.0f;
  a[3 * cols + 1] = NAN;
  EXPECT_EQ(std::get<1>(run(a)), "giftComputeErrorMetrics: A holds a non-finite value at (3, 1)");
}

// A round trip equal to its reference has cosine 1 exactly, and no pair has a cosine past 1:
// the rounded sums can put the ratio an ulp or two above it (seen: 1.0000000000000033).
TEST(Metrics, CosineStaysWithinOne) {
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int above = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> ref(1 + gen() % 3000), near(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = nd(gen) * std::ldexp(1.0f, int(gen() % 40) - 20);
      near[i] = ref[i] * (1.0f + 0x1p-23f * float(int(gen() % 3) - 1));
    }
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
    ASSERT_EQ(giftComputeErrorMetrics(ref.data(), ref.data(), 1, ref.size(), nullptr, &m), GIFT_OK);
    EXPECT_EQ(m.cosine, 1.0) << trial;
    ASSERT_EQ(giftComputeErrorMetrics(ref.data(), near.data(), 1, ref.size(), nullptr, &m),
              GIFT_OK);
    EXPECT_LE(m.cosine, 1.0) << trial;
    above += m.sum_dot / std::sqrt(m.sum_ref_sq * m.sum_approx_sq) > 1.0;
  }
  EXPECT_GT(above, 0) << "no trial put the unclamped ratio above 1: the test checks nothing";
}

// The caller's rounding mode, and on x86 flush-to-zero and denormals-are-zero, change no bit
// of the metrics (subnormal values included), nor of their merge.
TEST(Metrics, SameWhateverTheCallersFloatingPointEnvironment) {
  std::mt19937 gen(12);
  std::normal_distribution<float> nd;
  std::vector<float> ref(10007), approx(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = std::ldexp(nd(gen), int(gen() % 60) - 140);
    approx[i] = ref[i] * (1 + 0.01f * nd(gen)) + std::ldexp(nd(gen), -130);
  }
  const auto metrics = [&] {
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT, total = GIFT_ERROR_METRICS_INIT;
    EXPECT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 1, ref.size(), nullptr, &m),
              GIFT_OK);
    EXPECT_EQ(giftErrorMetricsMerge(&total, &m), GIFT_OK);
    EXPECT_EQ(giftErrorMetricsMerge(&total, &m), GIFT_OK);
    return std::vector<double>{m.rel_l2,  m.cosine,     m.max_abs,    m.bias,     m.sum_ref_sq,
                               m.sum_err, total.rel_l2, total.cosine, total.bias, total.sum_ref_sq};
  };
  const std::vector<double> want = metrics();
  for (const int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    const std::vector<double> got = metrics();
    std::fesetround(FE_TONEAREST);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)), 0) << mode;
  }
#if defined(__SSE2__)
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // flush-to-zero and denormals-are-zero
  const std::vector<double> got = metrics();
  _mm_setcsr(saved);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)), 0);
#endif
}

TEST(Metrics, ZeroReferenceIsDefined) {
  const std::vector<float> z = {0, 0, 0};
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftComputeErrorMetrics(z.data(), z.data(), 1, 3, nullptr, &m), GIFT_OK);
  EXPECT_EQ(m.rel_l2, 0.0);
  EXPECT_EQ(m.cosine, 1.0);
  EXPECT_EQ(giftComputeErrorMetrics(nullptr, z.data(), 1, 3, nullptr, &m),
            GIFT_ERROR_INVALID_ARGUMENT);
}

TEST(Metrics, NonFinitePairsAreLeftOutAndCounted) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float ref[] = {1, nan, 3, 4, inf}, approx[] = {2, 5, nan, 4, 1};
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftComputeErrorMetrics(ref, approx, 1, 5, nullptr, &m), GIFT_OK);
  EXPECT_EQ(m.nonfinite, 3u);
  EXPECT_EQ(m.count, 2u);
  // Over the pairs (1, 2) and (4, 4): ||e|| = 1, ||ref|| = sqrt(17).
  EXPECT_DOUBLE_EQ(m.rel_l2, 1.0 / std::sqrt(17.0));
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  giftErrorMetrics total = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftErrorMetricsMerge(&total, &m), GIFT_OK);
  ASSERT_EQ(giftErrorMetricsMerge(&total, &m), GIFT_OK);
  EXPECT_EQ(total.nonfinite, 6u);
  EXPECT_DOUBLE_EQ(total.rel_l2, m.rel_l2);
}

}  // namespace
