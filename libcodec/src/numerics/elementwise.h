// Per-element rules of the GIFT numerics: FP8 conversion, the scale formulas, stochastic
// rounding's random numbers, and the 16-bit float widenings. This header is the single
// place where these rules live; the CPU encoder (scalar and vectorized) and the CUDA
// kernels all call it, so the same transformed input gives the same bytes everywhere.
// format/FORMAT.md ("Numerics") is the normative text these functions implement.
#pragma once

#include <cstdint>
#include <cstring>

#include "numerics/hd.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace gift::num {

enum class Fp8 : uint8_t { kE4M3 = 0, kE5M2 = 1 };

GIFT_HD uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

GIFT_HD float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Constants of one FP8 kind, all as fp32 bit patterns or FP8 codes so that the
// conversion is integer work plus one fp32 addition.
template <Fp8 K>
struct Fp8Traits;

template <>
struct Fp8Traits<Fp8::kE4M3> {
  static constexpr int kMantBits = 3;
  static constexpr int kBias = 7;
  static constexpr int kEmax = 8;                   // exponent of the largest binade
  static constexpr uint32_t kMaxBits = 0x43E00000;  // 448
  static constexpr uint8_t kMaxCode = 0x7E;
  static constexpr uint32_t kMinNormalBits = 0x3C800000;  // 2^-6
  // 2^14: adding it to |v| < 2^-6 rounds |v| to a multiple of the subnormal step 2^-9.
  static constexpr uint32_t kSubnormalMagicBits = 0x46800000;
  static constexpr int kSubnormalStepExp = -9;
};

template <>
struct Fp8Traits<Fp8::kE5M2> {
  static constexpr int kMantBits = 2;
  static constexpr int kBias = 15;
  static constexpr int kEmax = 15;
  static constexpr uint32_t kMaxBits = 0x47600000;  // 57344
  static constexpr uint8_t kMaxCode = 0x7B;
  static constexpr uint32_t kMinNormalBits = 0x38800000;       // 2^-14
  static constexpr uint32_t kSubnormalMagicBits = 0x43000000;  // 2^7, step 2^-16
  static constexpr int kSubnormalStepExp = -16;
};

// The code every NaN input maps to, for both kinds (as CUDA's conversion does).
constexpr uint8_t kNanCode = 0x7F;
constexpr uint8_t kE5M2InfCode = 0x7C;

GIFT_HD float fp8_max(Fp8 k) { return k == Fp8::kE4M3 ? 448.0f : 57344.0f; }
GIFT_HD int fp8_emax(Fp8 k) { return k == Fp8::kE4M3 ? 8 : 15; }

// fp32 -> FP8, round to nearest even, finite overflow (and +-Inf) saturates to +-max,
// NaN -> 0x7F. Equal to __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind) for all 2^32 inputs
// (tests/cuda compares them on the device, tests/reference on the host).
template <Fp8 K>
GIFT_HD uint8_t fp8_rn_rule(float x) {
  using T = Fp8Traits<K>;
  constexpr int kShift = 23 - T::kMantBits;
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kNanCode;
  uint32_t mag;
  if (a >= T::kMinNormalBits) {
    const uint32_t r = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
    mag = r - (uint32_t(127 - T::kBias) << T::kMantBits);
    if (mag > T::kMaxCode) mag = T::kMaxCode;
  } else {
    // The fp32 adder rounds to nearest even at the subnormal step; no FTZ/DAZ allowed.
    mag = bits_of(float_of(a) + float_of(T::kSubnormalMagicBits)) - T::kSubnormalMagicBits;
  }
  return static_cast<uint8_t>(mag | sign);
}

// fp8_rn_rule, as one instruction where the GPU has it (sm_89 and later), which the rule is
// proven equal to; the rule elsewhere.
template <Fp8 K>
GIFT_HD uint8_t fp8_from_float_rn(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(x, __NV_SATFINITE, K == Fp8::kE4M3 ? __NV_E4M3 : __NV_E5M2));
#else
  return fp8_rn_rule<K>(x);
#endif
}

// Stochastic rounding: |v| goes to the FP8 magnitude above with probability equal to its
// distance from the one below (in units of the FP8 step there), quantized to 2^-32, using
// the uniform 32-bit word `rnd`. Saturation, NaN and sign as in fp8_from_float_rn.
template <Fp8 K>
GIFT_HD uint8_t fp8_from_float_sr(float x, uint32_t rnd) {
  using T = Fp8Traits<K>;
  constexpr int kShift = 23 - T::kMantBits;
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kNanCode;
  if (a >= T::kMaxBits) return static_cast<uint8_t>(T::kMaxCode | sign);
  uint32_t mag;
  if (a >= T::kMinNormalBits) {
    const uint32_t frac32 = (a & ((1u << kShift) - 1u)) << (32 - kShift);
    mag = (a >> kShift) - (uint32_t(127 - T::kBias) << T::kMantBits) + (rnd < frac32 ? 1u : 0u);
  } else {
    // |x| = m * 2^(e - 23); in subnormal steps that is m * 2^-sh with sh >= 21.
    const uint32_t field = a >> 23;
    const uint64_t m = (a & 0x7FFFFFu) | (field ? 0x800000u : 0u);
    const int e = field ? int(field) - 127 : -126;
    const int sh = T::kSubnormalStepExp + 23 - e;
    const uint64_t whole = sh < 64 ? m >> sh : 0;
    const uint64_t rem = sh < 64 ? m & ((uint64_t(1) << sh) - 1) : m;
    const uint64_t frac32 = sh <= 32 ? rem << (32 - sh) : (sh - 32 < 64 ? rem >> (sh - 32) : 0);
    mag = uint32_t(whole) + (rnd < frac32 ? 1u : 0u);
  }
  if (mag > T::kMaxCode) mag = T::kMaxCode;
  return static_cast<uint8_t>(mag | sign);
}

// FP8 -> fp32, exact. NaN codes give the canonical quiet NaN 0x7FC00000.
template <Fp8 K>
GIFT_HD float fp8_to_float(uint8_t c) {
  using T = Fp8Traits<K>;
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  const uint32_t exp = mag >> T::kMantBits;
  const uint32_t man = mag & ((1u << T::kMantBits) - 1u);
  if (K == Fp8::kE4M3 && mag == 0x7Fu) return float_of(0x7FC00000u);
  if (K == Fp8::kE5M2 && exp == 31u) return float_of(man ? 0x7FC00000u : (sign | 0x7F800000u));
  if (exp == 0) {
    // man * 2^step is exact in fp32.
    const float step = float_of(uint32_t(127 + T::kSubnormalStepExp) << 23);
    return float_of(bits_of(float(man) * step) | sign);
  }
  return float_of(sign | ((exp + 127u - T::kBias) << 23) | (man << (23 - T::kMantBits)));
}

// ---- Scales -------------------------------------------------------------------------

// fp32 division rounded to nearest even, whatever -prec-div/-ftz a kernel is built with.
GIFT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// fp32 scale of a group whose largest finite magnitude is amax.
GIFT_HD float scale_f32(float amax, Fp8 k) { return div_rn(amax, fp8_max(k)); }

// floor(log2(a)) for finite a > 0, subnormals included.
GIFT_HD int floor_log2(float a) {
  const uint32_t b = bits_of(a);
  const int field = int(b >> 23);
  if (field) return field - 127;
  int msb = 22;
  while (msb > 0 && !((b >> msb) & 1u)) --msb;
  return msb - 149;
}

// E8M0 scale byte (OCP MX v1.0): biased exponent of 2^(floor(log2 amax) - emax), clamped to
// [2^-127, 2^127]. A group with amax == 0 stores 0x00; its codes are all +0.
GIFT_HD uint8_t scale_e8m0(float amax, Fp8 k) {
  if (!(amax > 0.0f)) return 0;
  int e = floor_log2(amax) - fp8_emax(k);
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return static_cast<uint8_t>(e + 127);
}

// Value of an E8M0 byte: 2^(b - 127), 0xFF is NaN.
GIFT_HD float e8m0_to_float(uint8_t b) {
  if (b == 0xFF) return float_of(0x7FC00000u);
  if (b == 0) return float_of(0x00400000u);  // 2^-127, an fp32 subnormal
  return float_of(uint32_t(b) << 23);
}

// Scale g of a tensor's stored scales: E8M0 bytes, or fp32.
GIFT_HD float stored_scale(const void* scales, bool e8m0, uint64_t g) {
  return e8m0 ? e8m0_to_float(static_cast<const uint8_t*>(scales)[g])
              : static_cast<const float*>(scales)[g];
}

// Exact reciprocal of an E8M0 scale, so that x * inv == x / s bit for bit.
GIFT_HD float e8m0_reciprocal(uint8_t b) { return e8m0_to_float(static_cast<uint8_t>(254 - b)); }

// How a group's codes are computed once its largest finite magnitude is known
// (FORMAT.md 1.7, 1.8): the value stored (fp32 bits, or the E8M0 byte) and the factor.
struct GroupScale {
  uint32_t stored;
  float factor;  // code = RN(x / factor) for fp32 scales, RN(x * factor) for E8M0 (exact)
  bool divide;
  bool zero;  // every code is +0 (amax == 0, or the fp32 scale underflowed to 0)
};

GIFT_HD GroupScale group_scale(float amax, Fp8 k, bool e8m0) {
  if (e8m0) {
    const uint8_t b = scale_e8m0(amax, k);
    return {b, e8m0_reciprocal(b), false, !(amax > 0.0f)};
  }
  const float s = scale_f32(amax, k);
  return {bits_of(s), s, true, !(s > 0.0f)};
}

// ---- Philox4x32-10 (Salmon et al., SC'11), the counter-based generator ------------

struct U32x4 {
  uint32_t v[4];
};

GIFT_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = uint64_t(a) * b;
  *hi = uint32_t(p >> 32);
  *lo = uint32_t(p);
}

GIFT_HD U32x4 philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c.v[0], &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c.v[2], &hi1, &lo1);
    c = U32x4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// The four uniforms for elements 4j .. 4j+3 of tensor `tensor` under `seed`:
// key = (seed low, seed high), counter = (j low, j high, tensor, 0).
GIFT_HD U32x4 sr_uniforms(uint64_t seed, uint32_t tensor, uint64_t j) {
  return philox4x32_10(U32x4{{uint32_t(j), uint32_t(j >> 32), tensor, 0u}}, uint32_t(seed),
                       uint32_t(seed >> 32));
}

// ---- Whole elements -----------------------------------------------------------------

// How elements round: to nearest, or stochastically with each element's uniform word. One
// generator call gives the words of 4 elements (sr_uniforms), so a Rounding asked for
// increasing indices calls it once per 4 of them.
class Rounding {
 public:
  GIFT_HD Rounding(bool stochastic, uint64_t seed, uint32_t tensor)
      : stochastic_(stochastic), tensor_(tensor), seed_(seed) {}
  GIFT_HD bool stochastic() const { return stochastic_; }
  // The uniform word of element `index` of the tensor.
  GIFT_HD uint32_t word(uint64_t index) {
    if (!have_ || (index >> 2) != quad_) {
      quad_ = index >> 2;
      words_ = sr_uniforms(seed_, tensor_, quad_);
      have_ = true;
    }
    // Selects rather than an indexed load keep the words in registers on a GPU.
    const uint32_t* w = words_.v;
    return index & 2 ? (index & 1 ? w[3] : w[2]) : (index & 1 ? w[1] : w[0]);
  }

 private:
  bool stochastic_, have_ = false;
  uint32_t tensor_;
  uint64_t seed_, quad_ = 0;
  U32x4 words_{};
};

// One element's code (FORMAT.md 1.7-1.9): element `index` (row-major) of a group scaled by
// gs. NaN/Inf kept by request become NaN codes, or E5M2's Inf codes; otherwise they convert
// like any value (NaN to 0x7F, Inf saturating), and the caller reports them.
template <Fp8 K>
GIFT_HD uint8_t encode_element(float x, const GroupScale& gs, bool keep_nonfinite,
                               Rounding& rounding, uint64_t index) {
  if (keep_nonfinite && (bits_of(x) & 0x7FFFFFFFu) >= 0x7F800000u) {
    if (x != x) return kNanCode;
    if (K == Fp8::kE5M2) return static_cast<uint8_t>(kE5M2InfCode | (x < 0 ? 0x80 : 0));
    return kNanCode;
  }
  if (gs.zero) return 0;
  const float v = gs.divide ? div_rn(x, gs.factor) : x * gs.factor;
  if (rounding.stochastic()) return fp8_from_float_sr<K>(v, rounding.word(index));
  return fp8_from_float_rn<K>(v);
}

// One element's value: the code's value times the group's scale; NaN and Inf codes stay
// as they are, and a NaN product is the canonical 0x7FC00000 (FORMAT.md 1.5): CPUs return
// the quieted NaN operand, GPUs 0x7FFFFFFF.
template <Fp8 K>
GIFT_HD float decode_element(uint8_t code, float scale) {
  const float c = fp8_to_float<K>(code);
  if ((bits_of(c) & 0x7FFFFFFFu) >= 0x7F800000u) return c;
  const float v = c * scale;
  return v != v ? float_of(0x7FC00000u) : v;
}

// ---- 16-bit floats ------------------------------------------------------------------

GIFT_HD float bf16_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet).
GIFT_HD uint16_t bf16_from_float(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

GIFT_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (man << 13));
  if (exp == 0) return float_of(bits_of(float(man) * 5.9604644775390625e-8f) | sign);  // 2^-24
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

// fp32 -> IEEE binary16, round to nearest even, overflow to Inf, NaN stays NaN (quiet).
GIFT_HD uint16_t f16_from_float(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (a >= 0x38800000u) {                                              // normal half
    const uint32_t r = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    return static_cast<uint16_t>(sign | (r - (112u << 10)));
  }
  // Subnormal half: adding 2^-1 rounds |f| to a multiple of 2^-24 (the same trick as FP8).
  const uint32_t mag = bits_of(float_of(a) + 0.5f) - 0x3F000000u;
  return static_cast<uint16_t>(sign | mag);
}

}  // namespace gift::num
