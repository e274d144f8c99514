// The per-element rules of elementwise.h against references built from the definitions
// (value = (-1)^s 2^(e-bias) (1 + m/2^M), nearest with ties to even), not from the code.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "numerics/elementwise.h"

namespace gift::num {
namespace {

struct KindInfo {
  Fp8 kind;
  int mant_bits, bias;
  double max;
};
const KindInfo kE4M3{Fp8::kE4M3, 3, 7, 448.0};
const KindInfo kE5M2{Fp8::kE5M2, 2, 15, 57344.0};

// Value of a code by the definition; NaN for NaN codes, +-Inf for E5M2 infinities.
double definition_value(const KindInfo& k, int code) {
  const int sign = code >> 7, mag = code & 0x7F;
  const int exp = mag >> k.mant_bits, man = mag & ((1 << k.mant_bits) - 1);
  const int exp_all_ones = (1 << (7 - k.mant_bits)) - 1;
  double v;
  if (k.kind == Fp8::kE4M3 && mag == 0x7F) return std::nan("");
  if (k.kind == Fp8::kE5M2 && exp == exp_all_ones) {
    if (man) return std::nan("");
    v = INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(man, 1 - k.bias - k.mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(man, -k.mant_bits), exp - k.bias);
  }
  return sign ? -v : v;
}

float to_float(const KindInfo& k, uint8_t c) {
  return k.kind == Fp8::kE4M3 ? fp8_to_float<Fp8::kE4M3>(c) : fp8_to_float<Fp8::kE5M2>(c);
}
uint8_t rn(const KindInfo& k, float x) {
  return k.kind == Fp8::kE4M3 ? fp8_from_float_rn<Fp8::kE4M3>(x) : fp8_from_float_rn<Fp8::kE5M2>(x);
}
uint8_t sr(const KindInfo& k, float x, uint32_t r) {
  return k.kind == Fp8::kE4M3 ? fp8_from_float_sr<Fp8::kE4M3>(x, r)
                              : fp8_from_float_sr<Fp8::kE5M2>(x, r);
}

// Round to nearest, ties to the even code, saturating: a search over all finite codes.
uint8_t reference_rn(const KindInfo& k, float x) {
  if (std::isnan(x)) return kNanCode;
  const double ax = std::fabs(double(x));
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (ax >= k.max) return static_cast<uint8_t>((k.kind == Fp8::kE4M3 ? 0x7E : 0x7B) | sign);
  int best = 0;
  for (int c = 1; c < 0x80; ++c) {
    const double v = definition_value(k, c);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - ax), db = std::fabs(definition_value(k, best) - ax);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | sign);
}

class Fp8Rules : public ::testing::TestWithParam<KindInfo> {};

TEST_P(Fp8Rules, DecodeAll256CodesExactly) {
  const KindInfo& k = GetParam();
  for (int c = 0; c < 256; ++c) {
    const double want = definition_value(k, c);
    const float got = to_float(k, static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(double(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << "code " << c;
  }
}

TEST_P(Fp8Rules, EveryCodeRoundTripsThroughEncode) {
  const KindInfo& k = GetParam();
  for (int c = 0; c < 256; ++c) {
    const float v = to_float(k, static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    EXPECT_EQ(rn(k, v), c) << "code " << c;
  }
}

TEST_P(Fp8Rules, NearestEvenMatchesSearchOnBoundariesAndRandomValues) {
  const KindInfo& k = GetParam();
  std::vector<float> xs;
  // Every midpoint between neighbouring codes, and the floats just around it.
  for (int c = 0; c < 0x7F; ++c) {
    const double a = definition_value(k, c), b = definition_value(k, c + 1);
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const float mid = float((a + b) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), float(a)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> log_mag(-30, 20);
  for (int i = 0; i < 200000; ++i) {
    const float x = float(std::exp2(log_mag(gen)));
    xs.push_back(i & 1 ? -x : x);
  }
  for (float x : {0.0f, -0.0f, 1e-45f, 1e30f, -1e30f, std::numeric_limits<float>::max()}) {
    xs.push_back(x);
  }
  for (float x : xs) ASSERT_EQ(rn(k, x), reference_rn(k, x)) << "x = " << x;
}

TEST_P(Fp8Rules, SaturatesInfinityAndMapsNanToOneCode) {
  const KindInfo& k = GetParam();
  const uint8_t max_code = k.kind == Fp8::kE4M3 ? 0x7E : 0x7B;
  EXPECT_EQ(rn(k, INFINITY), max_code);
  EXPECT_EQ(rn(k, -INFINITY), max_code | 0x80);
  EXPECT_EQ(rn(k, std::nanf("")), kNanCode);
  EXPECT_EQ(rn(k, -std::nanf("")), kNanCode);
  EXPECT_EQ(double(to_float(k, max_code)), k.max);
}

// The two FP8 neighbours of |x| (lo <= |x| <= hi) as magnitudes.
void neighbours(const KindInfo& k, float x, double* lo, double* hi) {
  const double ax = std::fabs(double(x));
  *lo = 0;
  *hi = k.max;
  for (int c = 0; c < 0x7F; ++c) {
    const double v = definition_value(k, c);
    if (!std::isfinite(v)) continue;
    if (v <= ax && v > *lo) *lo = v;
    if (v >= ax && v < *hi) *hi = v;
  }
}

TEST_P(Fp8Rules, StochasticRoundingPicksANeighbour) {
  const KindInfo& k = GetParam();
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> log_mag(-22, 16);
  for (int i = 0; i < 20000; ++i) {
    const float x = float(std::exp2(log_mag(gen))) * (i & 1 ? -1.0f : 1.0f);
    if (std::fabs(x) > k.max) continue;
    double lo, hi;
    neighbours(k, x, &lo, &hi);
    const double got = std::fabs(double(to_float(k, sr(k, x, uint32_t(gen())))));
    ASSERT_TRUE(got == lo || got == hi) << "x = " << x << " got " << got;
    // The extreme random words pick the ends.
    EXPECT_EQ(std::fabs(double(to_float(k, sr(k, x, 0xFFFFFFFFu)))), lo) << x;
    if (double(std::fabs(x)) != lo) {
      EXPECT_EQ(std::fabs(double(to_float(k, sr(k, x, 0)))), hi) << x;
    }
  }
  const uint8_t max_code = k.kind == Fp8::kE4M3 ? 0x7E : 0x7B;
  EXPECT_EQ(sr(k, float(k.max) * 1.01f, 0), max_code);
  EXPECT_EQ(sr(k, -INFINITY, 0), max_code | 0x80);
  EXPECT_EQ(sr(k, std::nanf(""), 0), kNanCode);
}

// Unbiasedness: with N independent uniforms each sample is lo or hi, so by Hoeffding
// P(|mean - E| >= t) <= 2 exp(-2 N t^2 / (hi - lo)^2). With t = 4 (hi - lo) / sqrt(N) that
// is 2e-14; E itself differs from |x| by less than 2^-32 (hi - lo) (the probability is
// quantized to 2^-32). The generator is deterministic, so this cannot flake.
TEST_P(Fp8Rules, StochasticRoundingIsUnbiased) {
  const KindInfo& k = GetParam();
  constexpr int kN = 40000;
  const double subnormal_step = std::ldexp(1.0, 1 - k.bias - k.mant_bits);
  const std::vector<double> xs = {1.3,
                                  0.7,
                                  3.14159,
                                  -2.71828,
                                  100.5,
                                  k.max * 0.99,
                                  subnormal_step * 0.3,
                                  subnormal_step * 5.77,
                                  subnormal_step * 1e-3,
                                  -subnormal_step * 2.5};
  for (size_t t = 0; t < xs.size(); ++t) {
    const float x = float(xs[t]);
    double lo, hi;
    neighbours(k, x, &lo, &hi);
    double sum = 0;
    for (int i = 0; i < kN; ++i) {
      const uint32_t r = sr_uniforms(0x9E3779B97F4A7C15ull + uint64_t(i), uint32_t(t), 0).v[0];
      sum += to_float(k, sr(k, x, r));
    }
    const double mean = sum / kN;
    // Far below the step the bound above says little; count the round-ups instead: their
    // number is binomial(N, |x| / step), within 5 standard deviations of its mean.
    if (double(std::fabs(x)) < lo + 0.01 * (hi - lo)) {
      const double p = (double(std::fabs(x)) - lo) / (hi - lo);
      const double ups = std::fabs(mean - lo * (x < 0 ? -1 : 1)) / (hi - lo) * kN;
      EXPECT_NEAR(ups, p * kN, 5 * std::sqrt(kN * p * (1 - p)) + 1) << "x = " << x;
    }
    const double bound = 4 * (hi - lo) / std::sqrt(double(kN)) + std::ldexp(hi - lo, -32);
    EXPECT_NEAR(mean, double(x), bound) << "x = " << x;
    // Round to nearest would be off by up to (hi - lo) / 2; this bound is far tighter.
    if (double(std::fabs(x)) - lo > 0.2 * (hi - lo) &&
        hi - double(std::fabs(x)) > 0.2 * (hi - lo)) {
      EXPECT_LT(bound, 0.2 * (hi - lo));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, Fp8Rules, ::testing::Values(kE4M3, kE5M2), [](const auto& info) {
  return std::string(info.param.kind == Fp8::kE4M3 ? "E4M3" : "E5M2");
});

TEST(Philox, KnownAnswerVectorsOfRandom123) {
  const U32x4 z = philox4x32_10(U32x4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  const U32x4 f = philox4x32_10(U32x4{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[1], 0x41c83b0eu);
  EXPECT_EQ(f.v[2], 0xa20bc7c6u);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
  const U32x4 p = philox4x32_10(U32x4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(p.v[0], 0xd16cfe09u);
  EXPECT_EQ(p.v[1], 0x94fdccebu);
  EXPECT_EQ(p.v[2], 0x5001e420u);
  EXPECT_EQ(p.v[3], 0x24126ea1u);
}

TEST(Philox, StreamLayoutFollowsTheSpec) {
  // key = (seed low, seed high), counter = (j low, j high, tensor, 0).
  const uint64_t seed = 0x0123456789ABCDEFull, j = 0x500000007ull;
  const U32x4 a = sr_uniforms(seed, 9, j);
  const U32x4 b = philox4x32_10(U32x4{{7u, 5u, 9u, 0u}}, 0x89ABCDEFu, 0x01234567u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.v[i], b.v[i]);
}

double reference_log2_floor(float a) {
  int e;
  std::frexp(double(a), &e);
  return e - 1;
}

TEST(Scales, E8M0IsTheOcpMxExponent) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> log_mag(-149, 128);
  for (const KindInfo& k : {kE4M3, kE5M2}) {
    const int emax = k.kind == Fp8::kE4M3 ? 8 : 15;
    for (int i = 0; i < 100000; ++i) {
      const float a = float(std::exp2(log_mag(gen)));
      if (!(a > 0) || !std::isfinite(a)) continue;
      const double e = std::clamp(reference_log2_floor(a) - emax, -127.0, 127.0);
      const uint8_t b = scale_e8m0(a, k.kind);
      ASSERT_EQ(int(b), int(e) + 127) << a;
      ASSERT_EQ(double(e8m0_to_float(b)), std::ldexp(1.0, int(e)));
      ASSERT_EQ(double(e8m0_reciprocal(b)), std::ldexp(1.0, -int(e)));
    }
    EXPECT_EQ(scale_e8m0(0.0f, k.kind), 0);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

TEST(Scales, Fp32ScaleIsAmaxOverMax) {
  EXPECT_EQ(scale_f32(448.0f, Fp8::kE4M3), 1.0f);
  EXPECT_EQ(scale_f32(57344.0f * 4, Fp8::kE5M2), 4.0f);
  EXPECT_EQ(scale_f32(1.0f, Fp8::kE4M3), 1.0f / 448.0f);
}

}  // namespace
}  // namespace gift::num
