// Every instruction set the dispatcher may pick (AVX-512, AVX2, SSE4, ... down to scalar
// emulation) must give the bytes of the scalar rules. The machine's best target is also
// checked on all 2^32 inputs against CUDA in tests/reference; here each target is forced
// in turn and run on a dense sample.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "coords/low_rank_update.h"
#include "numerics/elementwise.h"
#include "numerics/pair_sums.h"
#include "numerics/simd.h"

namespace gift {
namespace {

using num::Fp8;

// Every pattern of the top 24 bits, with low bytes that include ties and near-ties.
std::vector<float> dense_sample() {
  std::vector<float> x;
  x.reserve((size_t(1) << 24) * 5 + 17);
  for (uint32_t hi = 0; hi < (1u << 24); ++hi) {
    for (uint32_t lo : {0x00u, 0x01u, 0x7Fu, 0x80u, 0xFFu})
      x.push_back(num::float_of((hi << 8) | lo));
  }
  for (int i = 0; i < 17; ++i) x.push_back(float(i) * 0.37f);  // a ragged tail for the scalar loop
  return x;
}

// A target forced for the test, and on AVX-512 how it divides by fp32 scales (through their
// reciprocals, or with a division) and reads long runs (as parts, or in order): the CPU's
// vendor picks each, and every way must give the same bytes on any machine. The cases take
// Intel's two choices together and AMD's together.
struct TargetCase {
  int64_t target;
  int reciprocal;  // simd::set_reciprocal_division_for_test's mode
  int parts;       // simd::set_read_in_parts_for_test's mode
};

void PrintTo(const TargetCase& c, std::ostream* os) {
  *os << hwy::TargetName(c.target) << ", reciprocal division " << c.reciprocal << ", read in parts "
      << c.parts;
}

class ForEachTarget : public ::testing::TestWithParam<TargetCase> {
 protected:
  void SetUp() override {
    hwy::SetSupportedTargetsForTest(GetParam().target);
    simd::set_reciprocal_division_for_test(GetParam().reciprocal);
    simd::set_read_in_parts_for_test(GetParam().parts);
  }
  void TearDown() override {
    hwy::SetSupportedTargetsForTest(0);
    simd::set_reciprocal_division_for_test(-1);
    simd::set_read_in_parts_for_test(-1);
  }
};

TEST_P(ForEachTarget, QuantizeEqualsScalarRule) {
  ASSERT_STREQ(simd::target_name(), hwy::TargetName(GetParam().target));
  static const std::vector<float> x = dense_sample();
  std::vector<uint8_t> codes(x.size());
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    simd::quantize_rn(x.data(), GIFT_DTYPE_F32, x.size(), 1.0f, false, kind, codes.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t want = kind == GIFT_FP8_E4M3 ? num::fp8_from_float_rn<Fp8::kE4M3>(x[i])
                                                 : num::fp8_from_float_rn<Fp8::kE5M2>(x[i]);
      ASSERT_EQ(codes[i], want) << "kind " << kind << " bits 0x" << std::hex << num::bits_of(x[i]);
    }
  }
  // The bounded conversion of the block encoder, on the part of the sample it accepts.
  std::vector<float> bounded;
  for (float v : x) {
    if (std::fabs(v) < 131072.0f) bounded.push_back(v);
  }
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    simd::quantize_rn_bounded(bounded.data(), GIFT_DTYPE_F32, bounded.size(), 1.0f, false, kind,
                              codes.data());
    for (size_t i = 0; i < bounded.size(); ++i) {
      const float v = bounded[i];
      const uint8_t want = kind == GIFT_FP8_E4M3 ? num::fp8_from_float_rn<Fp8::kE4M3>(v)
                                                 : num::fp8_from_float_rn<Fp8::kE5M2>(v);
      ASSERT_EQ(codes[i], want) << "bounded, kind " << kind << " bits 0x" << std::hex
                                << num::bits_of(v);
    }
  }
  // Division by an fp32 scale, and 16-bit sources.
  std::mt19937 gen(5);
  std::normal_distribution<float> n;
  std::vector<float> y(4099);
  std::vector<uint16_t> yb(y.size()), yh(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = n(gen) * 3.0f;
    yb[i] = static_cast<uint16_t>(num::bits_of(y[i]) >> 16);
    yh[i] = num::f16_from_float(y[i]);
  }
  // Infinities and NaNs (quiet and signalling) of each 16-bit type, in vector lanes.
  const std::pair<uint16_t, uint16_t> specials[] = {
      {0x7F80, 0x7C00}, {0xFF80, 0xFC00}, {0x7FC0, 0x7E00}, {0xFF81, 0xFC01}, {0x7F81, 0x7D00}};
  for (size_t k = 0; k < std::size(specials); ++k) {
    for (size_t at : {3 + 7 * k, 40 + k, 2000 + 13 * k}) {
      yb[at] = specials[k].first;
      yh[at] = specials[k].second;
      y[at] = num::bf16_to_float(specials[k].first);
    }
  }
  const float s = 0.0123f;
  for (giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
    const void* src = dt == GIFT_DTYPE_F32    ? static_cast<const void*>(y.data())
                      : dt == GIFT_DTYPE_BF16 ? static_cast<const void*>(yb.data())
                                              : static_cast<const void*>(yh.data());
    std::vector<uint8_t> c(y.size());
    simd::quantize_rn(src, dt, y.size(), s, true, GIFT_FP8_E4M3, c.data());
    for (size_t i = 0; i < y.size(); ++i) {
      const float v = dt == GIFT_DTYPE_F32    ? y[i]
                      : dt == GIFT_DTYPE_BF16 ? num::bf16_to_float(yb[i])
                                              : num::f16_to_float(yh[i]);
      const uint8_t want = num::fp8_from_float_rn<Fp8::kE4M3>(v / s);
      ASSERT_EQ(c[i], want) << "dtype " << dt << " i " << i;
    }
  }
}

// Every finite bf16 pattern through the block encoder's bounded conversion (which widens
// bf16 in its own order and applies saturation and sign to packed bytes): divided by fp32
// scales (a subnormal one and one that saturates the largest values included) and
// multiplied by E8M0 reciprocals, wherever the quotient is in its domain.
TEST_P(ForEachTarget, BoundedConversionOfEveryBf16Pattern) {
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (const auto& [factor, divide] :
         {std::pair{1.0f, false}, std::pair{0x1p-20f, false}, std::pair{0x1p+12f, false},
          std::pair{0.0123f, true}, std::pair{3.7e-5f, true}, std::pair{1.7e+30f, true},
          std::pair{num::float_of(0x00000A3Bu), true}}) {
      std::vector<uint16_t> x;
      for (uint32_t b = 0; b < 0x10000u; ++b) {
        const float v = num::bf16_to_float(static_cast<uint16_t>(b));
        if (std::isfinite(v) && std::fabs(divide ? v / factor : v * factor) < 131072.0f)
          x.push_back(static_cast<uint16_t>(b));
      }
      // From the first pattern and from the second: AVX-512 widens bf16 two elements to a
      // 32-bit lane, so each pattern is taken at an even and at an odd position, from an
      // address that is a multiple of 4 and from one that is not.
      for (size_t from : {0, 1}) {
        std::vector<uint8_t> codes(x.size() - from);
        simd::quantize_rn_bounded(x.data() + from, GIFT_DTYPE_BF16, codes.size(), factor, divide,
                                  kind, codes.data());
        for (size_t i = 0; i < codes.size(); ++i) {
          const float v = num::bf16_to_float(x[from + i]);
          const float q = divide ? v / factor : v * factor;
          const uint8_t want = kind == GIFT_FP8_E4M3 ? num::fp8_from_float_rn<Fp8::kE4M3>(q)
                                                     : num::fp8_from_float_rn<Fp8::kE5M2>(q);
          ASSERT_EQ(codes[i], want) << "kind " << kind << " factor " << factor << " from " << from
                                    << " bf16 0x" << std::hex << x[from + i];
        }
      }
    }
}

// Division by an fp32 scale where the code hangs on the quotient's last bit: x / s within a
// few ulps of each FP8 halfway point (a quotient one ulp off moves the code there), for scales
// of every kind the encoder makes (amax / 448 and amax / 57344 of random amax over the whole
// range, powers of two, the ends of the reciprocal's domain and just past them), plus signed
// zeros and the smallest inputs.
TEST_P(ForEachTarget, DivisionAtHalfwayPointsEqualsScalarRule) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7FFFFF);
  std::vector<float> scales = {1.0f,
                               0x1p-80f,
                               num::float_of(num::bits_of(0x1p-80f) - 1),
                               0x1p+125f,
                               num::float_of(num::bits_of(0x1p+125f) + 1),
                               0x1.fffffep-1f,
                               3.0f};
  for (int e = -126; e <= 120; e += 6)
    scales.push_back(std::ldexp(float(0x800000 | mantissa(gen)), e - 23));
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    const float max = num::fp8_max(kind == GIFT_FP8_E4M3 ? Fp8::kE4M3 : Fp8::kE5M2);
    for (float s : scales) {
      std::vector<float> x = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, -0x1p-126f};
      for (uint32_t code = 0; code < 0x7F; ++code) {  // each halfway point above a code
        const float lo = kind == GIFT_FP8_E4M3 ? num::fp8_to_float<Fp8::kE4M3>(uint8_t(code))
                                               : num::fp8_to_float<Fp8::kE5M2>(uint8_t(code));
        const float hi = kind == GIFT_FP8_E4M3 ? num::fp8_to_float<Fp8::kE4M3>(uint8_t(code + 1))
                                               : num::fp8_to_float<Fp8::kE5M2>(uint8_t(code + 1));
        if (!std::isfinite(hi) || hi > max) break;
        const uint32_t near = num::bits_of((lo + hi) * 0.5f * s);
        for (int k = -6; k <= 6; ++k) {
          const float v = num::float_of(near + uint32_t(k));
          if (std::isfinite(v) && std::fabs(v / s) < 131072.0f) {
            x.push_back(v);
            x.push_back(-v);
          }
        }
      }
      std::vector<uint8_t> codes(x.size());
      simd::quantize_rn_bounded(x.data(), GIFT_DTYPE_F32, x.size(), s, true, kind, codes.data());
      for (size_t i = 0; i < x.size(); ++i) {
        const float q = x[i] / s;
        const uint8_t want = kind == GIFT_FP8_E4M3 ? num::fp8_from_float_rn<Fp8::kE4M3>(q)
                                                   : num::fp8_from_float_rn<Fp8::kE5M2>(q);
        ASSERT_EQ(codes[i], want) << "kind " << kind << " scale bits 0x" << std::hex
                                  << num::bits_of(s) << " x bits 0x" << num::bits_of(x[i]);
      }
    }
  }
}

// Division by an fp32 scale next to the midpoints between each FP8 halfway point h and its
// fp32 neighbours (where the quotient's last bit picks the code): every pair of fp32 x and s
// whose quotient lies within 2^-45 (relative) of one, up to a power of two common to x and s.
// With the midpoint M = M' 2^j (M' odd, 25 bits), s = S 2^c (S odd) and x = X 2^(c + j + k)
// (X odd), x / s = 2^j (M' + r / S) for the integer r = X 2^k - M' S, |r| <= 2^-45 M' S < 16.
// There k >= 1 (k = 0 leaves |r| >= 2^-24 M' S, and k < 0 needs X above 2^24), so r is odd;
// S is below 2^k (as X < 2^24), hence the residue of -r / M' modulo 2^k, and X = (M' S + r) /
// 2^k. The encoder's quotient through the reciprocal (FaithfulQuotient) is within 4.0001 *
// 2^-48 of x / s, so where its codes equal the scalar rule's on these pairs, they do on all.
// The host computes that quotient too, so that the claim is checked on machines without
// AVX-512, and the quotient before its correction, whose codes must differ on some pairs (else
// the pairs would not be the hard ones). Each scale is put at both ends of the reciprocal's
// domain (the top one as far as x stays finite) and in its middle.
TEST_P(ForEachTarget, DivisionNextToFp32MidpointsEqualsScalarRule) {
  const auto inverse = [](uint64_t a) {  // of an odd a, modulo 2^64 (Newton's iteration)
    uint64_t y = a;                      // right in the low 3 bits, then 6, 12, 24, 48, 96
    for (int i = 0; i < 5; ++i) y *= 2 - a * y;
    return y;
  };
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    const bool e4m3 = kind == GIFT_FP8_E4M3;
    const auto value = [&](uint32_t c) {
      return e4m3 ? num::fp8_to_float<Fp8::kE4M3>(uint8_t(c))
                  : num::fp8_to_float<Fp8::kE5M2>(uint8_t(c));
    };
    const auto code_of = [&](float q) {
      return e4m3 ? num::fp8_from_float_rn<Fp8::kE4M3>(q) : num::fp8_from_float_rn<Fp8::kE5M2>(q);
    };
    const float max = num::fp8_max(e4m3 ? Fp8::kE4M3 : Fp8::kE5M2);
    size_t pairs = 0, uncorrected_differs = 0;
    std::vector<std::pair<float, float>> hard;  // (s, x) of every pair at every placement
    for (uint32_t code = 0; value(code + 1) <= max; ++code) {
      const float h = (value(code) + value(code + 1)) * 0.5f;
      for (int side : {-1, 1}) {
        if (h == 0.0f && side < 0) continue;
        const double midpoint = (double(h) + double(num::float_of(num::bits_of(h) + side))) / 2;
        int j = 0;
        uint64_t odd = uint64_t(std::ldexp(std::frexp(midpoint, &j), 53));
        for (j -= 53; odd % 2 == 0; ++j) odd /= 2;
        for (int r = -15; r <= 15; r += 2) {
          for (int k = 1; k < 50; ++k) {
            const uint64_t s_bits = uint64_t(-int64_t(r)) * inverse(odd) & ((uint64_t(1) << k) - 1);
            if (s_bits == 0 || s_bits >= (1u << 24) ||
                double(std::abs(r)) > 0x1p-45 * double(s_bits) * double(odd))
              continue;
            const uint64_t product = odd * s_bits + uint64_t(int64_t(r));
            ASSERT_EQ(product % (uint64_t(1) << k), 0u);
            const uint64_t x_bits = product >> k;
            if (x_bits % 2 == 0 || x_bits >= (1u << 24)) continue;  // even: found at k + 1
            ++pairs;
            const int top = std::ilogb(double(s_bits));
            for (int c : {-top, -80 - top, std::min(124, 125 - std::ilogb(midpoint)) - top}) {
              const float s = std::ldexp(float(s_bits), c);
              const float x = std::ldexp(float(x_bits), c + j + k);
              ASSERT_TRUE(std::isnormal(x) && s >= 0x1p-80f && s < 0x1p+125f);
              ASSERT_LE(std::fabs(double(x) / double(s) - midpoint), 0x1p-44 * midpoint);
              if (std::isfinite(s * max)) hard.emplace_back(s, x);  // a block's amax below
              const uint8_t want = code_of(x / s);
              const float z = 1.0f / s, q0 = x * z;
              ASSERT_EQ(code_of(std::fma(std::fma(-q0, s, x), z, q0)), want);
              if (c == -top && code_of(q0) != want) ++uncorrected_differs;
              std::vector<float> xs(64);  // four vectors of the widest target
              for (size_t i = 0; i < xs.size(); ++i) xs[i] = i % 2 ? -x : x;
              std::vector<uint8_t> codes(xs.size());
              simd::quantize_rn_bounded(xs.data(), GIFT_DTYPE_F32, xs.size(), s, true, kind,
                                        codes.data());
              for (size_t i = 0; i < xs.size(); ++i) {
                ASSERT_EQ(codes[i], i % 2 ? want | 0x80 : want)
                    << "kind " << kind << " scale bits 0x" << std::hex << num::bits_of(s)
                    << " x bits 0x" << num::bits_of(xs[i]);
              }
            }
          }
        }
      }
    }
    EXPECT_GT(pairs, 1000u) << "kind " << kind;
    EXPECT_GT(uncorrected_differs, 200u) << "kind " << kind;
    // The block encoder, whose reciprocals come from its batches of scales: a block per pair,
    // led by the amax whose scale RN(amax / max) is that pair's s where one is (the scale
    // rule's round trip), the rest x and -x; blocks of 128 (batched) and of 64 and 32 (16 at
    // a time on AVX-512).
    for (uint32_t block : {128u, 64u, 32u}) {
      std::vector<float> src(hard.size() * block);
      for (size_t b = 0; b < hard.size(); ++b) {
        const auto [s, x] = hard[b];
        src[b * block] = s * max;
        for (uint32_t i = 1; i < block; ++i) src[b * block + i] = i % 2 ? x : -x;
      }
      std::vector<uint8_t> codes(src.size());
      std::vector<float> scales(hard.size());
      simd::encode_blocks_rn({src.data(), GIFT_DTYPE_F32, src.size(), block, kind,
                              GIFT_SCALE_DTYPE_F32, codes.data(), scales.data()});
      size_t on_pair = 0;
      for (size_t b = 0; b < hard.size(); ++b) {
        on_pair += scales[b] == hard[b].first;
        for (uint32_t i = 0; i < block; ++i) {
          ASSERT_EQ(codes[b * block + i], code_of(src[b * block + i] / scales[b]))
              << "kind " << kind << " block " << block << " scale bits 0x" << std::hex
              << num::bits_of(scales[b]) << " x bits 0x" << num::bits_of(src[b * block + i]);
        }
      }
      EXPECT_GT(on_pair, hard.size() / 2) << "kind " << kind;
    }
  }
}

// Codes with a NaN or Inf in most lines of 64, and codes with none (every finite code in
// turn, 5 lines and a tail) alone and with one NaN or Inf at the start, end or middle of a
// line, or last: the vector loop's two forms.
std::vector<std::vector<uint8_t>> dequantize_cases(giftFp8Kind_t kind) {
  std::vector<std::vector<uint8_t>> out(1);
  for (int rep = 0; rep < 3; ++rep)
    for (int c = 0; c < 256; ++c) out[0].push_back(static_cast<uint8_t>((c * 37 + rep) & 0xFF));
  const auto special = [&](int c) {
    return kind == GIFT_FP8_E4M3 ? (c & 0x7F) == 0x7F : (c & 0x7C) == 0x7C;
  };
  std::vector<uint8_t> finite;
  for (int c = 0; finite.size() < 5 * 64 + 37; c = (c + 1) % 256)
    if (!special(c)) finite.push_back(static_cast<uint8_t>(c));
  out.push_back(finite);
  for (size_t at : {size_t(0), size_t(63), size_t(64 + 17), size_t(2 * 64 + 40),
                    size_t(4 * 64 + 63), finite.size() - 1}) {
    out.push_back(finite);
    // NaN, or E5M2's +Inf and NaN
    out.back()[at] = kind == GIFT_FP8_E4M3 ? (at % 2 ? 0xFF : 0x7F) : (at % 2 ? 0xFE : 0x7C);
  }
  return out;
}

TEST_P(ForEachTarget, DequantizeEqualsScalarRule) {
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (const std::vector<uint8_t>& codes : dequantize_cases(kind))
      // (1 + 2^-11 and 1 - 2^-12 put powers of two, and 3 * 2^-20 some codes, on fp16's and
      // bf16's halfway points: ties to even. 2^-117 and 2^-110 take the smallest nonzero E4M3
      // and E5M2 magnitudes to fp32's smallest normal; 1.5 * 2^-118, 2^-120, 1.5 * 2^-111 and
      // 2^-113, below it, to fp32 and bf16 subnormals, which AVX512_BF16's conversion flushes.
      // The scale times 2^(127 - bias) is finite up to 2^8 - ulp (E4M3) and 2^16 - ulp (E5M2),
      // where one multiplication replaces two.)
      for (float s : {1.0f,
                      0.0037f,
                      1e-30f,
                      2e36f,
                      0.0f,
                      -0.0f,
                      INFINITY,
                      std::nanf(""),
                      num::float_of(0xFFFFFFFFu),
                      num::float_of(0x00400000u),
                      0x1.002p0f,
                      0x1.ffep-1f,
                      0x1.8p-20f,
                      0x1p-117f,
                      0x1.8p-118f,
                      0x1p-120f,
                      0x1p-110f,
                      0x1.8p-111f,
                      0x1p-113f,
                      0x1.fffffep7f,
                      0x1p8f,
                      0x1.fffffep15f,
                      0x1p16f,
                      -3.0f,
                      -0x1p8f,
                      -0x1p16f,
                      -2e36f}) {
        std::vector<float> f(codes.size());
        std::vector<uint16_t> b(codes.size()), h(codes.size());
        simd::dequantize(codes.data(), codes.size(), s, kind, f.data(), GIFT_DTYPE_F32);
        simd::dequantize(codes.data(), codes.size(), s, kind, b.data(), GIFT_DTYPE_BF16);
        simd::dequantize(codes.data(), codes.size(), s, kind, h.data(), GIFT_DTYPE_F16);
        for (size_t i = 0; i < codes.size(); ++i) {
          const float c = kind == GIFT_FP8_E4M3 ? num::fp8_to_float<Fp8::kE4M3>(codes[i])
                                                : num::fp8_to_float<Fp8::kE5M2>(codes[i]);
          // FORMAT.md 1.5: NaN and Inf codes stay; a NaN product is 0x7FC00000.
          float want = c * s;
          if (std::isinf(c) || std::isnan(c)) want = c;
          if (std::isnan(want)) want = num::float_of(0x7FC00000u);
          ASSERT_EQ(num::bits_of(f[i]), num::bits_of(want)) << i;
          ASSERT_EQ(b[i], num::bf16_from_float(want)) << i;
          ASSERT_EQ(h[i], num::f16_from_float(want)) << i;
        }
      }
}

// The all-reduce's passes (a tensor widened plus the residual; values minus their decode):
// IEEE fp32 sums and differences, each element alone, from sources at any alignment, stored
// plainly or streamed, in place too. A NaN result only has to be a NaN (which operand's
// payload an addition keeps is the instruction's choice).
TEST_P(ForEachTarget, WidenAddAndSubtractEqualScalarArithmetic) {
  std::mt19937 gen(5);
  const size_t n = 1000 + 13;  // whole vectors of every width, and a tail
  std::vector<float> a(n + 4), b(n + 4);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), 1e-40f, -3e38f, 3e38f};
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = i % 9 < 8 ? std::ldexp(float(gen()) / 4294967296.0f - 0.5f, int(gen() % 60) - 30)
                     : specials[gen() % 8];
    b[i] = i % 7 < 6 ? std::ldexp(float(gen()) / 4294967296.0f - 0.5f, int(gen() % 60) - 30)
                     : specials[gen() % 8];
  }
  const auto same = [](float got, float want) {
    return std::isnan(want) ? std::isnan(got) : num::bits_of(got) == num::bits_of(want);
  };
  for (const giftDType_t dtype : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
    std::vector<uint16_t> half(n + 4);
    for (size_t i = 0; i < half.size(); ++i) {
      half[i] = dtype == GIFT_DTYPE_BF16 ? num::bf16_from_float(a[i]) : num::f16_from_float(a[i]);
    }
    for (size_t at = 0; at < 4; ++at) {  // sources at every element offset of a vector
      const void* src = dtype == GIFT_DTYPE_F32 ? static_cast<const void*>(a.data() + at)
                                                : static_cast<const void*>(half.data() + at);
      std::vector<float> out(n);
      simd::widen_add(src, dtype, b.data() + at, out.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float x = dtype == GIFT_DTYPE_F32    ? a[at + i]
                        : dtype == GIFT_DTYPE_BF16 ? num::bf16_to_float(half[at + i])
                                                   : num::f16_to_float(half[at + i]);
        ASSERT_TRUE(same(out[i], x + b[at + i]))
            << "dtype " << dtype << ", offset " << at << ", " << i;
      }
    }
  }
  {
    std::vector<float> sum(b.begin(), b.begin() + n);  // out may be plus
    simd::widen_add(a.data(), GIFT_DTYPE_F32, sum.data(), sum.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(sum[i], a[i] + b[i])) << "in place " << i;
  }
  // Outputs at every 16-byte offset of a cache line: streamed vectors wider than 16 bytes are
  // stored whole where aligned to their width and in halves down to 16 bytes elsewhere.
  struct Free {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  const std::unique_ptr<float, Free> line(
      static_cast<float*>(::operator new((n + 16) * sizeof(float), std::align_val_t(64))));
  for (const bool stream : {false, true})
    for (size_t at = 0; at < 16; at += 4) {
      float* out = line.get() + at;
      std::vector<float> in_place(a.begin(), a.begin() + n);
      simd::subtract(a.data(), b.data(), out, n, stream);
      simd::subtract(in_place.data(), b.data(), in_place.data(), n, false);
      simd::stream_fence();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(out[i], a[i] - b[i]))
            << (stream ? "streamed, " : "") << "offset " << at << ", " << i;
        ASSERT_TRUE(same(in_place[i], a[i] - b[i])) << "in place " << i;
      }
    }
}

TEST_P(ForEachTarget, AbsMaxSeesNanAndInfAsLargest) {
  std::vector<float> x(1000);
  float amax = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(float(i)) * float(i);
    amax = std::max(amax, std::fabs(x[i]));
  }
  EXPECT_EQ(simd::abs_max_bits(x.data(), GIFT_DTYPE_F32, x.size()), num::bits_of(amax));
  for (size_t at : {size_t(0), size_t(513), size_t(999)}) {
    std::vector<float> y = x;
    y[at] = -INFINITY;
    EXPECT_EQ(simd::abs_max_bits(y.data(), GIFT_DTYPE_F32, y.size()), 0x7F800000u) << at;
    y[at] = std::nanf("");
    EXPECT_GT(simd::abs_max_bits(y.data(), GIFT_DTYPE_F32, y.size()), 0x7F800000u) << at;
  }
  // 16-bit sources: the max over the widened values, and NaN/Inf still show.
  std::vector<uint16_t> b(x.size()), h(x.size());
  float bmax = 0, hmax = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    b[i] = num::bf16_from_float(x[i]);
    h[i] = num::f16_from_float(x[i] * 1e-3f);
    bmax = std::max(bmax, std::fabs(num::bf16_to_float(b[i])));
    hmax = std::max(hmax, std::fabs(num::f16_to_float(h[i])));
  }
  EXPECT_EQ(simd::abs_max_bits(b.data(), GIFT_DTYPE_BF16, b.size()), num::bits_of(bmax));
  EXPECT_EQ(simd::abs_max_bits(h.data(), GIFT_DTYPE_F16, h.size()), num::bits_of(hmax));
  for (size_t at : {size_t(0), size_t(700), size_t(999)}) {
    std::vector<uint16_t> bb = b, hh = h;
    bb[at] = 0xFF80;  // bf16 -Inf
    hh[at] = 0x7E00;  // fp16 NaN
    EXPECT_EQ(simd::abs_max_bits(bb.data(), GIFT_DTYPE_BF16, bb.size()), 0x7F800000u) << at;
    EXPECT_GT(simd::abs_max_bits(hh.data(), GIFT_DTYPE_F16, hh.size()), 0x7F800000u) << at;
  }
}

// The statistics' census: each of eight lanes adds its elements' squares in order, so every
// target gives the scalar loop's doubles exactly, for any start lane, length and source type,
// and the largest magnitude of the same pass; a NaN or Inf anywhere shows in that.
TEST_P(ForEachTarget, AbsMaxAddSquaresEqualsScalarRules) {
  std::mt19937 gen(17);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> exponent(-140, 120);
  std::vector<float> x(4133);
  for (float& v : x) v = std::ldexp(nd(gen), exponent(gen));  // subnormals to ~1e36
  std::vector<uint16_t> b(x.size()), h(x.size());
  std::vector<float> bf(x.size()), hf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    b[i] = num::bf16_from_float(x[i]);
    bf[i] = num::bf16_to_float(b[i]);
    h[i] = num::f16_from_float(std::ldexp(x[i], -108));  // finite: below 2^15
    hf[i] = num::f16_to_float(h[i]);
  }
  const struct {
    giftDType_t dtype;
    const void* data;
    const float* values;
  } sources[] = {{GIFT_DTYPE_F32, x.data(), x.data()},
                 {GIFT_DTYPE_BF16, b.data(), bf.data()},
                 {GIFT_DTYPE_F16, h.data(), hf.data()}};
  for (const auto& src : sources) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 1000, 4096, 4133}) {
      for (size_t phase = 0; phase < 8; ++phase) {
        double want[8], got[8];
        uint32_t want_max = 0;
        for (int j = 0; j < 8; ++j) want[j] = got[j] = 0.5 * double(j);
        for (size_t k = 0; k < n; ++k) {
          want[(phase + k) % 8] += double(src.values[k]) * double(src.values[k]);
          want_max = std::max(want_max, num::bits_of(std::fabs(src.values[k])));
        }
        ASSERT_EQ(simd::abs_max_add_squares(src.data, src.dtype, n, phase, got), want_max)
            << "dtype " << src.dtype << " n " << n << " phase " << phase;
        for (int j = 0; j < 8; ++j) {
          ASSERT_EQ(got[j], want[j])
              << "dtype " << src.dtype << " n " << n << " phase " << phase << " lane " << j;
        }
      }
    }
  }
  const uint16_t bf16_inf = 0xFF80, f16_nan = 0x7E00;
  for (size_t at : {size_t(0), size_t(5), size_t(700), x.size() - 1}) {
    std::vector<float> xx = x;
    std::vector<uint16_t> bb = b, hh = h;
    xx[at] = std::nanf("");
    bb[at] = bf16_inf;
    hh[at] = f16_nan;
    double lanes[8] = {};
    EXPECT_GT(simd::abs_max_add_squares(xx.data(), GIFT_DTYPE_F32, xx.size(), 3, lanes),
              0x7F800000u)
        << at;
    EXPECT_EQ(simd::abs_max_add_squares(bb.data(), GIFT_DTYPE_BF16, bb.size(), 0, lanes),
              0x7F800000u)
        << at;
    EXPECT_GT(simd::abs_max_add_squares(hh.data(), GIFT_DTYPE_F16, hh.size(), 7, lanes),
              0x7F800000u)
        << at;
  }
}

// The metrics' sums in pair_sums.h's order, written out here once more: lengths around the
// step of eight pairs and the chunk, values like gradients' and from fp32 subnormals to 2^100
// (products that only double holds exactly), and NaN and Inf pairs, left out and counted, in
// a chunk's vector steps and in the last chunk's tail.
TEST_P(ForEachTarget, PairSumsFollowTheirOrder) {
  constexpr size_t kChunk = simd::kPairChunk;
  std::mt19937 gen(23);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> exponent(-140, 100);
  const size_t most = 3 * kChunk + 21;
  std::vector<float> ref(most), approx(most);
  // Two chunks of values like gradients', then magnitudes at random.
  for (size_t i = 0; i < most; ++i) {
    const bool wide = i >= 2 * kChunk;
    ref[i] = wide ? std::ldexp(nd(gen), exponent(gen)) : nd(gen);
    approx[i] = i % 5 == 0 ? ref[i]
                : wide     ? ref[i] * (1 + 0.01f * nd(gen)) + std::ldexp(nd(gen), exponent(gen))
                : i % 2    ? ref[i] + 0.03f * nd(gen)
                           : std::ldexp(nd(gen), -30);
  }
  const auto reference = [&](const std::vector<float>& r_in, const std::vector<float>& x_in,
                             size_t n) {
    simd::PairSums want;
    double* sums[5] = {&want.err_sq, &want.ref_sq, &want.approx_sq, &want.dot, &want.err};
    for (size_t at = 0; at < n; at += kChunk) {
      double lanes[5][8] = {};
      for (size_t k = 0; k < std::min(kChunk, n - at); ++k) {
        if (!std::isfinite(r_in[at + k]) || !std::isfinite(x_in[at + k])) {
          ++want.left_out;
          continue;
        }
        const double r = r_in[at + k], x = x_in[at + k], e = x - r;
        const double terms[5] = {e * e, r * r, x * x, r * x, e};
        for (int t = 0; t < 5; ++t) lanes[t][k % 8] += terms[t];
        want.max_abs = std::max(want.max_abs, std::fabs(e));
      }
      for (int t = 0; t < 5; ++t) {
        const double* l = lanes[t];
        *sums[t] += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      }
    }
    return want;
  };
  const auto bits = [](double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    return u;
  };
  const auto expect_equal = [&](const simd::PairSums& got, const simd::PairSums& want,
                                const std::string& what) {
    EXPECT_EQ(bits(got.err_sq), bits(want.err_sq)) << what;
    EXPECT_EQ(bits(got.ref_sq), bits(want.ref_sq)) << what;
    EXPECT_EQ(bits(got.approx_sq), bits(want.approx_sq)) << what;
    EXPECT_EQ(bits(got.dot), bits(want.dot)) << what;
    EXPECT_EQ(bits(got.err), bits(want.err)) << what;
    EXPECT_EQ(got.max_abs, want.max_abs) << what;
    EXPECT_EQ(got.left_out, want.left_out) << what;
  };
  std::vector<float> bad_ref = ref, bad_approx = approx;
  const float inf = std::numeric_limits<float>::infinity();
  bad_ref[3] = std::nanf("");
  bad_approx[kChunk + 100] = -inf;
  bad_ref[2 * kChunk + 9] = inf;  // Inf against Inf: e is NaN
  bad_approx[2 * kChunk + 9] = inf;
  bad_approx[most - 2] = std::nanf("");
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(15), size_t(17),
                   kChunk - 1, kChunk, kChunk + 1, 2 * kChunk + 13, most}) {
    const std::string what = "n " + std::to_string(n);
    expect_equal(simd::pair_sums(ref.data(), approx.data(), n), reference(ref, approx, n), what);
    const simd::PairSums bad = simd::pair_sums(bad_ref.data(), bad_approx.data(), n);
    expect_equal(bad, reference(bad_ref, bad_approx, n), what + ", NaN and Inf");
    if (n == most) {
      EXPECT_EQ(bad.left_out, 4u);
    }
  }
  // Spans long enough to be shared among threads, in more than one round of 1024 chunks, a
  // NaN in one chunk: the same sums.
  {
    const size_t n = 1027 * kChunk + 5;
    std::vector<float> r(n), x(n);
    for (size_t i = 0; i < n; ++i) {
      r[i] = nd(gen);
      x[i] = r[i] + 0.03f * nd(gen);
    }
    expect_equal(simd::pair_sums(r.data(), x.data(), n), reference(r, x, n), "long");
    x[37 * kChunk + 11] = std::nanf("");
    expect_equal(simd::pair_sums(r.data(), x.data(), n), reference(r, x, n), "long, NaN");
  }
  // e^2 is rounded, then added: of 16 pairs (two whole steps), pair 0 adds 1 to lane 0 and
  // pair 8 an e^2 that rounds, the others nothing, so the sum is lane 0's. The test counts the
  // trials where a fused multiply-add would have given another sum.
  int fused_differs = 0;
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    float r16[16] = {}, x16[16] = {};
    x16[0] = 1.0f;
    r16[8] = unit(gen);
    x16[8] = std::ldexp(unit(gen), -30);  // e of more than 26 bits
    const double e = double(x16[8]) - double(r16[8]);
    const double want = 1.0 + e * e;
    fused_differs += std::fma(e, e, 1.0) != want;
    ASSERT_EQ(simd::pair_sums(r16, x16, 16).err_sq, want) << trial;
  }
  EXPECT_GT(fused_differs, 0) << "no trial tells a rounded e^2 from a fused one";
}

// Spans summed side by side give each span's own sums: every source type, span lengths that
// are and are not a whole number of vector steps, counts of spans around the side-by-side
// width, and NaN/Inf in one span showing in that span's amax alone.
TEST_P(ForEachTarget, AddSquaresChunksEqualsOneCallPerSpan) {
  std::mt19937 gen(23);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> exponent(-140, 60);
  const size_t most = 9 * 4096;
  std::vector<float> x(most);
  for (float& v : x) v = std::ldexp(nd(gen), exponent(gen));
  std::vector<uint16_t> b(most), h(most);
  for (size_t i = 0; i < most; ++i) {
    b[i] = num::bf16_from_float(x[i]);
    h[i] = num::f16_from_float(std::ldexp(x[i], -50));
  }
  b[5 * 4096 + 17] = 0x7FC0;  // NaN in the sixth span of 4096
  h[2 * 24 + 3] = 0xFC00;     // -Inf in the third span of 24
  const std::pair<giftDType_t, const void*> sources[] = {
      {GIFT_DTYPE_F32, x.data()}, {GIFT_DTYPE_BF16, b.data()}, {GIFT_DTYPE_F16, h.data()}};
  for (const auto& [dtype, data] : sources)
    for (size_t chunk : {4096, 24, 16, 8})
      for (size_t chunks : {0, 1, 3, 4, 5, 9}) {
        std::vector<double[8]> lanes(chunks);
        std::vector<uint32_t> amax(chunks, 0xAAAAAAAAu);
        simd::add_squares_chunks(data, dtype, chunk, chunks, lanes.data(), amax.data());
        std::vector<double[8]> lanes_only(chunks);  // no amax asked: the same lanes
        simd::add_squares_chunks(data, dtype, chunk, chunks, lanes_only.data(), nullptr);
        for (size_t c = 0; c < chunks; ++c) {
          double want[8] = {};
          const uint8_t* span =
              static_cast<const uint8_t*>(data) + c * chunk * (dtype == GIFT_DTYPE_F32 ? 4 : 2);
          const uint32_t want_max = simd::abs_max_add_squares(span, dtype, chunk, 0, want);
          const std::string at = "dtype " + std::to_string(dtype) + " chunk " +
                                 std::to_string(chunk) + " of " + std::to_string(chunks) +
                                 ", span " + std::to_string(c);
          if (want_max >= 0x7F800000u) {
            EXPECT_GE(amax[c], 0x7F800000u) << at;
            continue;
          }
          ASSERT_EQ(amax[c], want_max) << at;
          for (int j = 0; j < 8; ++j) {
            ASSERT_EQ(lanes[c][j], want[j]) << at << " lane " << j;
            ASSERT_EQ(lanes_only[c][j], want[j]) << at << " lane " << j << ", lanes only";
          }
        }
      }
}

// Encodes the n elements at src (value(i) being element i) as one run, and checks it against
// the scalar rule: each block's scale and codes, the run's amax bits, and nothing written past
// the codes or the scales. The codes and scales written are left in *codes and *scales.
template <typename Value>
void ExpectEncodeFollowsScalarRule(const void* src, giftDType_t dt, size_t n, uint32_t block,
                                   giftFp8Kind_t kind, giftScaleDType_t sd, const Value& value,
                                   std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  const size_t blocks = (n + block - 1) / block;
  const size_t scale_bytes = blocks * (sd == GIFT_SCALE_DTYPE_E8M0 ? 1 : 4);
  // 64 guard bytes past the codes and past the scales, which nothing may write.
  codes->assign(n + 64, 0xAA);
  scales->assign(scale_bytes + 64, 0xAA);
  const simd::BlockRun run{src, dt, n, block, kind, sd, codes->data(), scales->data()};
  const uint32_t run_max = simd::encode_blocks_rn(run);
  const auto untouched = [](auto from, auto to) {
    return std::all_of(from, to, [](uint8_t v) { return v == 0xAA; });
  };
  ASSERT_TRUE(untouched(codes->begin() + n, codes->end())) << "codes, block " << block;
  ASSERT_TRUE(untouched(scales->begin() + scale_bytes, scales->end())) << "scales, block " << block;
  float amax_all = 0;
  for (size_t i = 0; i < n; ++i) amax_all = std::max(amax_all, std::fabs(value(i)));
  ASSERT_EQ(run_max, num::bits_of(amax_all));
  for (size_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
      amax = std::max(amax, std::fabs(value(i)));
    const num::GroupScale gs =
        num::group_scale(amax, static_cast<Fp8>(kind), sd == GIFT_SCALE_DTYPE_E8M0);
    const uint32_t stored = sd == GIFT_SCALE_DTYPE_E8M0
                                ? (*scales)[b]
                                : num::bits_of(reinterpret_cast<const float*>(scales->data())[b]);
    ASSERT_EQ(stored, gs.stored) << "block " << b;
    num::Rounding nearest(false, 0, 0);
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
      const uint8_t want = kind == GIFT_FP8_E4M3
                               ? num::encode_element<Fp8::kE4M3>(value(i), gs, false, nearest, i)
                               : num::encode_element<Fp8::kE5M2>(value(i), gs, false, nearest, i);
      ASSERT_EQ((*codes)[i], want)
          << "dtype " << dt << " kind " << kind << " sd " << sd << " block " << block << " i " << i;
    }
  }
}

// The block encoder and decoder (the hot path, runs of whole blocks in batches) against the
// per-element rules: every source type, FP8 kind and scale type; runs longer than a batch,
// short last blocks, runs read as four parts on AVX-512 where the case reads in parts (blocks
// of 16 to 128; the last part shorter; fp32 blocks of 16 to 64 and 16-bit ones of 16 to 128
// are taken 16 at a time instead, and only the rest of the run in parts: blocks of 48, 80 and
// 100 and fp32 blocks of 128 keep the parts) and in order (every run on narrower targets and
// in the cases that read in order; blocks of 256: three batches; of 4096: one),
// all-zero and subnormal blocks, bf16 values (whose few mantissa bits put many quotients next
// to FP8 rounding midpoints), and a NaN that stops the run.
TEST_P(ForEachTarget, BlockRunsEqualScalarRule) {
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  const size_t n = 70 * 128 + 77;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t blk = i / 128;
    const float t = nd(gen);
    x[i] = blk == 3 ? 0.0f : blk == 5 ? num::float_of(gen() & 0x807FFFFFu) : t * t * t * 1e-3f;
  }
  std::vector<uint16_t> xb(n), xh(n);
  for (size_t i = 0; i < n; ++i) {
    xb[i] = static_cast<uint16_t>(num::bits_of(x[i]) >> 16);
    xh[i] = num::f16_from_float(x[i]);
  }
  for (giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16})
    for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
      for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
        for (uint32_t block : {16u, 32u, 48u, 64u, 80u, 100u, 128u, 256u, 4096u}) {
          const void* src = dt == GIFT_DTYPE_F32    ? static_cast<const void*>(x.data())
                            : dt == GIFT_DTYPE_BF16 ? static_cast<const void*>(xb.data())
                                                    : static_cast<const void*>(xh.data());
          const auto value = [&](size_t i) {
            return dt == GIFT_DTYPE_F32    ? x[i]
                   : dt == GIFT_DTYPE_BF16 ? num::bf16_to_float(xb[i])
                                           : num::f16_to_float(xh[i]);
          };
          const size_t blocks = (n + block - 1) / block;
          std::vector<uint8_t> codes, scales;
          ExpectEncodeFollowsScalarRule(src, dt, n, block, kind, sd, value, &codes, &scales);
          if (HasFailure()) return;
          // Decoding the run gives code * scale, as decode_element does, to fp32, bf16 and
          // fp16, with plain and with streaming stores, at several alignments of the output,
          // with a NaN code in the second block (the scalar path after vectors) and scales
          // set as below; nothing is written past the run.
          std::vector<uint8_t> in = codes;
          in[block + 3] = 0x7F;  // NaN in both kinds
          // One more after a whole line of the fourth block: NaN, or E5M2's +Inf.
          if (block >= 128 && 3 * block + 64 + 40 < n)
            in[3 * block + 64 + 40] = kind == GIFT_FP8_E4M3 ? 0xFF : 0x7C;
          // And one in a line of blocks of 16 or 32 whose scales below are all left alone.
          if (block < 64) in[7 * 64 + 5] = kind == GIFT_FP8_E4M3 ? 0xFF : 0x7C;
          // Scales from other encoders: 2^20, too large for the one multiplication by
          // scale * 2^(127 - bias); 2^-118, too small for AVX512_BF16's conversion; NaN
          // (an fp32 pattern, and E8M0's 0xFF), +Inf and -2^20.
          std::vector<uint8_t> in_scales = scales;
          const std::pair<size_t, uint32_t> f32_scales[] = {{2, 0x49800000u},
                                                            {6, 0x04800000u},
                                                            {8, 0xFFFFFFFFu},
                                                            {9, 0x7F800000u},
                                                            {10, 0xC9800000u}};
          const std::pair<size_t, uint32_t> e8m0_scales[] = {
              {2, 127 + 20}, {6, 127 - 118}, {8, 0xFF}};
          if (sd == GIFT_SCALE_DTYPE_E8M0) {
            for (const auto& [b, e] : e8m0_scales)
              if (b < blocks) in_scales[b] = static_cast<uint8_t>(e);
          } else {
            for (const auto& [b, bits] : f32_scales)
              if (b < blocks) std::memcpy(in_scales.data() + 4 * b, &bits, 4);
          }
          std::vector<float> want(n);
          for (size_t i = 0; i < n; ++i) {
            const size_t b = i / block;
            const float s = sd == GIFT_SCALE_DTYPE_E8M0
                                ? num::e8m0_to_float(in_scales[b])
                                : reinterpret_cast<const float*>(in_scales.data())[b];
            want[i] = kind == GIFT_FP8_E4M3 ? num::decode_element<Fp8::kE4M3>(in[i], s)
                                            : num::decode_element<Fp8::kE5M2>(in[i], s);
          }
          std::vector<float> y(n + 64);
          std::vector<uint16_t> yb(n + 64), y16(n + 64);
          const auto past_line = [](void* p, size_t bytes) {
            return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) &
                                              ~uintptr_t(63)) +
                   bytes;
          };
          simd::BlockRun decode_run{src, dt, n, block, kind, sd, in.data(), in_scales.data()};
          for (bool stream : {false, true}) {
            decode_run.stream = stream;
            // Bytes past a 64-byte boundary: 16-byte aligned (streamed whole or in pieces)
            // or not (stored plainly).
            for (size_t shift : {0, 4, 16, 32, 48}) {
              std::fill(y.begin(), y.end(), -7.0f);
              std::fill(yb.begin(), yb.end(), uint16_t(0xBEEF));
              std::fill(y16.begin(), y16.end(), uint16_t(0xBEEF));
              float* yf = reinterpret_cast<float*>(past_line(y.data(), shift));
              uint16_t* yh = reinterpret_cast<uint16_t*>(past_line(yb.data(), shift));
              uint16_t* yg = reinterpret_cast<uint16_t*>(past_line(y16.data(), shift));
              simd::decode_blocks(decode_run, yf, GIFT_DTYPE_F32);
              simd::decode_blocks(decode_run, yh, GIFT_DTYPE_BF16);
              simd::decode_blocks(decode_run, yg, GIFT_DTYPE_F16);
              simd::stream_fence();
              for (size_t i = 0; i < n; ++i) {
                ASSERT_EQ(num::bits_of(yf[i]), num::bits_of(want[i]))
                    << i << " stream " << stream << " shift " << shift;
                ASSERT_EQ(yh[i], num::bf16_from_float(want[i]))
                    << i << " stream " << stream << " shift " << shift;
                ASSERT_EQ(yg[i], num::f16_from_float(want[i]))
                    << i << " stream " << stream << " shift " << shift;
              }
              ASSERT_TRUE(
                  std::all_of(yf + n, y.data() + y.size(), [](float v) { return v == -7.0f; }))
                  << "stream " << stream << " shift " << shift;
              ASSERT_TRUE(std::all_of(yh + n, yb.data() + yb.size(),
                                      [](uint16_t v) { return v == 0xBEEF; }))
                  << "stream " << stream << " shift " << shift;
              ASSERT_TRUE(std::all_of(yg + n, y16.data() + y16.size(),
                                      [](uint16_t v) { return v == 0xBEEF; }))
                  << "stream " << stream << " shift " << shift;
            }
          }
        }
  // A NaN or an infinity in any block, the last of a part included, is reported, from every
  // source type (bf16's amax beside the codes is taken on 16-bit lanes) and both scale types.
  for (size_t at : {size_t(0), size_t(21 * 128 + 5), size_t(17 * 128 + 127), n - 1})
    for (uint32_t block : {16u, 32u, 64u, 80u, 128u}) {
      std::vector<float> y = x;
      y[at] = at % 2 ? std::nanf("") : -INFINITY;
      std::vector<uint16_t> yb(n), yh(n);
      for (size_t i = 0; i < n; ++i) {
        yb[i] = static_cast<uint16_t>(num::bits_of(y[i]) >> 16);
        yh[i] = num::f16_from_float(y[i]);
      }
      std::vector<uint8_t> codes(n), scales(((n + block - 1) / block) * 4);
      const std::pair<giftDType_t, const void*> sources[] = {
          {GIFT_DTYPE_F32, y.data()}, {GIFT_DTYPE_BF16, yb.data()}, {GIFT_DTYPE_F16, yh.data()}};
      for (const auto& [dt, src] : sources)
        for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
          EXPECT_GE(simd::encode_blocks_rn(
                        {src, dt, n, block, GIFT_FP8_E4M3, sd, codes.data(), scales.data()}),
                    0x7F800000u)
              << at << " block " << block << " dtype " << dt << " sd " << sd;
        }
    }
}

// Batches taken whole (EncodeWholeBatch: runs read in order, on AVX2 and narrower every run,
// on AVX-512 those that the 16-block encoder leaves, under 64 blocks where the case reads long
// runs in parts): runs whose last block is
// short, in the batch after one that would otherwise be taken whole, and the same runs whole;
// a batch with a block whose fp32 scale lies below the reciprocal's domain (values near 1e-30,
// in fp16 zeros); NaN and Inf in a batch whose amax is taken beside a whole batch's codes.
TEST_P(ForEachTarget, WholeBatchesEqualScalarRule) {
  std::mt19937 gen(12);
  std::normal_distribution<float> nd;
  // 96 blocks of 128 or 48 of 256: six or three batches of 16.
  for (size_t n : {size_t(12288 - 77), size_t(12288)}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = nd(gen) * (i / 128 == 40 ? 1e-30f : 1e-3f);
    std::vector<uint16_t> xb(n), xh(n);
    for (size_t i = 0; i < n; ++i) {
      xb[i] = static_cast<uint16_t>(num::bits_of(x[i]) >> 16);
      xh[i] = num::f16_from_float(x[i]);
    }
    const std::pair<giftDType_t, const void*> sources[] = {
        {GIFT_DTYPE_F32, x.data()}, {GIFT_DTYPE_BF16, xb.data()}, {GIFT_DTYPE_F16, xh.data()}};
    for (const auto& [dt, src] : sources) {
      const auto value = [&, dt = dt](size_t i) {
        return dt == GIFT_DTYPE_F32    ? x[i]
               : dt == GIFT_DTYPE_BF16 ? num::bf16_to_float(xb[i])
                                       : num::f16_to_float(xh[i]);
      };
      for (uint32_t block : {128u, 256u})
        for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
          for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
            std::vector<uint8_t> codes, scales;
            ExpectEncodeFollowsScalarRule(src, dt, n, block, kind, sd, value, &codes, &scales);
            if (HasFailure()) return;
          }
    }
    // Element 5220 is in block 40 of 128 (the third batch) and block 20 of 256 (the second).
    for (const float bad : {std::nanf(""), -INFINITY}) {
      std::vector<float> y = x;
      y[5220] = bad;
      std::vector<uint16_t> yb(n), yh(n);
      for (size_t i = 0; i < n; ++i) {
        yb[i] = static_cast<uint16_t>(num::bits_of(y[i]) >> 16);
        yh[i] = num::f16_from_float(y[i]);
      }
      std::vector<uint8_t> codes(n), scales(n / 128 * 4 + 4);
      const std::pair<giftDType_t, const void*> bad_sources[] = {
          {GIFT_DTYPE_F32, y.data()}, {GIFT_DTYPE_BF16, yb.data()}, {GIFT_DTYPE_F16, yh.data()}};
      for (const auto& [dt, src] : bad_sources)
        for (uint32_t block : {128u, 256u})
          for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
            EXPECT_GE(simd::encode_blocks_rn(
                          {src, dt, n, block, GIFT_FP8_E4M3, sd, codes.data(), scales.data()}),
                      0x7F800000u)
                << "dtype " << dt << " block " << block << " sd " << sd;
    }
  }
}

// The whitener's fused kernel against the same product in double precision, on shapes with
// ragged edges everywhere: rows not a multiple of its band, dim and rank not of any vector
// width, no rank at all, each scaling present or not. (Being a GEMM, it is compared within
// fp32 rounding, not bit for bit; but the FMA targets give each other's bits, whatever
// their vector width.)
TEST_P(ForEachTarget, LowRankUpdateMatchesDoublePrecision) {
  struct Case {
    uint32_t rows, dim, rank;
  };
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  for (const Case k : {Case{1, 1, 1}, Case{7, 13, 3}, Case{9, 33, 17}, Case{17, 100, 32},
                       Case{8, 64, 0}, Case{25, 200, 40}, Case{16, 48, 16},
                       Case{300, 257, 33}}) {  // the last large enough for threads
    std::vector<float> v(size_t(k.dim) * k.rank), c(k.rank), pre(k.dim), post(k.dim),
        x0(size_t(k.rows) * k.dim);
    for (float& e : v) e = nd(gen) * 0.3f;
    for (float& e : c) e = nd(gen);
    for (float& e : pre) e = 0.5f + std::fabs(nd(gen));
    for (float& e : post) e = 0.5f + std::fabs(nd(gen));
    for (float& e : x0) e = nd(gen);
    for (int mode = 0; mode < 4; ++mode) {
      const float* a = mode & 1 ? pre.data() : nullptr;
      const float* b = mode & 2 ? post.data() : nullptr;
      std::vector<float> x = x0;
      coords::low_rank_update(v.data(), c.data(), k.dim, k.rank, a, b, x.data(), k.rows);
      for (uint32_t r = 0; r < k.rows; ++r) {
        std::vector<double> y(k.dim), p(k.rank, 0.0);
        double norm = 0;
        for (uint32_t i = 0; i < k.dim; ++i) y[i] = double(x0[r * k.dim + i]) * (a ? a[i] : 1.0);
        for (uint32_t i = 0; i < k.dim; ++i)
          for (uint32_t j = 0; j < k.rank; ++j) p[j] += y[i] * v[i * k.rank + j];
        for (uint32_t i = 0; i < k.dim; ++i) {
          double s = y[i];
          for (uint32_t j = 0; j < k.rank; ++j) s += p[j] * c[j] * v[i * k.rank + j];
          y[i] = s * (b ? b[i] : 1.0);
          norm += y[i] * y[i];
        }
        const double tol = 1e-5 * std::sqrt(norm / k.dim) * (1 + std::sqrt(double(k.rank)));
        for (uint32_t i = 0; i < k.dim; ++i) {
          ASSERT_NEAR(x[r * k.dim + i], y[i], tol)
              << "rows " << k.rows << " dim " << k.dim << " rank " << k.rank << " mode " << mode
              << " at " << r << "," << i;
        }
      }
    }
  }
}

// Values of the whitener reach FP8 codes, so machines of different vector widths must agree:
// every FMA target gives the bits of the widest (vector columns and scalar tail both fuse),
// however many vectors of columns a step takes: shapes with tails at every width, and on
// AVX-512 steps of two vectors, of one (rank 40: 48 padded columns; dim 93 = 64 + 16 + 13)
// and the scalar tail.
TEST(LowRankUpdate, FmaTargetsAgreeBitForBit) {
  struct Shape {
    uint32_t rows, dim, rank;
  };
  for (const Shape k : {Shape{21, 77, 19}, Shape{13, 93, 40}}) {
    std::mt19937 gen(3);
    std::normal_distribution<float> nd;
    std::vector<float> v(k.dim * k.rank), c(k.rank), pre(k.dim), post(k.dim), x0(k.rows * k.dim);
    for (auto* a : {&v, &c, &pre, &post, &x0})
      for (float& e : *a) e = nd(gen);
    for (const bool inverse : {false, true}) {
      std::vector<std::vector<float>> results;
      std::vector<std::string> names;
      for (const int64_t t : hwy::SupportedAndGeneratedTargets()) {
        if (!(t & (HWY_AVX2 | HWY_AVX3 | HWY_AVX3_DL))) continue;
        hwy::SetSupportedTargetsForTest(t);
        std::vector<float> x = x0;
        coords::low_rank_update(v.data(), c.data(), k.dim, k.rank, inverse ? nullptr : pre.data(),
                                inverse ? post.data() : nullptr, x.data(), k.rows);
        results.push_back(std::move(x));
        names.push_back(hwy::TargetName(t));
      }
      hwy::SetSupportedTargetsForTest(0);
      if (results.size() < 2) GTEST_SKIP() << "fewer than two FMA targets on this machine";
      for (size_t t = 1; t < results.size(); ++t) {
        for (size_t i = 0; i < x0.size(); ++i) {
          ASSERT_EQ(num::bits_of(results[t][i]), num::bits_of(results[0][i]))
              << names[t] << " vs " << names[0] << ", dim " << k.dim << " rank " << k.rank
              << (inverse ? ", post" : ", pre") << " at " << i;
        }
      }
    }
  }
}

std::vector<TargetCase> targets() {
  std::vector<TargetCase> out;
  for (const int64_t t : hwy::SupportedAndGeneratedTargets()) {
    out.push_back({t, 0, 0});
    if (t <= HWY_AVX3) out.push_back({t, 1, 1});  // AVX-512 and later: both ways of each
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Targets, ForEachTarget, ::testing::ValuesIn(targets()),
                         [](const auto& info) {
                           return std::string(hwy::TargetName(info.param.target)) +
                                  (info.param.target <= HWY_AVX3
                                       ? (info.param.reciprocal ? "_reciprocal_parts"
                                                                : "_division_in_order")
                                       : "");
                         });

}  // namespace
}  // namespace gift
