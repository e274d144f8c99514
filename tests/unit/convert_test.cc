// giftConvert through the public header only, against references that share no code with
// the library: a bit shift for bf16, the compiler's _Float16 for fp16, and a two-candidate
// nearest-even search for narrowing to bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "gift/gift.h"
#include "unit/compiler_half.h"

namespace {

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float half_value(uint16_t b) { return compiler_half_value(b); }
uint16_t half_bits(float x) { return compiler_half_bits(x); }

// bf16 nearest to x (ties to the even pattern), from the two bf16 values around it.
uint16_t bf16_reference(float x) {
  const uint32_t u = bits_of(x);
  if (std::isinf(x)) return uint16_t(u >> 16);
  const uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);
  const double dlo = std::fabs(double(x) - double(float_of(uint32_t(lo) << 16)));
  // Past the largest finite bf16, the next step up is 2^128: rounding there gives Inf.
  const double vhi = (hi & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0, 128), double(x))
                                             : double(float_of(uint32_t(hi) << 16));
  const double dhi = std::fabs(double(x) - vhi);
  if (dlo != dhi) return dlo < dhi ? lo : hi;
  return (lo & 1) ? hi : lo;
}

std::vector<uint16_t> all_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t b = 0; b < 65536; ++b) v[b] = uint16_t(b);
  return v;
}

std::vector<float> convert_to_f32(const std::vector<uint16_t>& in, giftDType_t from) {
  std::vector<float> out(in.size());
  EXPECT_EQ(giftConvert(in.data(), from, out.data(), GIFT_DTYPE_F32, in.size()), GIFT_OK);
  return out;
}

std::vector<uint16_t> narrow(const std::vector<float>& in, giftDType_t to) {
  std::vector<uint16_t> out(in.size());
  EXPECT_EQ(giftConvert(in.data(), GIFT_DTYPE_F32, out.data(), to, in.size()), GIFT_OK);
  return out;
}

TEST(Convert, Bf16WideningIsAShiftForAll65536Patterns) {
  const std::vector<uint16_t> in = all_patterns();
  const std::vector<float> out = convert_to_f32(in, GIFT_DTYPE_BF16);
  for (uint32_t b = 0; b < 65536; ++b) ASSERT_EQ(bits_of(out[b]), b << 16) << b;
}

TEST(Convert, F16WideningMatchesTheCompilerForAll65536Patterns) {
  GIFT_SKIP_WITHOUT_FLOAT16();
  const std::vector<uint16_t> in = all_patterns();
  const std::vector<float> out = convert_to_f32(in, GIFT_DTYPE_F16);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float want = half_value(uint16_t(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(out[b])) << b;
      ASSERT_EQ(bits_of(out[b]) >> 31, b >> 15) << b;
    } else {
      ASSERT_EQ(bits_of(out[b]), bits_of(want)) << b;
    }
  }
}

// Widening is exact, so narrowing back gives every non-NaN pattern back.
TEST(Convert, NarrowingInvertsWidening) {
  for (giftDType_t d : {GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
    const std::vector<uint16_t> in = all_patterns();
    const std::vector<uint16_t> back = narrow(convert_to_f32(in, d), d);
    for (uint32_t b = 0; b < 65536; ++b) {
      const bool nan = d == GIFT_DTYPE_BF16 ? (b & 0x7FFF) > 0x7F80 : (b & 0x7FFF) > 0x7C00;
      if (!nan) {
        ASSERT_EQ(back[b], b) << d << " " << b;
      }
    }
  }
}

// Every fp32 sign and exponent with mantissas whose low bits are ties and near-ties of both
// 16-bit formats.
std::vector<float> sampled_floats() {
  std::vector<float> v;
  for (uint32_t hi = 0; hi < (1u << 20); hi += 3) {
    for (uint32_t lo : {0x000u, 0x001u, 0x7FFu, 0x800u, 0x801u, 0xFFFu}) {
      v.push_back(float_of((hi << 12) | lo));
    }
  }
  return v;
}

TEST(Convert, NarrowingToF16MatchesTheCompiler) {
  GIFT_SKIP_WITHOUT_FLOAT16();
  const std::vector<float> in = sampled_floats();
  const std::vector<uint16_t> out = narrow(in, GIFT_DTYPE_F16);
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      ASSERT_EQ(out[i] & 0x7E00, 0x7E00) << i;  // a quiet NaN
    } else {
      ASSERT_EQ(out[i], half_bits(in[i])) << std::hex << bits_of(in[i]);
    }
  }
}

TEST(Convert, NarrowingToBf16IsNearestEven) {
  const std::vector<float> in = sampled_floats();
  const std::vector<uint16_t> out = narrow(in, GIFT_DTYPE_BF16);
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      ASSERT_EQ(out[i] & 0x7FC0, 0x7FC0) << i;  // a quiet NaN
    } else {
      ASSERT_EQ(out[i], bf16_reference(in[i])) << std::hex << bits_of(in[i]);
    }
  }
}

TEST(Convert, BetweenBf16AndF16RoundsOnceForAll65536Patterns) {
  GIFT_SKIP_WITHOUT_FLOAT16();
  const std::vector<uint16_t> in = all_patterns();
  std::vector<uint16_t> to_f16(in.size()), to_bf16(in.size());
  ASSERT_EQ(giftConvert(in.data(), GIFT_DTYPE_BF16, to_f16.data(), GIFT_DTYPE_F16, in.size()),
            GIFT_OK);
  ASSERT_EQ(giftConvert(in.data(), GIFT_DTYPE_F16, to_bf16.data(), GIFT_DTYPE_BF16, in.size()),
            GIFT_OK);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float bf = float_of(b << 16), h = half_value(uint16_t(b));
    if (std::isnan(bf)) {
      ASSERT_EQ(to_f16[b] & 0x7E00, 0x7E00) << b;
    } else {
      ASSERT_EQ(to_f16[b], half_bits(bf)) << b;
    }
    if (std::isnan(h)) {
      ASSERT_EQ(to_bf16[b] & 0x7FC0, 0x7FC0) << b;
    } else {
      ASSERT_EQ(to_bf16[b], bf16_reference(h)) << b;
    }
  }
}

struct Case {
  uint32_t in;
  uint16_t want;
};

void expect_narrowing(giftDType_t to, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    const float x = float_of(c.in);
    uint16_t got = 0;
    ASSERT_EQ(giftConvert(&x, GIFT_DTYPE_F32, &got, to, 1), GIFT_OK);
    EXPECT_EQ(got, c.want) << std::hex << "input 0x" << c.in;
  }
}

TEST(Convert, Bf16EdgeCases) {
  expect_narrowing(GIFT_DTYPE_BF16,
                   {
                       {0x3F808000, 0x3F80},  // 1 + 2^-8: tie, down to the even 1.0
                       {0x3F818000, 0x3F82},  // tie, up to the even neighbour
                       {0x3F808001, 0x3F81},  // just past the tie
                       {0x7F7F7FFF, 0x7F7F},  // below the tie at the top: largest finite
                       {0x7F7F8000, 0x7F80},  // tie at the top: Inf
                       {0xFF7FFFFF, 0xFF80},  // -FLT_MAX: -Inf
                       {0x7F800000, 0x7F80},  // Inf
                       {0x7FC00000, 0x7FC0},  // quiet NaN
                       {0x7F800001, 0x7FC0},  // signalling NaN comes out quiet
                       {0xFF800001, 0xFFC0},  // and keeps its sign
                       {0x00010000, 0x0001},  // fp32 subnormal, exact in bf16
                       {0x00008000, 0x0000},  // half the smallest bf16 subnormal: tie to 0
                       {0x00018000, 0x0002},  // tie to the even subnormal
                       {0x80000000, 0x8000},  // -0
                   });
}

TEST(Convert, F16EdgeCases) {
  expect_narrowing(GIFT_DTYPE_F16,
                   {
                       {0x3F801000, 0x3C00},  // 1 + 2^-11: tie, down to the even 1.0
                       {0x3F803000, 0x3C02},  // tie, up to the even neighbour
                       {0x477FE000, 0x7BFF},  // 65504, the largest finite
                       {0x477FEFFF, 0x7BFF},  // just below the tie at the top
                       {0x477FF000, 0x7C00},  // 65520, the tie at the top: Inf
                       {0xC77FF000, 0xFC00},  // -65520: -Inf
                       {0x4E6E6B28, 0x7C00},  // 1e9
                       {0x33800000, 0x0001},  // 2^-24, the smallest subnormal
                       {0x33000000, 0x0000},  // 2^-25: tie to 0
                       {0x33000001, 0x0001},  // just past it
                       {0x33C00000, 0x0002},  // 3 * 2^-25: tie to the even subnormal
                       {0x387FE000, 0x0400},  // 2^-14 - 2^-25: tie into the normals
                       {0xB2800000, 0x8000},  // -2^-26: -0
                       {0x7FC00000, 0x7E00},  // quiet NaN
                       {0x7F800001, 0x7E00},  // signalling NaN comes out quiet
                       {0xFFC00000, 0xFE00},  // and keeps its sign
                   });
}

#if defined(__SSE2__)
// Narrowing to fp16 subnormals rounds in float arithmetic, which must not follow a caller's
// rounding mode (here toward zero, with flush-to-zero and denormals-are-zero).
TEST(Convert, IgnoresTheCallersFloatingPointEnvironment) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0xE040u);
  const float x = float_of(0x33C00000);  // 3 * 2^-25: a tie, to even 2 * 2^-24
  const uint16_t h = 0x0001;             // 2^-24
  uint16_t narrowed = 0;
  float widened = 0;
  const giftResult_t r1 = giftConvert(&x, GIFT_DTYPE_F32, &narrowed, GIFT_DTYPE_F16, 1);
  const giftResult_t r2 = giftConvert(&h, GIFT_DTYPE_F16, &widened, GIFT_DTYPE_F32, 1);
  const unsigned during = _mm_getcsr();
  _mm_setcsr(saved);
  ASSERT_EQ(r1, GIFT_OK);
  ASSERT_EQ(r2, GIFT_OK);
  EXPECT_EQ(narrowed, 0x0002);
  EXPECT_EQ(bits_of(widened), 0x33800000u);
  EXPECT_EQ(during & 0xE040u, 0xE040u);  // and is given it back
}
#endif

TEST(Convert, UnalignedBuffersAndInPlaceCopy) {
  alignas(4) uint8_t src[1 + 3 * 2] = {0, 0x80, 0x3F, 0x00, 0xC0, 0x80, 0x7F};  // bf16 1, -2, Inf
  alignas(4) uint8_t dst[1 + 3 * 4] = {};
  ASSERT_EQ(giftConvert(src + 1, GIFT_DTYPE_BF16, dst + 1, GIFT_DTYPE_F32, 3), GIFT_OK);
  float f[3];
  std::memcpy(f, dst + 1, sizeof f);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(f[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, f, GIFT_DTYPE_F32, 3), GIFT_OK);
  EXPECT_EQ(f[1], -2.0f);
}

TEST(Convert, RefusesBadArguments) {
  float f[4] = {};
  uint16_t h[4] = {};
  EXPECT_EQ(giftConvert(f, giftDType_t(7), h, GIFT_DTYPE_F16, 4), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "unknown dtype 7");
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, h, giftDType_t(-1), 4), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftConvert(nullptr, GIFT_DTYPE_F32, h, GIFT_DTYPE_F16, 4),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, nullptr, GIFT_DTYPE_F16, 4),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftConvert(nullptr, GIFT_DTYPE_F32, nullptr, GIFT_DTYPE_F16, 0), GIFT_OK);
  // Overlapping buffers: narrowing in place, widening into the tail, a shifted copy.
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, f, GIFT_DTYPE_BF16, 4), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "src and dst overlap");
  EXPECT_EQ(giftConvert(reinterpret_cast<uint16_t*>(f) + 4, GIFT_DTYPE_F16, f, GIFT_DTYPE_F32, 4),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, f + 1, GIFT_DTYPE_F32, 3), GIFT_ERROR_INVALID_ARGUMENT);
  // Adjacent buffers do not overlap.
  EXPECT_EQ(giftConvert(f, GIFT_DTYPE_F32, f + 2, GIFT_DTYPE_F32, 2), GIFT_OK);
}

}  // namespace
