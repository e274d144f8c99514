// The 16-bit float rules against the compiler's _Float16 conversions and a two-candidate
// nearest-even search for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "numerics/elementwise.h"

namespace gift::num {
namespace {

uint16_t half_bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

TEST(Float16, WideningMatchesTheCompilerForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    _Float16 h;
    const uint16_t b16 = static_cast<uint16_t>(b);
    std::memcpy(&h, &b16, 2);
    const float want = static_cast<float>(h), got = f16_to_float(b16);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << b;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << b;
    }
  }
}

// Samples every fp32 exponent and sign with 2^12 mantissa patterns each, all low bits set
// to values that hit ties and near-ties of both 16-bit formats.
template <typename F>
void for_sampled_floats(F&& f) {
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    for (uint32_t lo : {0x000u, 0x001u, 0x7FFu, 0x800u, 0x801u, 0xFFFu}) {
      f(float_of((hi << 12) | lo));
    }
  }
}

TEST(Float16, NarrowingMatchesTheCompiler) {
  for_sampled_floats([](float x) {
    const uint16_t want = half_bits(static_cast<_Float16>(x)), got = f16_from_float(x);
    if (std::isnan(x)) {
      ASSERT_EQ(got & 0x7E00, 0x7E00) << x;
    } else {
      ASSERT_EQ(got, want) << "x bits " << std::hex << bits_of(x);
    }
  });
}

TEST(Bfloat16, NarrowingIsNearestEven) {
  for_sampled_floats([](float x) {
    const uint16_t got = bf16_from_float(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(got)));
      return;
    }
    if (std::isinf(x)) {
      ASSERT_EQ(got, bits_of(x) >> 16);
      return;
    }
    // Candidates: truncation and the next pattern up in magnitude, where Inf stands for
    // 2^128 (IEEE rounds as if the exponent were unbounded, then overflows).
    const uint16_t t = static_cast<uint16_t>(bits_of(x) >> 16);
    const double a = bf16_to_float(t);
    const double up = bf16_to_float(static_cast<uint16_t>(t + 1));
    const double b = std::isinf(up) ? std::copysign(std::ldexp(1.0, 128), up) : up;
    const double da = std::fabs(double(x) - a), db = std::fabs(double(x) - b);
    const uint16_t want =
        (da < db || (da == db && (t & 1) == 0)) ? t : static_cast<uint16_t>(t + 1);
    ASSERT_EQ(got, want) << "x bits " << std::hex << bits_of(x);
  });
}

}  // namespace
}  // namespace gift::num
