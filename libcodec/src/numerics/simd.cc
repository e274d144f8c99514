#include "numerics/simd.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "numerics/hwy_targets.h"  // before Highway's headers

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/simd.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// The codes and the fp32 scales need hn::Div to be IEEE division, as it is on x86, Arm64 and
// the emulated targets; Highway 1.0.3 refines an estimate instead on Armv7 NEON.
#if HWY_ARCH_ARM_V7
#error "simd.cc needs IEEE vector division, which Highway does not give on Armv7"
#endif

#include "numerics/elementwise.h"
#include "numerics/shapes.h"

namespace gift::simd {
// Whether the AVX-512 encoder divides by fp32 scales through their reciprocals, and whether it
// reads long runs as parts (kReadStreams): by the CPU's vendor, or as
// set_reciprocal_division_for_test and set_read_in_parts_for_test say (defined once, below).
bool reciprocal_division_chosen();
bool read_in_parts_chosen();
}  // namespace gift::simd

HWY_BEFORE_NAMESPACE();
namespace gift::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using num::Fp8;
using num::Fp8Traits;

// x86 packs narrow two vectors into one within each 128-bit block; StoreCodes4 and the
// bf16 widening below are built on that.
#undef GIFT_X86_PACKS
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || \
                     HWY_TARGET == HWY_SSSE3)
#define GIFT_X86_PACKS 1
#else
#define GIFT_X86_PACKS 0
#endif

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// Widening loads: every source type becomes Lanes(DF) fp32 lanes, exactly. load4 widens
// 4 * Lanes(DF) elements for StoreCodes4, in memory order unless kZipped.
template <typename T>
struct Source;

template <typename T>
struct Consecutive {
  static constexpr bool kZipped = false;
  static void load4(DF d, const T* p, VF (&x)[4]) {
    const size_t lanes = hn::Lanes(d);
    for (size_t k = 0; k < 4; ++k) x[k] = Source<T>::load(d, p + k * lanes);
  }
};

// Source<T>::load(d, p) gives Lanes(d) elements as fp32: DF's, or a partial vector's (the
// census loads half vectors, which convert to double without an extraction).
template <>
struct Source<float> : Consecutive<float> {
  template <class D>
  static hn::Vec<D> load(D d, const float* p) {
    return hn::LoadU(d, p);
  }
  static float scalar(const float* p) { return *p; }
};

template <>
struct Source<uint16_t> {  // bf16: the upper half of an fp32
  template <class D>
  static hn::Vec<D> load(D d, const uint16_t* p) {
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint16_t, decltype(di)> d16;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(di, hn::LoadU(d16, p))));
  }
  static float scalar(const uint16_t* p) { return num::bf16_to_float(*p); }
#if GIFT_X86_PACKS
  // Interleaving with zeros widens in one instruction where load widens in two, but per
  // 128-bit block: x[0] and x[1] hold the low and high halves of each block of the first
  // 2 * Lanes(DF) elements, x[2] and x[3] of the next. StoreCodes4's packs undo exactly that.
  static constexpr bool kZipped = true;
  static void load4(DF d, const uint16_t* p, VF (&x)[4]) {
    const hn::Repartition<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    const auto zero = hn::Zero(d16);
    const auto a = hn::LoadU(d16, p), b = hn::LoadU(d16, p + hn::Lanes(d16));
    x[0] = hn::BitCast(d, hn::ZipLower(du, zero, a));
    x[1] = hn::BitCast(d, hn::ZipUpper(du, zero, a));
    x[2] = hn::BitCast(d, hn::ZipLower(du, zero, b));
    x[3] = hn::BitCast(d, hn::ZipUpper(du, zero, b));
  }
#else
  static constexpr bool kZipped = false;
  static void load4(DF d, const uint16_t* p, VF (&x)[4]) { Consecutive<uint16_t>::load4(d, p, x); }
#endif
};

// Highway converts fp16 with the instruction set's own conversion on x86 with F16C (AVX2
// and up) and on Arm64; elsewhere (x86 before AVX2, scalar and 128-bit emulation, ...) it
// emulates it, and 1.0.3's emulation reads exponent 31 as a normal binade: Inf and NaN come
// out finite. There the widening is done here instead, exactly: the magnitude's bits moved
// into fp32's fields and scaled by 2^112 (exact for subnormals too: no caller runs with
// denormals-are-zero, FpEnvGuard), exponent 31 sent to 255.
#undef GIFT_WIDEN_F16_HERE
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR)
#define GIFT_WIDEN_F16_HERE 0
#else
#define GIFT_WIDEN_F16_HERE 1
#endif

template <>
struct Source<hwy::float16_t> : Consecutive<hwy::float16_t> {
  template <class D>
  static hn::Vec<D> load(D d, const hwy::float16_t* p) {
#if GIFT_WIDEN_F16_HERE
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToSigned<D> di;
    const auto h =
        hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<D>(),
                                      hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p))));
    const auto mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(di, 0x7FFF)));
    const auto finite = hn::Mul(hn::BitCast(d, mag), hn::Set(d, 0x1p112f));
    const auto bits = hn::IfThenElse(hn::Gt(mag, hn::Set(di, 0x0F7FFFFF)),
                                     hn::Or(mag, hn::Set(di, 0x7F800000)), hn::BitCast(di, finite));
    return hn::BitCast(d, hn::Or(bits, hn::ShiftLeft<16>(hn::And(h, hn::Set(di, 0x8000)))));
#else
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, p));
#endif
  }
  static float scalar(const hwy::float16_t* p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return num::f16_to_float(h);
  }
};

// f(src as const T*), for T the element type Source reads for `dtype`: one switch for every
// entry point that takes a tensor of any input type.
template <typename F>
HWY_INLINE auto WithSource(const void* src, giftDType_t dtype, F&& f) {
  switch (dtype) {
    case GIFT_DTYPE_BF16:
      return f(static_cast<const uint16_t*>(src));
    case GIFT_DTYPE_F16:
      return f(static_cast<const hwy::float16_t*>(src));
    default:
      return f(static_cast<const float*>(src));
  }
}

template <typename T>
HWY_INLINE uint32_t AbsMaxBitsT(const T* src, size_t n) {
  const DF d;
  const DI di;
  const size_t lanes = hn::Lanes(d);
  const VI mask = hn::Set(di, 0x7FFFFFFF);
  VI m0 = hn::Zero(di), m1 = hn::Zero(di);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    m0 = hn::Max(m0, hn::And(hn::BitCast(di, Source<T>::load(d, src + i)), mask));
    m1 = hn::Max(m1, hn::And(hn::BitCast(di, Source<T>::load(d, src + i + lanes)), mask));
  }
  uint32_t m = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, hn::Max(m0, m1))));
  for (; i < n; ++i) {
    const uint32_t b = num::bits_of(Source<T>::scalar(src + i)) & 0x7FFFFFFFu;
    m = b > m ? b : m;
  }
  return m;
}

// The fp32 bits of the 16-bit source pattern `bits`, widened exactly.
template <typename T>
HWY_INLINE uint32_t WidenedBits(uint16_t bits) {
  T t;
  memcpy(&t, &bits, sizeof t);
  return num::bits_of(Source<T>::scalar(&t));
}

// 16-bit sources: both bf16 and fp16 are sign-magnitude, so the largest magnitude is the
// largest sign-cleared pattern, found on 16-bit lanes (twice as many per vector) and
// widened once.
template <typename T>
HWY_INLINE uint32_t AbsMaxBits16(const T* src, size_t n) {
  const hn::ScalableTag<int16_t> d;
  const size_t lanes = hn::Lanes(d);
  const int16_t* p = reinterpret_cast<const int16_t*>(src);
  const auto mask = hn::Set(d, int16_t(0x7FFF));
  auto m0 = hn::Zero(d), m1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, p + i), mask));
    m1 = hn::Max(m1, hn::And(hn::LoadU(d, p + i + lanes), mask));
  }
  int16_t m = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  for (; i < n; ++i) m = std::max<int16_t>(m, static_cast<int16_t>(p[i] & 0x7FFF));
  return WidenedBits<T>(static_cast<uint16_t>(m));
}

template <>
HWY_INLINE uint32_t AbsMaxBitsT(const uint16_t* src, size_t n) {
  return AbsMaxBits16(src, n);
}

template <>
HWY_INLINE uint32_t AbsMaxBitsT(const hwy::float16_t* src, size_t n) {
  return AbsMaxBits16(src, n);
}

#undef GIFT_SQUARE_LANES
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR && HWY_HAVE_FLOAT64
#define GIFT_SQUARE_LANES 1
// The census's eight lanes of squares in double, held in vectors, and with kMax the largest
// sign-cleared fp32 pattern seen. add() takes kStep elements (a multiple of 8) whose first goes to
// lane 0: a half vector of squares at a time, each lane's in element order. The square of an fp32
// value is exact in double, so a fused multiply-add rounds like the scalar sum.
template <bool kMax = true>
struct SquareLanes {
  using DH = hn::Half<DF>;
  using DHI = hn::RebindToSigned<DH>;
  using DD = hn::Rebind<double, DH>;
  // Doubles per half vector: 8 (one accumulator for all lanes), 4 (two) or 2 (four).
  static constexpr size_t kHalf = hn::MaxLanes(DD()), kAcc = 8 / kHalf;
  static_assert(kAcc * kHalf == 8 && kAcc <= 4, "lane layout");
  static constexpr size_t kStep = 2 * kHalf * (kAcc == 4 ? 2 : 1);

  hn::Vec<DD> a0, a1, a2, a3;
  hn::Vec<DHI> vmax;

  explicit SquareLanes(const double* lanes) : vmax(hn::Zero(DHI())) {
    const DD dd;
    a0 = a1 = a2 = a3 = hn::LoadU(dd, lanes);
    if constexpr (kAcc >= 2) a1 = hn::LoadU(dd, lanes + kHalf);
    if constexpr (kAcc == 4) {
      a2 = hn::LoadU(dd, lanes + 2 * kHalf);
      a3 = hn::LoadU(dd, lanes + 3 * kHalf);
    }
  }
  template <typename T>
  HWY_INLINE void add(const T* p) {
    if constexpr (kAcc == 1) {
      add_halves(p, a0, a0);
    } else if constexpr (kAcc == 2) {
      add_halves(p, a0, a1);
    } else {
      add_halves(p, a0, a1);
      add_halves(p + 2 * kHalf, a2, a3);
    }
  }
  template <typename T>
  HWY_INLINE void add_halves(const T* p, hn::Vec<DD>& lo_acc, hn::Vec<DD>& hi_acc) {
    const DH dh;
    // Half vectors loaded and widened on their own need no extraction. Census in L2, one thread,
    // Zen 4, elements/ns: AVX-512 fp32 13.8 -> 15.3, bf16 9.9 -> 11.5, fp16 9.8 -> 15.0; AVX2
    // fp32 15.4 -> 25.0. Below 512 bits a 16-bit half costs each widening step again (bf16 and
    // fp16 by halves 2-32% slower under AVX2 and SSE4): there they widen the whole vector.
    if constexpr (!std::is_same_v<T, float> && kAcc > 1) {
      const VF v = Source<T>::load(DF(), p);
      square_into(hn::LowerHalf(dh, v), lo_acc);
      square_into(hn::UpperHalf(dh, v), hi_acc);
    } else {
      square_into(Source<T>::load(dh, p), lo_acc);
      square_into(Source<T>::load(dh, p + kHalf), hi_acc);
    }
  }
  HWY_INLINE void square_into(hn::Vec<DH> v, hn::Vec<DD>& acc) {
    const DHI di;
    if constexpr (kMax) vmax = hn::Max(vmax, hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF)));
    const auto x = hn::PromoteTo(DD(), v);
    acc = hn::MulAdd(x, x, acc);
  }
  // Writes the lanes back; returns the largest magnitude's bits (with kMax; else 0).
  uint32_t store(double* lanes) const {
    const DD dd;
    hn::StoreU(a0, dd, lanes);
    if constexpr (kAcc >= 2) hn::StoreU(a1, dd, lanes + kHalf);
    if constexpr (kAcc == 4) {
      hn::StoreU(a2, dd, lanes + 2 * kHalf);
      hn::StoreU(a3, dd, lanes + 3 * kHalf);
    }
    return kMax ? static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(DHI(), vmax))) : 0u;
  }
};
#else
#define GIFT_SQUARE_LANES 0
#endif

// lanes[(phase + k) % 8] += x[k]^2 in double for k in order, and the largest sign-cleared
// fp32 pattern, in one pass (the frame statistics' census: one read of the input); each lane
// adds its elements in the same order whatever the vector width.
template <typename T>
HWY_INLINE uint32_t AbsMaxAddSquaresT(const T* src, size_t n, size_t phase, double* lanes) {
  uint32_t m = 0;
  const auto scalar = [&](size_t k) {
    const float x = Source<T>::scalar(src + k);
    m = std::max(m, num::bits_of(x) & 0x7FFFFFFFu);
    lanes[(phase + k) % 8] += double(x) * double(x);
  };
  size_t k = 0;
  for (; k < n && (phase + k) % 8; ++k) scalar(k);
#if GIFT_SQUARE_LANES
  SquareLanes<> acc(lanes);
  for (; k + SquareLanes<>::kStep <= n; k += SquareLanes<>::kStep) acc.add(src + k);
  m = std::max(m, acc.store(lanes));
#endif
  for (; k < n; ++k) scalar(k);
  return m;
}

uint32_t AbsMaxAddSquares(const void* src, giftDType_t dtype, size_t n, size_t phase,
                          double* lanes) {
  return WithSource(src, dtype,
                    [&](const auto* s) { return AbsMaxAddSquaresT(s, n, phase, lanes); });
}

// Spans summed side by side in AddSquaresChunksT: each lane's additions are a chain of
// dependent FMAs (4 cycles each, 0.5 cycle per element with all eight lanes in one vector),
// which independent chains overlap; the spans are also read as that many streams.
constexpr size_t kSideBySide = 4;

// With kMax, the spans' largest magnitudes too (amax_bits), else not (amax_bits unused).
template <typename T, bool kMax>
void AddSquaresChunksT(const T* src, size_t chunk, size_t chunks, double (*lanes)[8],
                       uint32_t* amax_bits) {
  size_t c = 0;
#if GIFT_SQUARE_LANES
  using Lanes = SquareLanes<kMax>;
  if (chunk % Lanes::kStep == 0) {
    static const double kZeros[8] = {};
    for (; c + kSideBySide <= chunks; c += kSideBySide) {
      Lanes acc[kSideBySide] = {Lanes(kZeros), Lanes(kZeros), Lanes(kZeros), Lanes(kZeros)};
      static_assert(kSideBySide == 4, "one initializer per span");
      const T* p = src + c * chunk;
      for (size_t k = 0; k < chunk; k += Lanes::kStep) {
        for (size_t j = 0; j < kSideBySide; ++j) acc[j].add(p + j * chunk + k);
      }
      for (size_t j = 0; j < kSideBySide; ++j) {
        const uint32_t bits = acc[j].store(lanes[c + j]);
        if constexpr (kMax) amax_bits[c + j] = bits;
      }
    }
  }
#endif
  for (; c < chunks; ++c) {
    std::fill(lanes[c], lanes[c] + 8, 0.0);
    const uint32_t bits = AbsMaxAddSquaresT(src + c * chunk, chunk, 0, lanes[c]);
    if constexpr (kMax) amax_bits[c] = bits;
  }
}

void AddSquaresChunks(const void* src, giftDType_t dtype, size_t chunk, size_t chunks,
                      double (*lanes)[8], uint32_t* amax_bits) {
  WithSource(src, dtype, [&](const auto* s) {
    amax_bits
        ? AddSquaresChunksT<std::decay_t<decltype(*s)>, true>(s, chunk, chunks, lanes, amax_bits)
        : AddSquaresChunksT<std::decay_t<decltype(*s)>, false>(s, chunk, chunks, lanes, nullptr);
  });
}

// The vector form of num::fp8_from_float_rn, for any input.
template <Fp8 K>
HWY_INLINE VI ConvertRN(DF d, VF v) {
  using Tr = Fp8Traits<K>;
  constexpr int kShift = 23 - Tr::kMantBits;
  const DI di;
  const VI u = hn::BitCast(di, v);
  const VI sign = hn::And(hn::ShiftRight<24>(u), hn::Set(di, 0x80));
  const VI a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const VI r = hn::ShiftRight<kShift>(hn::Add(hn::Add(a, hn::Set(di, (1 << (kShift - 1)) - 1)),
                                              hn::And(hn::ShiftRight<kShift>(a), hn::Set(di, 1))));
  const VI normal = hn::Min(hn::Sub(r, hn::Set(di, (127 - Tr::kBias) << Tr::kMantBits)),
                            hn::Set(di, Tr::kMaxCode));
  const VF magic = hn::Set(d, num::float_of(Tr::kSubnormalMagicBits));
  const VI sub = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(d, a), magic)),
                         hn::Set(di, static_cast<int32_t>(Tr::kSubnormalMagicBits)));
  const VI mag =
      hn::IfThenElse(hn::Lt(a, hn::Set(di, static_cast<int32_t>(Tr::kMinNormalBits))), sub, normal);
  return hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x7F800000)), hn::Set(di, num::kNanCode),
                        hn::Or(mag, sign));
}

// The same rule in fewer instructions for |v| < 2^17, in two steps. The magnitude before
// saturation: MagnitudeOf takes a = |v| (+0 included) and returns its code times 2^kAt, in six
// instructions where multiply-adds are fused (eight where they are not). With e the exponent of a
// clamped below at the smallest normal one (subnormals round at their fixed step), t = 2^e (a's
// exponent field, or the clamp's) and m = t * 2^(23 - M) lie on the grid of a's FP8 step, and a + m
// stays in m's binade (a < 2^(e + 1), far below m), where fp32's step is that FP8 step: RN(a + m) -
// m is a rounded to its step, exactly, ties to even (m / step = 2^23 is even). (t = 1.5 * 2^e, as
// before, needed an OR beside the AND where there is no OrAnd instruction. Without it, the bytes
// the same, encode of 512 KiB in cache, six processes per build alternated, medians of 2000 rounds:
// AVX2 fp32 36-40 to 33-34 us, bf16 35-36 to 33-35, SSE4 fp32 68 to 63; giftc bench --threads 1
// made to run AVX2, 0.630 to 0.673 of memcpy.) Products by powers of two are exact, so the sum is
// one fused multiply-add, and subtracting m is fused with the exact scaling by 2^-(127 - bias):
// both (a rounded) * 2^-(127 - bias) and m * 2^-(127 - bias) = t * 2^(bias - 104 - M) are
// representable (the latter normal, since e >= 1 - bias). Where MulAdd and MulSub are emulated, as
// a product then a sum, the products are exact too (sum * 2^-(127 - bias) is normal, as sum >= m),
// so the bytes are the same. That leaves the FP8 code in fp32 bits [30 - M .. 23 - M], fp32
// subnormals included (no flush-to-zero is ever enabled), below 2^8 since a < 2^17.
template <Fp8 K, int kAt = 0>
HWY_INLINE VI MagnitudeOf(DF d, VF a) {
  using Tr = Fp8Traits<K>;
  constexpr int kShift = 23 - Tr::kMantBits;
  constexpr int kRebias = 127 - Tr::kBias;
  const DI di;
  const VI t = hn::Max(hn::And(hn::BitCast(di, a), hn::Set(di, 0x7F800000)),
                       hn::Set(di, static_cast<int32_t>(Tr::kMinNormalBits)));
  const VF sum = hn::MulAdd(hn::BitCast(d, t), hn::Set(d, float(1 << kShift)), a);
  const VF m_rebiased = hn::BitCast(d, hn::Sub(t, hn::Set(di, (kRebias - kShift) << 23)));
  const VF rebiased =
      hn::MulSub(sum, hn::Set(d, num::float_of(uint32_t(Tr::kBias) << 23)), m_rebiased);
  return hn::ShiftRight<kShift - kAt>(hn::BitCast(di, rebiased));
}

template <Fp8 K>
HWY_INLINE VI MagnitudeRNBounded(DF d, VF v) {
  return MagnitudeOf<K>(d, hn::Abs(v));
}

// Then saturation to the largest finite code, and the sign of x, the unscaled input: v's own
// sign except where v is a zero whose sign a division lost (FaithfulQuotient). StoreCodes4 and
// Bf16Pairs::store do these two steps on bytes, for four vectors at once.
template <Fp8 K>
HWY_INLINE VI ConvertRNBounded(DF d, VF v, VF x) {
  const DI di;
  const VI mag = hn::Min(MagnitudeRNBounded<K>(d, v), hn::Set(di, Fp8Traits<K>::kMaxCode));
  return hn::OrAnd(mag, hn::ShiftRight<24>(hn::BitCast(di, x)), hn::Set(di, 0x80));
}

// Codes are in [0, 255]: keeping the low byte of each lane is exact.
HWY_INLINE void StoreCodes(VI c, uint8_t* codes) {
  const hn::Rebind<uint8_t, DF> d8;
  hn::StoreU(hn::TruncateTo(d8, hn::BitCast(hn::RebindToUnsigned<DF>(), c)), d8, codes);
}

// Four vectors of codes at once, from the vectors Source<T>::load4 gives (kZipped as it
// says). x86 narrows two vectors into one within each 128-bit block, so two rounds of
// saturating packs (exact on [0, 255]) leave in 32-bit group 4k + j the bytes of vector j's
// block k, or for zipped vectors in 64-bit group 2k + j the bytes of load j's block k; one
// permutation puts them in order. That is 4 instructions where 4 truncations take 8 to 16.
// With kMagnitudes, c holds MagnitudeRNBounded of the scaled inputs, and ConvertRNBounded's
// last two steps are done on the 4 * Lanes(DF) bytes at once: saturation (the packs keep
// magnitudes below 2^8 exact), and the sign of the unscaled inputs x, which the same signed
// saturating packs of x's bits carry to bit 7 of each byte (x is finite, so a negative x is
// below -2^15 as an int32).
#if GIFT_X86_PACKS && HWY_TARGET <= HWY_AVX3
// AVX-512: 64 code bytes packed in 128-bit blocks, put in element order and stored: in 64-bit
// groups (kZipped: group 2k + j holds load j's block k) or 32-bit ones (group 4k + j, vector
// j's block k).
template <bool kZipped>
HWY_INLINE void StoreInOrder(__m512i p, uint8_t* codes) {
  const __m512i order =
      kZipped ? _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7)
              : _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(
      codes, kZipped ? _mm512_permutexvar_epi64(order, p) : _mm512_permutexvar_epi32(order, p));
}

// The same for magnitudes p, saturated to the largest finite code, with the signs in bit 7 of
// the bytes of s (in p's order).
template <Fp8 K, bool kZipped>
HWY_INLINE void SaturateSignStore(__m512i p, __m512i s, uint8_t* codes) {
  StoreInOrder<kZipped>(
      _mm512_ternarylogic_epi32(_mm512_min_epu8(p, _mm512_set1_epi8(Fp8Traits<K>::kMaxCode)), s,
                                _mm512_set1_epi8(char(0x80)), 0xF8),  // a | (b & c)
      codes);
}
#endif

template <Fp8 K, bool kZipped, bool kMagnitudes>
HWY_INLINE void StoreCodes4(const VI (&c)[4], const VF (&x)[4], uint8_t* codes) {
#if GIFT_X86_PACKS
  const DI di;
#endif
#if GIFT_X86_PACKS && HWY_TARGET <= HWY_AVX3
  const __m512i p = _mm512_packus_epi16(_mm512_packs_epi32(c[0].raw, c[1].raw),
                                        _mm512_packs_epi32(c[2].raw, c[3].raw));
  if (kMagnitudes) {
    const __m512i s = _mm512_packs_epi16(
        _mm512_packs_epi32(hn::BitCast(di, x[0]).raw, hn::BitCast(di, x[1]).raw),
        _mm512_packs_epi32(hn::BitCast(di, x[2]).raw, hn::BitCast(di, x[3]).raw));
    SaturateSignStore<K, kZipped>(p, s, codes);
    return;
  }
  StoreInOrder<kZipped>(p, codes);
#elif GIFT_X86_PACKS && HWY_TARGET == HWY_AVX2
  __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(c[0].raw, c[1].raw),
                                  _mm256_packs_epi32(c[2].raw, c[3].raw));
  if (kMagnitudes) {
    const __m256i s = _mm256_packs_epi16(
        _mm256_packs_epi32(hn::BitCast(di, x[0]).raw, hn::BitCast(di, x[1]).raw),
        _mm256_packs_epi32(hn::BitCast(di, x[2]).raw, hn::BitCast(di, x[3]).raw));
    p = _mm256_or_si256(_mm256_min_epu8(p, _mm256_set1_epi8(Fp8Traits<K>::kMaxCode)),
                        _mm256_and_si256(s, _mm256_set1_epi8(char(0x80))));
  }
  const __m256i order = kZipped ? _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)
                                : _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_permutevar8x32_epi32(p, order));
#elif GIFT_X86_PACKS
  // One 128-bit block: the packs leave every kind of vector in order.
  __m128i p =
      _mm_packus_epi16(_mm_packs_epi32(c[0].raw, c[1].raw), _mm_packs_epi32(c[2].raw, c[3].raw));
  if (kMagnitudes) {
    const __m128i s =
        _mm_packs_epi16(_mm_packs_epi32(hn::BitCast(di, x[0]).raw, hn::BitCast(di, x[1]).raw),
                        _mm_packs_epi32(hn::BitCast(di, x[2]).raw, hn::BitCast(di, x[3]).raw));
    p = _mm_or_si128(_mm_min_epu8(p, _mm_set1_epi8(Fp8Traits<K>::kMaxCode)),
                     _mm_and_si128(s, _mm_set1_epi8(char(0x80))));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), p);
#else
  static_assert(!kZipped, "only x86 loads zipped");
  const DI di;
  const size_t lanes = hn::Lanes(DF());
  for (size_t k = 0; k < 4; ++k) {
    const VI code = kMagnitudes
                        ? hn::OrAnd(hn::Min(c[k], hn::Set(di, Fp8Traits<K>::kMaxCode)),
                                    hn::ShiftRight<24>(hn::BitCast(di, x[k])), hn::Set(di, 0x80))
                        : c[k];
    StoreCodes(code, codes + k * lanes);
  }
#endif
}

// bf16 for the bounded conversion on AVX-512, in pairs: a 32-bit lane of a load holds two
// elements, the even one in its low half. Their signs cleared (one AND for two), the even ones
// are widened by a shift (vectors 0 and 2 of a step) and the odd ones by clearing the low half
// (vectors 1 and 3): as Source<uint16_t>::load4's vectors 2j and 2j + 1, they hold the
// elements of load j. Their codes come back two to a lane, the odd one in the high half
// (MagnitudeOf<K, 16>), so that one pack of the two loads' lanes leaves the bytes of each
// 128-bit block in order, as the same saturating pack of the loads themselves leaves their
// signs. Unpacking the loads (Source::load4) puts 4 + 3 + 3 instructions a step on the one
// shuffle port (the unpacks, and the packs of the codes and of the signs), pairs 0 + 1 + 1, and
// 4 fewer in all. bench_codec, one thread, bf16 in cache (1 MiB of fp32 as GIFT_BENCH_BYTES),
// fastest of 8 interleaved rounds: 60.2 -> 54.7 us. AVX2 divides by fp32 scales instead of
// multiplying by their reciprocals, and the division bounds it: 101.3 -> 101.0 us that way, so
// it unpacks (with E8M0 scales, which multiply, unmeasured).
#undef GIFT_BF16_PAIRS
#if GIFT_X86_PACKS && HWY_TARGET <= HWY_AVX3
#define GIFT_BF16_PAIRS 1
struct Bf16Pairs {
  VI loads[2];
  HWY_INLINE void load(DF d, const uint16_t* p, VF (&x)[4]) {
    const DI di;
    const hn::Repartition<uint16_t, DF> d16;
    for (size_t j = 0; j < 2; ++j) {
      loads[j] = hn::BitCast(di, hn::LoadU(d16, p + j * hn::Lanes(d16)));
      const VI a = hn::And(loads[j], hn::Set(di, 0x7FFF7FFF));
      x[2 * j] = hn::BitCast(d, hn::ShiftLeft<16>(a));
      x[2 * j + 1] = hn::BitCast(d, hn::And(a, hn::Set(di, int32_t(0xFFFF0000u))));
    }
  }
  // c[2j] holds the even elements' magnitudes (MagnitudeOf<K>), c[2j + 1] the odd ones'
  // (MagnitudeOf<K, 16>).
  template <Fp8 K>
  HWY_INLINE void store(const VI (&c)[4], uint8_t* codes) const {
    const __m512i p = _mm512_packus_epi16(_mm512_or_si512(c[0].raw, c[1].raw),
                                          _mm512_or_si512(c[2].raw, c[3].raw));
    SaturateSignStore<K, true>(p, _mm512_packs_epi16(loads[0].raw, loads[1].raw), codes);
  }
};
#else
#define GIFT_BF16_PAIRS 0
#endif

// One bounded 4-vector step: the codes of 4 * Lanes(DF) elements at src, vector k scaled by
// scaled(x, k) (x: its inputs; k for its block's factor), loaded as Source<T>::load4 does
// (kZipped) or in order, or for bf16 in pairs where that pays (Bf16Pairs, which keeps
// load4's grouping).
template <typename T, Fp8 K, bool kZipped, typename Scaled>
HWY_INLINE void BoundedStep4(const T* src, const Scaled& scaled, uint8_t* codes) {
  const DF d;
  VF x[4];
  VI c[4];
#if GIFT_BF16_PAIRS
  constexpr bool kPairs = kZipped && std::is_same_v<T, uint16_t>;
#else
  constexpr bool kPairs = false;
#endif
  if constexpr (kPairs) {
#if GIFT_BF16_PAIRS
    Bf16Pairs pairs;
    pairs.load(d, src, x);
    for (size_t j = 0; j < 2; ++j) {
      c[2 * j] = MagnitudeOf<K>(d, scaled(x[2 * j], 2 * j));
      c[2 * j + 1] = MagnitudeOf<K, 16>(d, scaled(x[2 * j + 1], 2 * j + 1));
    }
    pairs.store<K>(c, codes);
#endif
  } else {
    if constexpr (kZipped) {
      Source<T>::load4(d, src, x);
    } else {
      Consecutive<T>::load4(d, src, x);
    }
    for (size_t k = 0; k < 4; ++k) c[k] = MagnitudeRNBounded<K>(d, scaled(x[k], k));
    StoreCodes4<K, kZipped, true>(c, x, codes);
  }
}

// How x is scaled before its conversion: x * f, or x / f (FORMAT.md's rule: the quotient
// rounded to fp32, then to FP8).
enum class Scaling { kMultiply, kDivide };

// x / s to within an fp32 ulp, from z = RN(1/s) in one multiplication and two fused
// multiply-adds, q0 = RN(x z) and q1 = RN(q0 + RN(x - q0 s) z): a division costs more (AVX-512:
// one vdivps per 8 to 10 cycles, against two FMAs per cycle). q1 is faithful (one of the two
// fp32 neighbours of x/s), not shown to be RN(x/s), FORMAT.md's quotient; its code is shown to
// be RN(x/s)'s for finite x, s in [kReciprocalMin, kReciprocalMax] (where z is normal) and
// |x/s| < 2^17 (the bounded conversion's domain; past 2^128, x z overflows):
// - With u = 2^-24, z = (1 + e) / s and q0 = (1 + d) x/s with |e| <= u and |d| <= 2u + u^2;
//   the remainder is rounded at most once (relative error t, |t| <= u), so the sum q1 rounds
//   is (1 - d (e + t + e t)) x/s: within 4.0001 u^2 of x/s, relative.
// - Its code can differ from RN(x/s)'s only if a midpoint between an FP8 halfway point h and
//   one of its fp32 neighbours (elsewhere both sides round to one code) lies within that
//   distance of x/s. Quotients of fp32 numbers come that close to those few midpoints for
//   few pairs, which DivisionNextToFp32MidpointsEqualsScalarRule enumerates (every one within
//   8 u^2, up to a power of two common to x and s: 2722) and checks: q0's codes differ from
//   RN(x/s)'s on 663 of them, q1's on none. A third step (Markstein's correction, which
//   gives RN(x/s) itself) changed no code and is left out: 5 operations cost 4.1 elements/ns
//   of encode in cache on Zen 4, 3 cost 4.4.
// - Nothing underflows where the code can be nonzero: |x/s| >= 2^-20 gives |x| >= 2^-100 and
//   a remainder on a grid of 2^-147 or coarser, exact where it is subnormal. Where |x/s| <
//   2^-20 the code is a signed zero on both paths: each step stays within a few fp32 ulps (or
//   subnormal steps) of x/s, so q1 stays below 2^-19.
// - The sign is x's, as the quotient's is (s > 0), except that of a zero: RN(a + b) of an
//   exact cancellation is +0 whatever x's sign. The conversions take the code's sign from x
//   (ConvertRNBounded, StoreCodes4) or from the loads (Bf16Pairs), so the quotient's magnitude
//   is all that is used.
// It needs a true FMA (HWY_NATIVE_FMA; elsewhere MulAdd rounds twice), and is compiled where
// it can pay: AVX-512. There the CPU decides (reciprocal_division_chosen): an Intel Xeon's
// vdivps costs as much per lane as the 256-bit one while the rest of the work is twice as fast
// (encode in cache 12 to 14% faster this way, measured with the third step), but AMD's Zen 4
// runs 512-bit FMAs as two 256-bit halves too, and the division measured faster there
// (encode_blocks_rn in cache, blocks of 128: fp32 4.1 -> 4.9 elements/ns with the third step,
// 4.4 -> 4.9 without). On AVX2 the division stays (without the third step too: on Zen 4,
// fp32 blocks of 128 encode at 2.86 elements/ns this way against 3.00 dividing); other
// targets are unmeasured.
#undef GIFT_RECIPROCAL_PAYS
#if HWY_NATIVE_FMA && HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define GIFT_RECIPROCAL_PAYS 1
#else
#define GIFT_RECIPROCAL_PAYS 0
#endif
constexpr float kReciprocalMin = 0x1p-80f, kReciprocalMax = 0x1p+125f;

HWY_INLINE bool ReciprocalApplies(float s) { return s >= kReciprocalMin && s <= kReciprocalMax; }

// Whether this call divides through FaithfulQuotient (where its domain allows): the same
// bytes either way.
HWY_INLINE bool ReciprocalChosen() {
#if GIFT_RECIPROCAL_PAYS
  return reciprocal_division_chosen();
#else
  return false;
#endif
}

HWY_INLINE VF FaithfulQuotient(VF x, VF s, VF z) {
  const VF q0 = hn::Mul(x, z);
  return hn::MulAdd(hn::NegMulAdd(q0, s, x), z, q0);
}

// The running largest sign-cleared pattern of groups of 4 * Lanes(DF) elements, for the
// encoder's loop that takes the next block's amax beside the current block's codes: on fp32
// lanes, or for 16-bit sources on 16-bit lanes, as AbsMaxBits16.
template <typename T>
struct AmaxLanes {
  VI m;
  HWY_INLINE AmaxLanes() : m(hn::Zero(DI())) {}
  HWY_INLINE void add4(const T* p) {
    const DF d;
    const DI di;
    const size_t lanes = hn::Lanes(d);
    for (size_t k = 0; k < 4; ++k) {
      m = hn::Max(
          m, hn::And(hn::BitCast(di, Source<T>::load(d, p + k * lanes)), hn::Set(di, 0x7FFFFFFF)));
    }
  }
  HWY_INLINE uint32_t bits() const {
    return static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(DI(), m)));
  }
};

#if HWY_TARGET != HWY_SCALAR  // one lane of any type there
template <typename T>
struct AmaxLanes16 {
  using DI16 = hn::Repartition<int16_t, DF>;
  hn::Vec<DI16> m;
  HWY_INLINE AmaxLanes16() : m(hn::Zero(DI16())) {}
  HWY_INLINE void add4(const T* p) {
    const DI16 d;
    const int16_t* q = reinterpret_cast<const int16_t*>(p);
    m = hn::Max(m, hn::And(hn::LoadU(d, q), hn::Set(d, int16_t(0x7FFF))));
    m = hn::Max(m, hn::And(hn::LoadU(d, q + hn::Lanes(d)), hn::Set(d, int16_t(0x7FFF))));
  }
  HWY_INLINE uint32_t bits() const {
    return WidenedBits<T>(static_cast<uint16_t>(hn::GetLane(hn::MaxOfLanes(DI16(), m))));
  }
};

template <typename T>
using AmaxOf = std::conditional_t<sizeof(T) == 2, AmaxLanes16<T>, AmaxLanes<T>>;
#else
template <typename T>
using AmaxOf = AmaxLanes<T>;
#endif

// Which cache the lines fetched ahead go to (FetchToFor says which, and why).
enum class FetchTo { kL1, kL2 };

HWY_INLINE void PrefetchLine(const char* p, FetchTo where) {
  if (where == FetchTo::kL2) {
    __builtin_prefetch(p, 0, 2);
  } else {
    hwy::Prefetch(p);
  }
}

HWY_INLINE void PrefetchBytes(const char* base, uint64_t from, uint64_t to, FetchTo where) {
  for (uint64_t i = from; i < to; i += 64) PrefetchLine(base + i, where);
}

// The lines a loop over a block or a batch fetches ahead as it goes: at each step's offset, the
// step's share of the len bytes at base + at (none by default). As for small blocks
// (kSmallFetchAhead), a block's lines fetched at once measured slower than step by step beside its
// codes: giftc bench --threads 1, fp32 from memory, blocks of 256, four sets of 3 to 6 interleaved
// rounds, medians 0.47-0.52 to 0.49-0.59 of memcpy (one set even); blocks of 1024 0.47 to 0.51;
// blocks of 128 the same. A loop's step is a size known when compiling (step<kBytes>, kStepBytes),
// so that a step within the range fetches its lines without a loop: the loop's bounds took about 10
// instructions per step beside some 54 vector ones (AVX2, fp32). A harness timing giftEncode of
// 512 KiB of fp32 in cache, one thread, blocks of 128, 20 to 30 alternated processes per build,
// medians (Zen 4, made to run AVX2, an hour when its other hardware thread was busy most of the
// time): 33.5 to 32.0 us; blocks of 1024 26.1 to 24.8; AVX-512 27.4 to 23.9. giftc bench
// --threads 1 made to run AVX2, ten interleaved rounds: encode 0.657 to 0.680 of memcpy.
static_assert(!HWY_HAVE_SCALABLE, "kStepLanes is a step's size (hwy_targets.h)");
constexpr size_t kStepLanes = 4 * hn::MaxLanes(DF());  // elements of a 4-vector step
template <typename T>
constexpr size_t kStepBytes = kStepLanes * sizeof(T);  // a 4-vector step's source

struct Fetch {
  const char* base = nullptr;
  uint64_t at = 0, len = 0;
  FetchTo where = FetchTo::kL1;
  template <uint64_t kBytes>
  HWY_INLINE void step(uint64_t offset) const {
    if (offset + kBytes <= len) {
      for (uint64_t i = 0; i < kBytes; i += 64) PrefetchLine(base + at + offset + i, where);
    } else {
      rest(offset);
    }
  }
  HWY_INLINE void rest(uint64_t offset) const {
    if (offset < len) PrefetchBytes(base + at, offset, len, where);
  }
  HWY_INLINE void all() const { rest(0); }
};

// The loop of QuantizeT. With kReciprocal, x / factor comes from FaithfulQuotient with
// reciprocal = RN(1 / factor), whose domain the caller checked; it needs kBounded (finite x),
// and factor > 0 as every scale is. With kAmaxNext, it also returns AbsMaxBitsT(next, n).
template <typename T, Fp8 K, Scaling kS, bool kBounded, bool kReciprocal, bool kAmaxNext>
HWY_INLINE uint32_t QuantizeLoop(const T* src, size_t n, float factor, float reciprocal,
                                 uint8_t* codes, const T* next, const Fetch& fetch) {
  static_assert(!kReciprocal || (kS == Scaling::kDivide && kBounded), "FaithfulQuotient's domain");
  const DF d;
  const size_t lanes = hn::Lanes(d);
  const VF f = hn::Set(d, factor);
  const VF z = hn::Set(d, reciprocal);
  const auto scaled = [&](VF x) {
    if constexpr (kS == Scaling::kMultiply) return hn::Mul(x, f);
    if constexpr (kReciprocal) return FaithfulQuotient(x, f, z);
    return hn::Div(x, f);
  };
  const auto code_at = [&](size_t i) {
    const VF x = Source<T>::load(d, src + i), v = scaled(x);
    return kBounded ? ConvertRNBounded<K>(d, v, x) : ConvertRN<K>(d, v);
  };
  AmaxOf<T> amax;
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    fetch.step<kStepBytes<T>>(i * sizeof(T));
    if constexpr (kAmaxNext) amax.add4(next + i);
    if constexpr (kBounded) {
      BoundedStep4<T, K, Source<T>::kZipped>(
          src + i, [&](VF x, size_t) { return scaled(x); }, codes + i);
    } else {
      VF x[4];
      VI c[4];
      Source<T>::load4(d, src + i, x);
      for (size_t k = 0; k < 4; ++k) c[k] = ConvertRN<K>(d, scaled(x[k]));
      StoreCodes4<K, Source<T>::kZipped, false>(c, x, codes + i);
    }
  }
  fetch.rest(i * sizeof(T));  // the rest, past the whole steps
  // Blocks of whole 4-vector steps (those of 128 elements on the x86 targets) skip the tail's
  // AbsMaxBitsT: on no elements it still reduces its vectors across lanes, which cost a 7%
  // slower block encode.
  const uint32_t amax_bits =
      kAmaxNext ? (i == n ? amax.bits() : std::max(amax.bits(), AbsMaxBitsT(next + i, n - i))) : 0;
  for (; i + lanes <= n; i += lanes) StoreCodes(code_at(i), codes + i);
  for (; i < n; ++i) {
    const float x = Source<T>::scalar(src + i);
    codes[i] = num::fp8_from_float_rn<K>(kS == Scaling::kDivide ? x / factor : x * factor);
  }
  return amax_bits;
}

// The bounded conversion divides through FaithfulQuotient where `recip` (ReciprocalChosen)
// and its domain allow, with RN(1 / factor) from `reciprocal` where the caller has it (the
// block encoder's, from BatchScalesF32), else taken here.
template <typename T, Fp8 K, Scaling kS, bool kBounded, bool kAmaxNext = false>
HWY_INLINE uint32_t QuantizeT(const T* src, size_t n, float factor, uint8_t* codes, bool recip,
                              const float* reciprocal = nullptr, const T* next = nullptr,
                              const Fetch& fetch = Fetch()) {
  if constexpr (kS == Scaling::kDivide && kBounded && GIFT_RECIPROCAL_PAYS) {
    if (recip && ReciprocalApplies(factor)) {
      return QuantizeLoop<T, K, Scaling::kDivide, true, true, kAmaxNext>(
          src, n, factor, reciprocal ? *reciprocal : 1.0f / factor, codes, next, fetch);
    }
  }
  return QuantizeLoop<T, K, kS, kBounded, false, kAmaxNext>(src, n, factor, 1.0f, codes, next,
                                                            fetch);
}

template <bool kBounded, typename T>
void QuantizeOf(const T* s, size_t n, float factor, bool divide, giftFp8Kind_t kind,
                uint8_t* codes) {
  const bool recip = ReciprocalChosen();
  if (kind == GIFT_FP8_E4M3) {
    divide ? QuantizeT<T, Fp8::kE4M3, Scaling::kDivide, kBounded>(s, n, factor, codes, recip)
           : QuantizeT<T, Fp8::kE4M3, Scaling::kMultiply, kBounded>(s, n, factor, codes, recip);
  } else {
    divide ? QuantizeT<T, Fp8::kE5M2, Scaling::kDivide, kBounded>(s, n, factor, codes, recip)
           : QuantizeT<T, Fp8::kE5M2, Scaling::kMultiply, kBounded>(s, n, factor, codes, recip);
  }
}

template <bool kBounded>
void QuantizeDispatch(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                      giftFp8Kind_t kind, uint8_t* codes) {
  WithSource(src, dtype,
             [&](const auto* s) { QuantizeOf<kBounded>(s, n, factor, divide, kind, codes); });
}

uint32_t AbsMaxBits(const void* src, giftDType_t dtype, size_t n) {
  return WithSource(src, dtype, [&](const auto* s) { return AbsMaxBitsT(s, n); });
}

void BlocksAbsMaxBits(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                      uint32_t* bits) {
  WithSource(src, dtype, [&](const auto* s) {
    for (size_t k = 0, i = 0; i < n; ++k, i += block)
      bits[k] = std::max(bits[k], AbsMaxBitsT(s + i, std::min<size_t>(block, n - i)));
  });
}

void QuantizeBlocksRNBounded(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                             const float* factor, bool divide, giftFp8Kind_t kind, uint8_t* codes) {
  WithSource(src, dtype, [&](const auto* s) {
    for (size_t k = 0, i = 0; i < n; ++k, i += block) {
      const size_t len = std::min<size_t>(block, n - i);
      if (factor[k] > 0.0f) {
        QuantizeOf<true>(s + i, len, factor[k], divide, kind, codes + i);
      } else {
        memset(codes + i, 0, len);
      }
    }
  });
}

void QuantizeRN(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                giftFp8Kind_t kind, uint8_t* codes) {
  QuantizeDispatch<false>(src, dtype, n, factor, divide, kind, codes);
}

void QuantizeRNBounded(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                       giftFp8Kind_t kind, uint8_t* codes) {
  QuantizeDispatch<true>(src, dtype, n, factor, divide, kind, codes);
}

// Codes c (sign-extended) as fp32: shifted up, the magnitude fills fp32's exponent and
// mantissa fields (mag << (23 - M)) and reads as the FP8 value times 2^-(127 - bias), FP8
// subnormals as fp32 subnormals; the sign extension puts the sign in bit 31, and the AND
// clears the copies of it between. NaN and Inf codes excepted (see DequantizeK).
template <Fp8 K>
HWY_INLINE VF Fp8TimesPow2(DF d, VI c) {
  constexpr int kShift = 23 - Fp8Traits<K>::kMantBits;
  const DI di;
  const VI fields = hn::Set(di, static_cast<int32_t>(0x80000000u | (0x7Fu << kShift)));
  return hn::BitCast(d, hn::And(hn::ShiftLeft<kShift>(c), fields));
}

// 2^(127 - bias): Fp8TimesPow2 times it is the FP8 value, exactly.
template <Fp8 K>
constexpr uint32_t kUpBits = uint32_t(127 + 127 - Fp8Traits<K>::kBias) << 23;

// Non-temporal stores of v at p, 16-byte aligned: whole where p is aligned to the vector,
// else in halves, down to 16-byte pieces (the write-combining buffers still fill whole lines,
// since a decode writes them in order). Vectors under 16 bytes are stored plainly. (On x86;
// elsewhere Highway's Stream may be a plain store, and sizes are the target's largest.)
template <class D>
HWY_INLINE void StreamAligned16(hn::Vec<D> v, D d, hn::TFromD<D>* p) {
#if HWY_TARGET == HWY_SCALAR
  hn::StoreU(v, d, p);
#else
  constexpr size_t kBytes = hn::MaxLanes(d) * sizeof(hn::TFromD<D>);
  if constexpr (kBytes < 16) {
    hn::StoreU(v, d, p);
  } else if constexpr (kBytes == 16) {
    hn::Stream(v, d, p);
  } else {
    if (reinterpret_cast<uintptr_t>(p) % kBytes == 0) return hn::Stream(v, d, p);
    const hn::Half<D> dh;
    StreamAligned16(hn::LowerHalf(dh, v), dh, p);
    StreamAligned16(hn::UpperHalf(dh, v), dh, p + hn::Lanes(dh));
  }
#endif
}

// An output vector stored at p: with stream, through non-temporal stores, which write a line
// without reading it first (a decode's output is four times its input, so that read is 4 of
// the 9 bytes a cached decode to fp32 moves per element); p is then 16-byte aligned.
template <class D>
HWY_INLINE void StoreOutput(hn::Vec<D> v, D d, hn::TFromD<D>* p, bool stream) {
  if (stream) {
    StreamAligned16(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

using D16 = hn::Rebind<uint16_t, DF>;

// fp32 to bf16, round to nearest even, for finite v.
HWY_INLINE hn::Vec<D16> Bf16RN(VF v) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, v);
  const auto r =
      hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
  return hn::TruncateTo(D16(), hn::ShiftRight<16>(r));
}

// The same through AVX512_BF16's vcvtneps2bf16 where the CPU has it (Highway 1.0.3 has no
// target for it, hence the runtime check and the assembly). The instruction reads subnormal
// inputs as zero and flushes subnormal results, so it is used only where no decoded value is
// an fp32 subnormal: where the smallest nonzero FP8 magnitude times the scale is normal
// (NativeBf16Applies); equal to Bf16RN there, Inf on overflow included.
#undef GIFT_BF16_NATIVE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define GIFT_BF16_NATIVE 1
HWY_INLINE hn::Vec<D16> Bf16Native(VF v) {
  static_assert(sizeof(v.raw) == 64, "one zmm register in, one ymm out");
  __m256i r;
  asm volatile("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v.raw));  // never run where not chosen
  return hn::Vec<D16>{r};
}
#else
#define GIFT_BF16_NATIVE 0
HWY_INLINE hn::Vec<D16> Bf16Native(VF v) { return Bf16RN(v); }
#endif

HWY_INLINE bool HasNativeBf16() {
#if GIFT_BF16_NATIVE
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

// 2^(-126 - step exponent): the smallest nonzero magnitude, 2^step, times it is 2^-126.
template <Fp8 K>
HWY_INLINE bool NativeBf16Applies(float scale) {
  return HasNativeBf16() &&
         scale >= num::float_of(uint32_t(1 - Fp8Traits<K>::kSubnormalStepExp) << 23);
}

// How far ahead of the codes being decoded their line is fetched, once per 64 codes of a call
// (a test on every vector cost the 128-bit targets more than the fetch gained). A decode reads one
// stream of codes, a quarter to a half of the bytes it moves, and without the fetch its reads
// stalled at each 4 KiB page, where the hardware prefetcher stops. With it, giftc decode of
// a 512 MiB dump, one thread, median of 6: bf16 243 to 207 ms, fp32 165 to 157 ms; in
// memory (bench_codec BM_DecodeF32/1), of memcpy: AVX3 0.92-0.95 to 0.99-1.00, AVX2 0.89 to
// 0.91-0.98, SSE4 0.62-0.63 to 0.74-0.77.
constexpr size_t kDecodeFetchAhead = 2048;

// The prefetch of the line kDecodeFetchAhead bytes past p, which may lie past the end of p's
// buffer: a prefetch never faults, and its address is formed as an integer, since C++ has
// no pointer past one past the end.
HWY_INLINE void FetchAhead(const uint8_t* p) {
  hwy::Prefetch(
      reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) + kDecodeFetchAhead));
}

// What the vector loops of decode convert the decoded fp32 values to, chosen once per call
// (per block for kBf16Native in DecodeBlocksAs): a test per vector cost about a fifth of the
// decode to bf16 in cache.
enum class Output { kF32, kBf16, kBf16Native, kF16 };

// Whether any of the 64 codes at p is NaN or Inf: (c | ~fields) is 0xFF exactly for those,
// where fields are the bits that are all ones in them (E4M3: 0x7F; E5M2: 0x7C).
template <Fp8 K>
HWY_INLINE bool HasSpecial64(const uint8_t* p) {
  const hn::CappedTag<uint8_t, 64> d8;
  const auto fill = hn::Set(d8, uint8_t(K == Fp8::kE4M3 ? 0x80 : 0x83));
  auto top = hn::Or(hn::LoadU(d8, p), fill);
  for (size_t j = hn::Lanes(d8); j < 64; j += hn::Lanes(d8))
    top = hn::Max(top, hn::Or(hn::LoadU(d8, p + j), fill));
  return !hn::AllFalse(d8, hn::Eq(top, hn::Set(d8, uint8_t(0xFF))));
}

// v stored as element i of dst, converted as kOut says.
template <Output kOut>
HWY_INLINE void StoreAs(VF v, void* dst, size_t i, bool stream) {
  const DF d;
  const D16 d16;
  uint16_t* half = static_cast<uint16_t*>(dst) + i;
  if constexpr (kOut == Output::kF32) {
    StoreOutput(v, d, static_cast<float*>(dst) + i, stream);
  } else if constexpr (kOut == Output::kBf16) {
    StoreOutput(Bf16RN(v), d16, half, stream);
  } else if constexpr (kOut == Output::kBf16Native) {
    StoreOutput(Bf16Native(v), d16, half, stream);
  } else {
    // fp16: the instruction set's own conversion rounds to nearest even, subnormals and
    // overflow to Inf included (no caller runs with denormals-are-zero, FpEnvGuard).
    StoreOutput(hn::BitCast(d16, hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), v)), d16, half,
                stream);
  }
}

// Codes [from, to) (whole vectors, no NaN or Inf code) decoded into elements at + [from, to)
// of dst. su = scale * 2^(127 - bias) is finite: that product is then exact, so
// Fp8TimesPow2(c) * su is exactly the FP8 value times the scale before rounding, and rounds
// once as the rule does. One multiplication per vector.
template <Fp8 K, Output kOut>
HWY_INLINE void DecodeCleanVectors(const uint8_t* codes, uint64_t from, uint64_t to, VF su,
                                   void* dst, uint64_t at, bool stream) {
  const DF d;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const int8_t* c = reinterpret_cast<const int8_t*>(codes);
  for (uint64_t j = from; j < to; j += hn::Lanes(d)) {
    StoreAs<kOut>(hn::Mul(Fp8TimesPow2<K>(d, hn::PromoteTo(di, hn::LoadU(d8, c + j))), su), dst,
                  at + j, stream);
  }
}

// The lines of 64 codes of [0, n) from the first on, up to the first with a NaN or Inf code
// or the last whole line, decoded into elements at + [0, ...) of dst (DecodeCleanVectors);
// returns where it stopped. One test per line and one multiplication per vector: a third
// (bf16) to 40% (fp32) fewer instructions than DecodeVectors' test and two multiplications
// per vector.
template <Fp8 K, Output kOut>
HWY_INLINE size_t DecodeCleanLines(const uint8_t* codes, size_t n, VF su, void* dst, size_t at,
                                   bool stream) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    FetchAhead(codes + i);
    if (HasSpecial64<K>(codes + i)) break;
    DecodeCleanVectors<K, kOut>(codes, i, i + 64, su, dst, at, stream);
  }
  return i;
}

// Codes [from, to) by the scalar rule, which spells out NaN and Inf codes and non-finite
// scales, converted to dtype.
template <Fp8 K>
void DecodeScalar(const uint8_t* codes, size_t from, size_t to, float scale, void* dst,
                  giftDType_t dtype) {
  for (size_t i = from; i < to; ++i) {
    const float v = num::decode_element<K>(codes[i], scale);
    if (dtype == GIFT_DTYPE_F32) {
      static_cast<float*>(dst)[i] = v;
    } else if (dtype == GIFT_DTYPE_BF16) {
      static_cast<uint16_t*>(dst)[i] = num::bf16_from_float(v);
    } else {
      static_cast<uint16_t*>(dst)[i] = num::f16_from_float(v);
    }
  }
}

// The codes [0, n) decoded and stored in whole vectors, a line of 64 codes at a time; a line
// with a NaN or Inf code takes the scalar rule from the first vector with one to its end, and
// the vectors go on from the next line (no line but that one leaves the vector loop); returns
// where the whole vectors end. The scale is finite; with stream, dst is 16-byte aligned
// (StoreOutput), and lines keep it so.
template <Fp8 K, Output kOut>
size_t DecodeVectors(const uint8_t* codes, size_t n, float scale, void* dst, bool stream) {
  const DF d;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const size_t lanes = hn::Lanes(d);
  const VF s = hn::Set(d, scale), up = hn::Set(d, num::float_of(kUpBits<K>));
  const float scale_up = scale * num::float_of(kUpBits<K>);
  const VI special = hn::Set(di, (K == Fp8::kE4M3 ? 0x7F : 0x7C) - 1);
  const int8_t* signed_codes = reinterpret_cast<const int8_t*>(codes);
  size_t i = 0;
  while (i + lanes <= n) {
    if (std::isfinite(scale_up)) {
      i += DecodeCleanLines<K, kOut>(codes + i, n - i, hn::Set(d, scale_up), dst, i, stream);
    }
    // A line with a NaN or Inf code (or with no finite scale * 2^(127 - bias), any line), or
    // the last vectors: each vector tested, up to one with such a code.
    FetchAhead(codes + i);
    for (const size_t end = std::min(n, i + 64); i + lanes <= end; i += lanes) {
      const VI c = hn::PromoteTo(di, hn::LoadU(d8, signed_codes + i));
      if (!hn::AllFalse(di, hn::Gt(hn::And(c, hn::Set(di, 0x7F)), special))) {
        DecodeScalar<K>(codes, i, end, scale, dst,
                        kOut == Output::kF32   ? GIFT_DTYPE_F32
                        : kOut == Output::kF16 ? GIFT_DTYPE_F16
                                               : GIFT_DTYPE_BF16);
        i = end;
        break;
      }
      StoreAs<kOut>(hn::Mul(hn::Mul(Fp8TimesPow2<K>(d, c), up), s), dst, i, stream);
    }
  }
  return i;
}

// stream: as StoreOutput, where dst is 16-byte aligned (plain stores otherwise).
template <Fp8 K>
void DequantizeK(const uint8_t* codes, size_t n, float scale, void* dst, giftDType_t dtype,
                 bool stream) {
  size_t i = 0;
  // fp16 output where the instruction set has no fp16 conversion (GIFT_WIDEN_F16_HERE;
  // Highway 1.0.3 emulates it there), and a non-finite scale (a damaged frame), which needs
  // the NaN handling of the scalar rule, take the scalar loop below.
  if ((dtype != GIFT_DTYPE_F16 || !GIFT_WIDEN_F16_HERE) && std::isfinite(scale)) {
    stream = stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    if (dtype == GIFT_DTYPE_F32) {
      i = DecodeVectors<K, Output::kF32>(codes, n, scale, dst, stream);
    } else if (dtype == GIFT_DTYPE_BF16) {
      i = NativeBf16Applies<K>(scale)
              ? DecodeVectors<K, Output::kBf16Native>(codes, n, scale, dst, stream)
              : DecodeVectors<K, Output::kBf16>(codes, n, scale, dst, stream);
    } else {
      i = DecodeVectors<K, Output::kF16>(codes, n, scale, dst, stream);
    }
  }
  DecodeScalar<K>(codes, i, n, scale, dst, dtype);
}

void Dequantize(const uint8_t* codes, size_t n, float scale, giftFp8Kind_t kind, void* dst,
                giftDType_t dtype, bool stream) {
  if (kind == GIFT_FP8_E4M3) {
    DequantizeK<Fp8::kE4M3>(codes, n, scale, dst, dtype, stream);
  } else {
    DequantizeK<Fp8::kE5M2>(codes, n, scale, dst, dtype, stream);
  }
}

template <typename T>
void WidenAddT(const T* src, const float* plus, float* out, size_t n) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(Source<T>::load(d, src + i), hn::LoadU(d, plus + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = Source<T>::scalar(src + i) + plus[i];
}

void WidenAdd(const void* src, giftDType_t dtype, const float* plus, float* out, size_t n) {
  WithSource(src, dtype, [&](const auto* s) { WidenAddT(s, plus, out, n); });
}

void Subtract(const float* a, const float* b, float* out, size_t n, bool stream) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    StoreOutput(hn::Sub(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i, stream);
  }
  for (; i < n; ++i) out[i] = a[i] - b[i];
}

// Blocks are taken in batches: the amax of each block of the batch, then their scales, then
// the codes of each, in the same loop as the amax of the next batch's block in its place.
// Within one block the codes wait on the amax, its reduction across lanes and the scale's
// division; batching lets those latencies of one block overlap the others' work, and turns
// the fp32 scales' two scalar divisions per block (the scale, and the reciprocal
// FaithfulQuotient multiplies by) into vector divisions per batch (two on AVX-512 with the
// reciprocal). The shared loop puts the next batch's loads from memory among this batch's
// arithmetic, where the core overlaps them; a separate amax pass waits on memory with little to do.
constexpr size_t kBatchBlocks = 16;

// fp32 scales of a batch, FORMAT.md's rule (num::scale_f32: RN(amax / fp8_max), a division
// that the vector one equals), and with recip their reciprocals RN(1 / s) where
// ReciprocalApplies(s) (elsewhere unused, and never a division by zero).
template <Fp8 K>
HWY_INLINE void BatchScalesF32(const uint32_t* amax_bits, float* scale, float* reciprocal,
                               bool recip) {
  size_t k = 0;
  const hn::CappedTag<float, kBatchBlocks> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const auto max = hn::Set(d, num::fp8_max(K)), one = hn::Set(d, 1.0f);
  for (; k + hn::Lanes(d) <= kBatchBlocks; k += hn::Lanes(d)) {
    const auto s = hn::Div(hn::BitCast(d, hn::LoadU(du, amax_bits + k)), max);
    hn::StoreU(s, d, scale + k);
    if (recip) hn::StoreU(hn::Div(one, hn::Max(s, hn::Set(d, kReciprocalMin))), d, reciprocal + k);
  }
  for (; k < kBatchBlocks; ++k) {
    scale[k] = num::scale_f32(num::float_of(amax_bits[k]), K);
    if (recip) reciprocal[k] = 1.0f / std::max(scale[k], kReciprocalMin);
  }
}

// The targets whose encode reads memory fast enough to be bound by the lines it keeps in
// flight (AVX-512 on x86): they may read long runs as parts (kReadStreams, ReadInParts) and
// fetch fp32 into L2 (FetchToFor); the others read every run in order (kPrefetchBytes ahead).
constexpr bool kBoundByLinesInFlight = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

// A run of at least kStreamedBlocks blocks is read, where ReadInParts, as kReadStreams
// contiguous parts side by side: the batch takes kBatchBlocks / kReadStreams consecutive blocks of
// each part, and as a block's amax is taken, the block that the next batch takes in its place is
// fetched. One thread reading memory is bound by the lines it has in flight: the hardware
// prefetcher follows each part's stream (within its 4 KiB page) on its own, so four parts
// keep about four times as many lines coming (codec.cc makes a run of rows where every row
// is whole blocks). A shorter run is read in order, each line kPrefetchBytes ahead fetched
// as each block's amax is taken. One thread, 256 MiB of fp32 from memory, AVX-512: the parts encode
// a single row about 20% faster than the run read in order, and runs of 32 blocks encode 20 to 25%
// faster with the fetch ahead than with the hardware prefetcher alone. Narrower vectors read
// every run in order: four streams over four pages measured slower there. bench_codec, one
// thread, 256 MiB, of memcpy, medians of 6 rounds with the two builds interleaved (Zen 4 made
// to run AVX2, lines fetched 1024 bytes ahead): fp32 0.597 to 0.623, bf16 0.504 to 0.534;
// SSE4 (4 rounds) fp32 0.440 to 0.453. AVX-512 kept the parts (fp32 in a harness: 0.79-0.81
// of memcpy with them, 0.53-0.66 in order; bf16 the same either way). Since whole batches
// (EncodeWholeBatch) and the 8 KiB fetch (kPrefetchBytes), Zen 4 reads faster in order: giftc
// bench --threads 1, the two ways interleaved, encode medians 0.750 and 0.741 of memcpy as
// parts, 0.869 and 0.895 in order; blocks of 256 0.680 to 0.824, E8M0 scales 0.696 to 0.720.
// So AMD CPUs read in order (read_in_parts_chosen); Intel's keep the parts, unmeasured since.
constexpr uint64_t kReadStreams = kBoundByLinesInFlight ? 4 : 1;
constexpr uint64_t kStreamedBlocks = kBatchBlocks * kReadStreams;
static_assert(kBatchBlocks % kReadStreams == 0, "whole rounds per batch");

HWY_INLINE bool ReadInParts() { return kReadStreams > 1 && read_in_parts_chosen(); }

// How far ahead a run read in order fetches (on AVX-512, every run where it does not read in
// parts, else runs under kStreamedBlocks blocks):
// 8 KiB, where 1 KiB kept too few lines coming for a memory's latency at the rate the
// arithmetic takes them, and 4 KiB too once whole batches (EncodeWholeBatch) made the AVX2
// loop faster; and past the run's end into the bytes that follow it in the same
// buffer (BlockRun::readable_after), where the next run, often the next row, starts. A harness
// timing giftEncode each way in turn in one process, one thread, 256 MiB from memory, blocks
// of 128, medians of 12 to 16 interleaved rounds, Zen 4 (ms; 1 KiB, then 4 KiB within the
// run, then 4 KiB past it): made to run AVX2, fp32 one run of whole rows 24.6, 20.9 (memcpy of
// the input 20.2; 2 KiB 22.1, 3 KiB 21.3, 6 and 16 KiB as 4 KiB), rows of 1000 23.4, 24.6,
// 18.7, of 2000 33.0, 30.6, 25.4, of 4100 28.5, 26.5, 24.2, bf16 rows of 2000 53.2, 55.9, 40.3;
// AVX-512, fp32 rows of 2000 29.2, 27.9, 22.6, of 4100 30.6, 26.9, 23.3, bf16 rows of 2000
// 41.3, 32.9, 30.1. Rows of 300 (a run of 3 blocks each) about the same every way. Unchanged
// where the arithmetic bounds the encode: AVX2 fp32 blocks of 32, bf16 blocks of 32 and 128
// in whole rows, SSE4. Into L2 rather than L1, AVX2 fp32 at 4 KiB measured the same.
// EncodeSmallBlocks fetches past its run's end too: AVX-512, bf16 rows of 4100, six runs of
// the harness per build, alternated: medians 26.1-33.9 ms within the run, 18.4-26.1 past it.
// Then from 4 to 8 KiB, with whole batches: giftc bench --threads 1 made to run AVX2, the
// builds interleaved, three runs of 8 to 10 rounds, encode medians 0.695, 0.710, 0.725 to
// 0.761, 0.778, 0.768 of memcpy (6 KiB 0.716, 12 KiB 0.754); bf16 0.488 to 0.494, SSE4 0.360
// to 0.374, AVX3 (its long runs read as parts, so unchanged) 0.721 and 0.743. The harness,
// alternated processes, medians: AVX2 fp32 rows of 2000 16.6 to 15.7 ms, AVX-512 18.2 to 17.5,
// bf16 the same.
constexpr size_t kPrefetchBytes = 8192;

// Which cache the lines fetched ahead go to (FetchTo). Reading fp32 with AVX-512 the encode is
// bound by the lines it has in flight, and L2 pays; where the arithmetic per byte bounds it, the
// loads' wait for L2 costs and L1 stays. The likely cause: a line fetched into L1 holds one
// of L1's few miss buffers until it arrives, one fetched into L2 one of L2's, several times
// as many. giftc bench --threads 1 (256 MiB from memory, Zen 4), of memcpy, the two builds
// interleaved: fp32 blocks of 128 0.59-0.60 to 0.74-0.77, of 32 0.65-0.66 to 0.76-0.78;
// with a switch in one build, blocks of 256 0.51-0.53 to 0.72-0.75, E8M0 scales 0.59-0.60
// to 0.81-0.82; runs read in order (a harness, 256 MiB as runs of 4100 and of 2000
// elements) 26.3 to 24.4 and 29.4 to 18.6 ms. (All with lines fetched 1 KiB ahead.) L1 stays for
// 16-bit sources (bf16 0.47-0.50 either way), fp32 blocks of one vector (16: 0.70-0.73, 0.68-0.69
// from L2) and AVX2 (in a harness, fp32 blocks of 32 and bf16 blocks of 128 took 8% longer from L2,
// fp32 blocks of 128 5% less). Intel unmeasured.
template <typename T>
HWY_INLINE constexpr FetchTo FetchToFor() {
  return kBoundByLinesInFlight && sizeof(T) == 4 ? FetchTo::kL2 : FetchTo::kL1;
}

// Whether a block's codes are all +0: its scale is zero (amax == 0, or an fp32 scale that
// underflowed). Finite x over a positive scale stays below 2^17 in magnitude, where the
// bounded conversion (EncodeBlock) applies.
template <bool kE8M0>
HWY_INLINE bool ZeroScale(uint32_t amax_bits, float factor) {
  return kE8M0 ? amax_bits == 0 : !(factor > 0.0f);
}

// One block's codes with its scale factor (and with fp32 scales, its reciprocal from
// BatchScalesF32); with kAmaxNext, returns the amax bits of the len elements at next.
template <typename T, Fp8 K, bool kE8M0, bool kAmaxNext>
HWY_INLINE uint32_t EncodeBlock(const T* x, size_t len, float factor, bool recip,
                                const float* reciprocal, uint8_t* codes, const T* next,
                                const Fetch& fetch = Fetch()) {
  if constexpr (kE8M0) {
    return QuantizeT<T, K, Scaling::kMultiply, true, kAmaxNext>(x, len, factor, codes, false,
                                                                nullptr, next, fetch);
  } else {
    return QuantizeT<T, K, Scaling::kDivide, true, kAmaxNext>(x, len, factor, codes, recip,
                                                              reciprocal, next, fetch);
  }
}

// The amax of 16 small blocks at once (AVX-512): each block's lanes folded into one vector by
// AmaxPart, then MaxOfEach16 reduces the 16 vectors across lanes together, in 45 instructions
// where a reduction per block takes about 9 each (with its loads, the amax per block was about
// a third of the encode of blocks of 32). Blocks whose bytes are half a vector (16-bit
// sources' blocks of 16), one, two or four vectors.
#undef GIFT_AMAX_OF_16
#if GIFT_X86_PACKS && HWY_TARGET <= HWY_AVX3
#define GIFT_AMAX_OF_16 1
// The lanes of one block of kBytes bytes at p folded into one vector of int32 lanes whose
// largest is the block's largest sign-cleared pattern: fp32 patterns, or for 16-bit sources
// the 16-bit pattern in the high half of a lane (AmaxOf16 takes it out). Half a vector is
// loaded into the low half, the high half zero: below every magnitude but that of a zero.
template <typename T, size_t kBytes>
HWY_INLINE __m512i AmaxPart(const T* p) {
  static_assert(kBytes >= 64 || (kBytes == 32 && sizeof(T) == 2), "a 16-bit half vector at least");
  const char* bytes = reinterpret_cast<const char*>(p);
  const auto load = [bytes](size_t k) {
    if constexpr (kBytes == 32) {
      return _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
    } else {
      return _mm512_loadu_si512(bytes + 64 * k);
    }
  };
  constexpr size_t kVectors = kBytes < 64 ? 1 : kBytes / 64;
  if constexpr (sizeof(T) == 4) {
    const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i m = _mm512_and_si512(load(0), mask);
    for (size_t k = 1; k < kVectors; ++k) m = _mm512_max_epi32(m, _mm512_and_si512(load(k), mask));
    return m;
  } else {
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    __m512i m = _mm512_and_si512(load(0), mask);
    for (size_t k = 1; k < kVectors; ++k) m = _mm512_max_epi16(m, _mm512_and_si512(load(k), mask));
    // The larger of each pair to the high half of its 32-bit lane (the low half keeps the
    // low element, below it in the int32 order).
    return _mm512_max_epi16(m, _mm512_slli_epi32(m, 16));
  }
}

// The parts of 16 blocks of kBytes each, from p on, placed as AmaxOf16 takes them.
template <typename T, size_t kBytes>
HWY_INLINE void AmaxParts16(const T* p, __m512i (&parts)[16]) {
  constexpr size_t kBlock = kBytes / sizeof(T);
  for (size_t j = 0; j < 16; ++j) parts[4 * (j % 4) + j / 4] = AmaxPart<T, kBytes>(p + j * kBlock);
}

// Lane 4 * (j % 4) + j / 4 of the result is the largest lane of v[j] (a transposition of the
// order: placing block j's vector at v[4 * (j % 4) + j / 4] puts its amax in lane j).
HWY_INLINE __m512i MaxOfEach16(const __m512i (&v)[16]) {
  __m512i a[8], b[4], c[2];
  for (int j = 0; j < 8; ++j)  // lanes 0-7: v[2j]'s halves' max, 8-15: v[2j + 1]'s
    a[j] = _mm512_max_epi32(_mm512_shuffle_i32x4(v[2 * j], v[2 * j + 1], 0x44),
                            _mm512_shuffle_i32x4(v[2 * j], v[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // 128-bit block q: v[4j + q]'s max over its four blocks
    b[j] = _mm512_max_epi32(_mm512_shuffle_i32x4(a[2 * j], a[2 * j + 1], 0x88),
                            _mm512_shuffle_i32x4(a[2 * j], a[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)  // block q: two lanes of v[8j + q], two of v[8j + 4 + q]
    c[j] = _mm512_max_epi32(_mm512_unpacklo_epi64(b[2 * j], b[2 * j + 1]),
                            _mm512_unpackhi_epi64(b[2 * j], b[2 * j + 1]));
  const __m512 c0 = _mm512_castsi512_ps(c[0]), c1 = _mm512_castsi512_ps(c[1]);
  return _mm512_max_epi32(_mm512_castps_si512(_mm512_shuffle_ps(c0, c1, 0x88)),
                          _mm512_castps_si512(_mm512_shuffle_ps(c0, c1, 0xDD)));
}

// The amax bits of 16 blocks whose parts are at v[4 * (j % 4) + j / 4] (block j to out[j]).
template <typename T>
HWY_INLINE void AmaxOf16(const __m512i (&v)[16], uint32_t* out) {
  const __m512i m = MaxOfEach16(v);
  if constexpr (sizeof(T) == 4) {
    _mm512_storeu_si512(out, m);
  } else {
    alignas(64) uint32_t high[16];
    _mm512_store_si512(high, _mm512_srli_epi32(m, 16));
    for (int j = 0; j < 16; ++j) out[j] = WidenedBits<T>(static_cast<uint16_t>(high[j]));
  }
}
#else
#define GIFT_AMAX_OF_16 0
#endif

// Blocks of one, two, four or more vectors, 4 * Lanes(DF) elements of them at src: one
// 4-vector step with each vector scaled by its own block's factor (factor[b], reciprocal[b]
// for block b of the step, as EncodeBlock takes them; vector k is in block k >> shift, and
// for blocks of four vectors or more, shift 2, all four are in one), every block's
// scale positive and finite and, for the reciprocal, in its domain. kZipped: the loads as
// BoundedStep4 takes them (Source<T>::load4's, or bf16 pairs), whose vectors 2j and 2j + 1 hold
// the elements of the same 2 * Lanes(DF), as unzipped vectors 2j and 2j + 1 do: so for blocks
// of two or four vectors (shift 1 or 2) only.
template <typename T, Fp8 K, bool kE8M0, bool kRecip, bool kZipped>
HWY_INLINE void QuantizeGroup(const T* src, size_t shift, const float* factor,
                              const float* reciprocal, uint8_t* codes) {
  const DF d;
  BoundedStep4<T, K, kZipped>(
      src,
      [&](VF x, size_t k) {
        const VF f = hn::Set(d, factor[k >> shift]);
        if constexpr (kE8M0) {
          return hn::Mul(x, f);
        } else if constexpr (kRecip) {
          return FaithfulQuotient(x, f, hn::Set(d, reciprocal[k >> shift]));
        } else {
          return hn::Div(x, f);
        }
      },
      codes);
}

// A batch of kBatchBlocks whole blocks of len elements at x, len a multiple of a 4-vector step,
// whose next batch follows it in memory as whole blocks too (a run read in order), every
// block's scale one that the bounded conversion takes (kRecip: in the reciprocal's domain):
// the codes, one loop per block with nothing else to decide, and the next batch's amax to
// next_amax. EncodeBlocksBatched's loop, which allows for every other case, spent about 100
// instructions per block beside the 264 of a block of 128 fp32 elements (AVX2): its
// bookkeeping, and the constants it set up again for each block. A harness timing giftEncode
// of 512 KiB in cache, one thread, blocks of 128, 10 to 14 alternated processes per build,
// medians (Zen 4, made to run AVX2; its other hardware thread busy at times, less than in the
// hour of Fetch's figures): fp32 27.9 to 23.6 us (blocks of 1024, which this leaves as they were:
// 23.2 and 23.9), bf16 56.8 to 48.3; SSE4 fp32 59.8 to 55.3. From memory (256 MiB) unchanged
// within the noise: the encode waits on memory there.
template <typename T, Fp8 K, bool kE8M0, bool kRecip>
HWY_INLINE void EncodeWholeBatch(const T* x, size_t len, const float* factor,
                                 const float* reciprocal, uint8_t* codes, const Fetch& fetch,
                                 uint32_t* next_amax) {
  HWY_DASSERT(len % kStepLanes == 0);
  const T* next = x + kBatchBlocks * len;
  for (size_t k = 0, i = 0; k < kBatchBlocks; ++k) {
    AmaxOf<T> amax;
    for (const size_t end = i + len; i < end; i += kStepLanes) {
      fetch.step<kStepBytes<T>>(i * sizeof(T));
      amax.add4(next + i);
      QuantizeGroup<T, K, kE8M0, kRecip, Source<T>::kZipped>(x + i, 2, &factor[k], &reciprocal[k],
                                                             codes + i);
    }
    next_amax[k] = amax.bits();
  }
}

template <typename T, Fp8 K, bool kE8M0>
uint32_t EncodeBlocksBatched(const BlockRun& run) {
  const bool recip = !kE8M0 && ReciprocalChosen();
  const T* src = static_cast<const T*>(run.src);
  const char* bytes = static_cast<const char*>(run.src);
  const uint64_t blocks = (run.n + run.block - 1) / run.block;
  const uint64_t streams = blocks >= kStreamedBlocks && ReadInParts() ? kReadStreams : 1;
  const uint64_t part = (blocks + streams - 1) / streams;  // blocks per part; the last fewer
  const uint64_t rounds = kBatchBlocks / streams;          // blocks of each part per batch
  const auto len_of = [&](uint64_t b) {
    return static_cast<size_t>(std::min<uint64_t>(run.block, run.n - b * run.block));
  };
  const uint64_t fetch_end = run.n * sizeof(T) + run.readable_after;  // see BlockRun
  // The blocks of the batch that starts at round r0, the parts side by side.
  const auto batch_at = [&](uint64_t r0, uint64_t* ids) {
    size_t count = 0;
    for (uint64_t r = r0; r < std::min(part, r0 + rounds); ++r) {
      for (uint64_t b = r; b < blocks; b += part) ids[count++] = b;
    }
    return count;
  };
  // The lines to fetch as block b's amax is taken (step by step beside the codes of the block
  // before it, or at once where it is taken alone): those kPrefetchBytes ahead of its own, or
  // with parts, the block that the batch after b's takes in b's place.
  const auto fetch_of = [&](uint64_t b) __attribute__((always_inline)) {
    Fetch f;
    f.base = bytes;
    f.where = FetchToFor<T>();
    if (streams == 1) {
      f.at = std::min(b * run.block * sizeof(T) + kPrefetchBytes, fetch_end);
      f.len = std::min(f.at + len_of(b) * sizeof(T), fetch_end) - f.at;
    } else if (b + rounds < blocks) {
      f.at = (b + rounds) * run.block * sizeof(T);
      f.len = len_of(b + rounds) * sizeof(T);
    }
    return f;
  };
  const auto amax_of = [&](uint64_t b) {
    fetch_of(b).all();
    return AbsMaxBitsT(src + b * run.block, len_of(b));
  };
  uint32_t run_max = 0;
  uint64_t batch[2][kBatchBlocks];
  uint32_t amax_bits[2][kBatchBlocks];
  size_t count[2] = {batch_at(0, batch[0]), 0};
  for (size_t k = 0; k < count[0]; ++k) amax_bits[0][k] = amax_of(batch[0][k]);
  float factor[kBatchBlocks], reciprocal[kBatchBlocks];
  for (uint64_t r0 = 0, cur = 0; r0 < part; r0 += rounds, cur ^= 1) {
    const uint64_t* ids = batch[cur];
    uint32_t* amax = amax_bits[cur];
    for (size_t k = 0; k < count[cur]; ++k) run_max = std::max(run_max, amax[k]);
    if (run_max >= 0x7F800000u) return run_max;
    if constexpr (kE8M0) {
      for (size_t k = 0; k < count[cur]; ++k) {
        const uint8_t e = num::scale_e8m0(num::float_of(amax[k]), K);
        static_cast<uint8_t*>(run.scales)[ids[k]] = e;
        factor[k] = num::e8m0_reciprocal(e);
      }
    } else {
      std::fill(amax + count[cur], amax + kBatchBlocks, 0u);
      BatchScalesF32<K>(amax, factor, reciprocal, recip);
      for (size_t k = 0; k < count[cur]; ++k) static_cast<float*>(run.scales)[ids[k]] = factor[k];
    }
    // The next batch's amax, block by block beside this batch's codes where the lengths
    // agree (all but a run's last block), else on its own.
    const uint64_t* next_ids = batch[cur ^ 1];
    uint32_t* next_amax = amax_bits[cur ^ 1];
    const size_t next_count = count[cur ^ 1] =
        r0 + rounds < part ? batch_at(r0 + rounds, batch[cur ^ 1]) : 0;
    // Taken whole where the run is read in order (the batch's blocks and the next batch's follow
    // one another) and the next batch is whole blocks of whole steps, as this one then is.
    if (streams == 1 && next_count == kBatchBlocks && run.block % kStepLanes == 0 &&
        (next_ids[kBatchBlocks - 1] + 1) * run.block <= run.n) {
      bool clean = true, in_domain = recip;
      for (size_t k = 0; k < kBatchBlocks; ++k) {
        clean = clean && !ZeroScale<kE8M0>(amax[k], factor[k]);
        in_domain = in_domain && ReciprocalApplies(factor[k]);
      }
      if (clean) {
        const uint64_t e0 = ids[0] * run.block;
        Fetch fetch = fetch_of(next_ids[0]);  // widened to the whole next batch
        fetch.len = std::min(fetch.at + kBatchBlocks * run.block * sizeof(T), fetch_end) - fetch.at;
        // A batch with a block outside the reciprocal's domain divides all its blocks (the same
        // bytes either way).
        if constexpr (!kE8M0 && GIFT_RECIPROCAL_PAYS) {
          if (in_domain) {
            EncodeWholeBatch<T, K, kE8M0, true>(src + e0, run.block, factor, reciprocal,
                                                run.codes + e0, fetch, next_amax);
            continue;
          }
        }
        EncodeWholeBatch<T, K, kE8M0, false>(src + e0, run.block, factor, reciprocal,
                                             run.codes + e0, fetch, next_amax);
        continue;
      }
    }
    for (size_t k = 0; k < count[cur]; ++k) {
      const uint64_t b = ids[k], e0 = b * run.block;
      const size_t len = len_of(b);
      uint8_t* codes = run.codes + e0;
      const bool paired = k < next_count && len_of(next_ids[k]) == len;
      const T* next = paired ? src + next_ids[k] * run.block : nullptr;
      if (ZeroScale<kE8M0>(amax[k], factor[k])) {
        memset(codes, 0, len);
        if (paired) next_amax[k] = amax_of(next_ids[k]);
      } else if (paired) {
        next_amax[k] = EncodeBlock<T, K, kE8M0, true>(
            src + e0, len, factor[k], recip, &reciprocal[k], codes, next, fetch_of(next_ids[k]));
      } else {
        EncodeBlock<T, K, kE8M0, false>(src + e0, len, factor[k], recip, &reciprocal[k], codes,
                                        nullptr);
      }
      if (!paired && k < next_count) next_amax[k] = amax_of(next_ids[k]);
    }
    for (size_t k = count[cur]; k < next_count; ++k) next_amax[k] = amax_of(next_ids[k]);
  }
  return run_max;
}

#if GIFT_AMAX_OF_16
// How far ahead of a batch of EncodeSmallBlocks its lines are fetched: as each step's codes
// are taken, the lines of the step that far ahead. Fetched all at once as the batch began (64
// lines for bf16 blocks of 128), they filled L1's few miss buffers and the fetches waited, a
// third of the encode in a profile; one step's lines at a time, giftc bench --threads 1
// --dtype bf16 (256 MiB from memory, 6 interleaved rounds, this Xeon) went from 0.40-0.46 to
// 0.43-0.57 of memcpy (medians 0.42, 0.50). Twice as far ahead, or into L2, measured the same.
constexpr uint64_t kSmallFetchAhead = 4096;

// Blocks that EncodeSmallBlocks takes: one, two, four or eight vectors of fp32 lanes whose
// source bytes are half a vector or one, two or four whole vectors (fp32: 16, 32 or 64
// elements; 16-bit: 16, 32, 64 or 128). 16-bit blocks of 16 took 0.09 of memcpy the other way
// (giftc bench --threads 1, bf16 and f16, Xeon), against 0.45 for blocks of 32. Against
// EncodeBlocksBatched, giftc bench --threads 1, of memcpy, the two builds interleaved (Zen 4): bf16
// blocks of 128 0.150 to 0.162 in cache (2 MiB), 0.504 to 0.52 from memory (256 MiB); fp32 blocks
// of 64 0.213 to 0.228 and 0.61 to 0.68. fp32 blocks of 128 are left to EncodeBlocksBatched: 0.255
// to 0.233 this way in cache, 0.77 to 0.58 from memory, where its parts (kReadStreams) read faster
// (and on AMD, read in order as whole batches since, faster still).
template <typename T>
HWY_INLINE bool SmallBlocksApply(uint32_t block) {
  return (block == 16 || block == 32 || block == 64 || block == 128) && block * sizeof(T) <= 256;
}

// The run's first blocks in batches of 16 whole blocks, consecutive in memory (*done blocks in
// all): the batch's amax 16 at once (AmaxOf16), its scales in one vector, then its codes a
// 4-vector step at a time (QuantizeGroup). For blocks this small, EncodeBlocksBatched's work per
// block (the amax's reduction, the bookkeeping of its parts and batches) took most of the time.
// Blocks of 32, 128K fp32 elements in cache, one thread: 2.2 elements/ns that way (4.1 for
// blocks of 128), 3.9 this way with fp32 scales, 5.5 with E8M0 (MX). Returns the batches'
// abs_max_bits; on a NaN or Inf, a value >= 0x7F800000, with that batch unwritten.
template <typename T, Fp8 K, bool kE8M0, bool kRecip, bool kCensus>
HWY_INLINE uint32_t EncodeSmallBlocks(const BlockRun& run, uint64_t* done) {
  const T* src = static_cast<const T*>(run.src);
  const char* bytes = static_cast<const char*>(run.src);
  const size_t block = run.block;
  const size_t shift = block == 16 ? 0 : block == 32 ? 1 : 2;
  const int block_log2 = __builtin_ctz(run.block);
  const uint64_t batches = run.n / block / 16, batch = 16 * block;
  const uint64_t fetch_end = run.n * sizeof(T) + run.readable_after;  // see BlockRun
  Fetch fetch;  // the batch kSmallFetchAhead bytes ahead
  fetch.base = bytes;
  fetch.where = block == 16 ? FetchTo::kL1 : FetchToFor<T>();  // see FetchTo
  __m512i run_max = _mm512_setzero_si512();
  alignas(64) uint32_t amax[16];
  alignas(64) float factor[16], reciprocal[16];
  // With kCensus, the census of each batch's elements beside its codes (BlockRun::census):
  // squares, a chain of FMAs per chunk, that overlap the codes' arithmetic.
  static const double kNoSquares[8] = {};
  using Squares = SquareLanes<false>;
  static_assert(64 % Squares::kStep == 0, "whole census steps per code step");
  Squares squares(kNoSquares);
  const auto square = [&](const T* p, size_t n) {
    if constexpr (kCensus) {
      for (size_t k = 0; k < n; k += Squares::kStep) squares.add(p + k);
    }
  };
  for (uint64_t q = 0; q < batches; ++q) {
    const uint64_t e0 = q * batch;
    fetch.at = std::min(e0 * sizeof(T) + kSmallFetchAhead, fetch_end);
    fetch.len = std::min(batch * sizeof(T), fetch_end - fetch.at);
    __m512i parts[16];
    switch (block * sizeof(T)) {
      case 32:
        if constexpr (sizeof(T) == 2) AmaxParts16<T, 32>(src + e0, parts);
        break;
      case 64:
        AmaxParts16<T, 64>(src + e0, parts);
        break;
      case 128:
        AmaxParts16<T, 128>(src + e0, parts);
        break;
      default:
        AmaxParts16<T, 256>(src + e0, parts);
        break;
    }
    AmaxOf16<T>(parts, amax);
    const __m512i m = _mm512_load_si512(amax);
    run_max = _mm512_max_epu32(run_max, m);
    if (_mm512_cmpge_epu32_mask(m, _mm512_set1_epi32(0x7F800000))) {
      *done = q * 16;
      return _mm512_reduce_max_epu32(run_max);
    }
    bool clean;  // every scale positive, fp32 ones in the division's (kRecip: reciprocal's) domain
    if constexpr (kE8M0) {
      // num::scale_e8m0 of a finite amax: the biased exponent field less emax, at least 0 (for
      // amax below 2^(emax - 126), subnormals included, the exponent clamps at -127); its
      // reciprocal, e8m0_reciprocal, is 2^(127 - byte): fp32 bits (254 - byte) << 23.
      const __m512i byte = _mm512_max_epi32(
          _mm512_sub_epi32(_mm512_srli_epi32(m, 23), _mm512_set1_epi32(num::fp8_emax(K))),
          _mm512_setzero_si512());
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint8_t*>(run.scales) + q * 16),
                       _mm512_cvtepi32_epi8(byte));
      _mm512_store_si512(factor,
                         _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), byte), 23));
      clean = _mm512_test_epi32_mask(m, m) == 0xFFFF;  // no amax == 0 (codes all +0)
    } else {
      BatchScalesF32<K>(amax, factor, reciprocal, kRecip);
      const __m512 f = _mm512_load_ps(factor);
      _mm512_storeu_ps(static_cast<float*>(run.scales) + q * 16, f);
      const float lowest = kRecip ? kReciprocalMin : 0x1p-149f;
      const float highest = kRecip ? kReciprocalMax : 0x1p+127f;
      clean = (_mm512_cmp_ps_mask(f, _mm512_set1_ps(lowest), _CMP_GE_OQ) &
               _mm512_cmp_ps_mask(f, _mm512_set1_ps(highest), _CMP_LE_OQ)) == 0xFFFF;
    }
    uint8_t* codes = run.codes + e0;
    if (clean) {
      for (size_t e = 0; e < batch; e += 64) {
        const size_t j = e >> block_log2;
        square(src + e0 + e, 64);
        fetch.step<64 * sizeof(T)>(e * sizeof(T));
        if (shift) {
          QuantizeGroup<T, K, kE8M0, kRecip, Source<T>::kZipped>(src + e0 + e, shift, &factor[j],
                                                                 &reciprocal[j], codes + e);
        } else {
          QuantizeGroup<T, K, kE8M0, kRecip, false>(src + e0 + e, shift, &factor[j], &reciprocal[j],
                                                    codes + e);
        }
      }
    } else {
      fetch.all();
      square(src + e0, batch);
      for (size_t j = 0; j < 16; ++j) {  // rare: a zero scale, or one outside the domain
        if (ZeroScale<kE8M0>(amax[j], factor[j])) {
          memset(codes + j * block, 0, block);
        } else {
          EncodeBlock<T, K, kE8M0, false>(src + e0 + j * block, block, factor[j], kRecip,
                                          &reciprocal[j], codes + j * block, nullptr);
        }
      }
    }
    if constexpr (kCensus) {  // batches divide chunks: 16 blocks of at most 128 elements
      HWY_DASSERT(kCensusChunk % batch == 0);
      if ((e0 + batch) % kCensusChunk == 0) {
        const uint64_t c = e0 / kCensusChunk;
        squares.store(run.census[c]);
        run.census_done[c] = 1;
        squares = Squares(kNoSquares);
      }
    }
  }
  *done = batches * 16;
  return _mm512_reduce_max_epu32(run_max);
}
#endif

#if GIFT_AMAX_OF_16
// EncodeSmallBlocks dividing through reciprocals where ReciprocalChosen (fp32 scales only).
template <typename T, Fp8 K, bool kE8M0, bool kCensus>
HWY_INLINE uint32_t SmallBlocksFor(const BlockRun& run, uint64_t* done) {
  if constexpr (!kE8M0) {
    if (ReciprocalChosen()) return EncodeSmallBlocks<T, K, false, true, kCensus>(run, done);
  }
  return EncodeSmallBlocks<T, K, kE8M0, false, kCensus>(run, done);
}
#endif

template <typename T, Fp8 K, bool kE8M0>
uint32_t EncodeBlocksT(const BlockRun& run) {
#if GIFT_AMAX_OF_16
  if (SmallBlocksApply<T>(run.block)) {
    uint64_t done = 0;
    const uint32_t m = run.census ? SmallBlocksFor<T, K, kE8M0, true>(run, &done)
                                  : SmallBlocksFor<T, K, kE8M0, false>(run, &done);
    const uint64_t at = done * run.block;
    if (m >= 0x7F800000u || at == run.n) return m;
    BlockRun rest = run;
    rest.census = nullptr;  // its chunks would count from its own start
    rest.census_done = nullptr;
    rest.src = static_cast<const T*>(run.src) + at;
    rest.n = run.n - at;
    rest.codes = run.codes + at;
    rest.scales = static_cast<uint8_t*>(run.scales) + done * (kE8M0 ? 1 : 4);
    return std::max(m, EncodeBlocksBatched<T, K, kE8M0>(rest));
  }
#endif
  return EncodeBlocksBatched<T, K, kE8M0>(run);
}

template <typename T, Fp8 K>
uint32_t EncodeBlocksK(const BlockRun& run) {
  return run.scale_dtype == GIFT_SCALE_DTYPE_E8M0 ? EncodeBlocksT<T, K, true>(run)
                                                  : EncodeBlocksT<T, K, false>(run);
}

template <typename T>
uint32_t EncodeBlocksD(const BlockRun& run) {
  return run.kind == GIFT_FP8_E4M3 ? EncodeBlocksK<T, Fp8::kE4M3>(run)
                                   : EncodeBlocksK<T, Fp8::kE5M2>(run);
}

uint32_t EncodeBlocksRN(const BlockRun& run) {
  return WithSource(run.src, run.dtype,
                    [&](const auto* s) { return EncodeBlocksD<std::decay_t<decltype(*s)>>(run); });
}

// Lines of 64 codes of blocks of 16 or 32 (whole vectors), from code `from` (a line's first)
// on, each block's vectors multiplied by its own su (DecodeCleanVectors), up to the first
// line with a NaN or Inf code, or with a block whose su is not finite (or, for kBf16Native,
// whose scale NativeBf16Applies refuses), or the last whole line; returns where it stopped.
// A call per block (DequantizeK, as for blocks that are not whole lines) decoded blocks of
// 32 at a third of the speed of blocks of 128.
template <Fp8 K, Output kOut>
HWY_INLINE uint64_t DecodeSmallBlockLines(const BlockRun& run, uint64_t from, void* dst,
                                          bool stream) {
  // In locals: the stores through dst could otherwise alias run, which was read again for
  // every block.
  const uint64_t block = run.block, n = run.n;
  const uint8_t* codes = run.codes;
  const void* scales = run.scales;
  const size_t per_line = 64 / block;
  const bool e8m0 = run.scale_dtype == GIFT_SCALE_DTYPE_E8M0;
  uint64_t i = from;
  for (; i + 64 <= n; i += 64) {
    FetchAhead(codes + i);
    if (HasSpecial64<K>(codes + i)) break;
    float su[4];
    bool clean = true;
    for (size_t g = 0; g < per_line; ++g) {
      const float s = num::stored_scale(scales, e8m0, i / block + g);
      su[g] = s * num::float_of(kUpBits<K>);
      clean =
          clean && std::isfinite(su[g]) && (kOut != Output::kBf16Native || NativeBf16Applies<K>(s));
    }
    if (!clean) break;
    for (size_t g = 0; g < per_line; ++g) {
      const uint64_t b0 = i + g * block;
      DecodeCleanVectors<K, kOut>(codes, b0, b0 + block, hn::Set(DF(), su[g]), dst, 0, stream);
    }
  }
  return i;
}

// Each block's clean lines (DecodeCleanLines) decoded in one loop for the run (a call per
// block cost about a fifth of a decode to bf16 in cache), and the rest of the block by
// DequantizeK: from a line with a NaN or Inf code on, the last codes short of a line, and
// whole blocks where a block is not whole lines (which keeps each line's stores 16-byte
// aligned), where the scale times 2^(127 - bias) is not finite, and for fp16 where the
// instruction set has no fp16 conversion (DequantizeK's scalar loop). kBf16Native falls back
// to kBf16 for each block whose scale NativeBf16Applies refuses. Blocks of 16 and 32 codes
// (whole vectors) are taken a line of several blocks at a time instead
// (DecodeSmallBlockLines), and a line that it leaves block by block.
template <Fp8 K, Output kOut>
void DecodeBlocksAs(const BlockRun& run, void* dst, giftDType_t dst_dtype) {
  const size_t width = dtype_size(dst_dtype);
  constexpr bool kLinesHere = kOut != Output::kF16 || !GIFT_WIDEN_F16_HERE;
  const bool lines = kLinesHere && run.block % 64 == 0;
  const bool stream = run.stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const bool e8m0 = run.scale_dtype == GIFT_SCALE_DTYPE_E8M0;
  if (kLinesHere && (run.block == 16 || run.block == 32) && run.block % hn::Lanes(DF()) == 0) {
    // Blocks smaller than a line: lines at a time, and a line they leave (or the last codes)
    // block by block.
    for (uint64_t i = 0; i < run.n;) {
      i = DecodeSmallBlockLines<K, kOut>(run, i, dst, stream);
      for (const uint64_t end = std::min(run.n, i + 64); i < end; i += run.block) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(run.block, run.n - i));
        DequantizeK<K>(run.codes + i, len, num::stored_scale(run.scales, e8m0, i / run.block),
                       static_cast<uint8_t*>(dst) + i * width, dst_dtype, run.stream);
      }
    }
    return;
  }
  for (uint64_t b0 = 0, g = 0; b0 < run.n; b0 += run.block, ++g) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(run.block, run.n - b0));
    const float s = num::stored_scale(run.scales, e8m0, g);
    const float su = s * num::float_of(kUpBits<K>);
    const uint8_t* codes = run.codes + b0;
    size_t i = 0;
    if constexpr (kLinesHere) {
      if (lines && std::isfinite(su)) {
        const VF v = hn::Set(DF(), su);
        if constexpr (kOut != Output::kBf16Native) {
          i = DecodeCleanLines<K, kOut>(codes, len, v, dst, b0, stream);
        } else if (NativeBf16Applies<K>(s)) {
          i = DecodeCleanLines<K, Output::kBf16Native>(codes, len, v, dst, b0, stream);
        } else {
          i = DecodeCleanLines<K, Output::kBf16>(codes, len, v, dst, b0, stream);
        }
      }
    }
    if (i < len) {
      DequantizeK<K>(codes + i, len - i, s, static_cast<uint8_t*>(dst) + (b0 + i) * width,
                     dst_dtype, run.stream);
    }
  }
}

template <Fp8 K>
void DecodeBlocksK(const BlockRun& run, void* dst, giftDType_t dst_dtype) {
  if (dst_dtype == GIFT_DTYPE_F32) return DecodeBlocksAs<K, Output::kF32>(run, dst, dst_dtype);
  if (dst_dtype == GIFT_DTYPE_F16) return DecodeBlocksAs<K, Output::kF16>(run, dst, dst_dtype);
#if GIFT_BF16_NATIVE
  if (HasNativeBf16()) return DecodeBlocksAs<K, Output::kBf16Native>(run, dst, dst_dtype);
#endif
  return DecodeBlocksAs<K, Output::kBf16>(run, dst, dst_dtype);
}

void DecodeBlocks(const BlockRun& run, void* dst, giftDType_t dst_dtype) {
  return run.kind == GIFT_FP8_E4M3 ? DecodeBlocksK<Fp8::kE4M3>(run, dst, dst_dtype)
                                   : DecodeBlocksK<Fp8::kE5M2>(run, dst, dst_dtype);
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace gift::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gift::simd {

namespace {
std::atomic<int> g_reciprocal_division{-1};
std::atomic<int> g_read_in_parts{-1};

// The choices made by the CPU's vendor: mode if set (0 or 1), else the vendor's.
bool chosen_unless_amd(const std::atomic<int>& mode_set) {
  const int mode = mode_set.load(std::memory_order_relaxed);
  if (mode >= 0) return mode == 1;
  static const bool amd = [] {
#if HWY_ARCH_X86
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
#else
    return false;
#endif
  }();
  return !amd;
}
}  // namespace

// Intel's AVX-512 (the Xeon measured) divides faster through the reciprocal, AMD's Zen 4 with
// vdivps (ReciprocalChosen's comment): AMD CPUs divide (Zen 5, whose 512-bit units are whole on
// its server parts, is unmeasured).
bool reciprocal_division_chosen() { return chosen_unless_amd(g_reciprocal_division); }

// Long runs read as parts measured faster before whole batches; since then AMD's Zen 4 reads
// faster in order, and Intel's CPUs keep the parts, unmeasured since (kReadStreams' comment;
// Zen 5 unmeasured).
bool read_in_parts_chosen() { return chosen_unless_amd(g_read_in_parts); }

int set_reciprocal_division_for_test(int mode) { return g_reciprocal_division.exchange(mode); }

int set_read_in_parts_for_test(int mode) { return g_read_in_parts.exchange(mode); }

HWY_EXPORT(AbsMaxBits);
HWY_EXPORT(BlocksAbsMaxBits);
HWY_EXPORT(QuantizeBlocksRNBounded);
HWY_EXPORT(AbsMaxAddSquares);
HWY_EXPORT(AddSquaresChunks);
HWY_EXPORT(QuantizeRN);
HWY_EXPORT(QuantizeRNBounded);
HWY_EXPORT(Dequantize);
HWY_EXPORT(Subtract);
HWY_EXPORT(WidenAdd);
HWY_EXPORT(EncodeBlocksRN);
HWY_EXPORT(DecodeBlocks);
HWY_EXPORT(TargetName);

uint32_t abs_max_bits(const void* src, giftDType_t dtype, size_t n) {
  return HWY_DYNAMIC_DISPATCH(AbsMaxBits)(src, dtype, n);
}

uint32_t abs_max_add_squares(const void* src, giftDType_t dtype, size_t n, size_t phase,
                             double lanes[8]) {
  return HWY_DYNAMIC_DISPATCH(AbsMaxAddSquares)(src, dtype, n, phase, lanes);
}

void add_squares_chunks(const void* src, giftDType_t dtype, size_t chunk, size_t chunks,
                        double (*lanes)[8], uint32_t* amax_bits) {
  HWY_DYNAMIC_DISPATCH(AddSquaresChunks)(src, dtype, chunk, chunks, lanes, amax_bits);
}

void quantize_rn(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                 giftFp8Kind_t kind, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(QuantizeRN)(src, dtype, n, factor, divide, kind, codes);
}

void quantize_rn_bounded(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                         giftFp8Kind_t kind, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(QuantizeRNBounded)(src, dtype, n, factor, divide, kind, codes);
}

void blocks_abs_max_bits(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                         uint32_t* bits) {
  HWY_DYNAMIC_DISPATCH(BlocksAbsMaxBits)(src, dtype, n, block, bits);
}

void quantize_blocks_rn_bounded(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                                const float* factor, bool divide, giftFp8Kind_t kind,
                                uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(QuantizeBlocksRNBounded)(src, dtype, n, block, factor, divide, kind, codes);
}

void dequantize(const uint8_t* codes, size_t n, float scale, giftFp8Kind_t kind, void* dst,
                giftDType_t dtype, bool stream) {
  HWY_DYNAMIC_DISPATCH(Dequantize)(codes, n, scale, kind, dst, dtype, stream);
}

void widen_add(const void* src, giftDType_t dtype, const float* plus, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenAdd)(src, dtype, plus, out, n);
}

void subtract(const float* a, const float* b, float* out, size_t n, bool stream) {
  HWY_DYNAMIC_DISPATCH(Subtract)(a, b, out, n, stream);
}

uint32_t encode_blocks_rn(const BlockRun& run) { return HWY_DYNAMIC_DISPATCH(EncodeBlocksRN)(run); }

void decode_blocks(const BlockRun& run, void* dst, giftDType_t dst_dtype) {
  HWY_DYNAMIC_DISPATCH(DecodeBlocks)(run, dst, dst_dtype);
}

void stream_fence() { hwy::FlushStream(); }

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

// HWY_TARGETS holds the targets compiled here (hwy_targets.h's exclusions applied); a lower
// bit is a wider target, so every target wider than t is a bit below it. DisableTargets only
// unsets Highway's choice, which the next dispatch makes again; making it here, on the
// caller's thread, keeps the threads of the caller's next call from all racing to make it
// (Highway 1.0.3 briefly holds every target the CPU has while it does).
bool limit_targets(const char* name) {
  int64_t wider = 0;
  if (name) {
    int64_t bits = HWY_TARGETS;
    while (bits && strcasecmp(hwy::TargetName(bits & -bits), name) != 0) bits &= bits - 1;
    if (!bits) return false;
    wider = (bits & -bits) - 1;
  }
  hwy::DisableTargets(wider);
  target_name();
  return true;
}

const char* target_names() {
  // Built once, in a fixed buffer (the C API's callers get no exception): Highway's names are
  // a few characters each, and HWY_TARGETS holds at most a dozen.
  static const struct Names {
    char text[256] = "";
    Names() {
      size_t at = 0;
      for (int64_t bits = HWY_TARGETS; bits && at < sizeof text; bits &= bits - 1) {
        const int n = snprintf(text + at, sizeof text - at, "%s%s", at ? " " : "",
                               hwy::TargetName(bits & -bits));
        at += n > 0 ? size_t(n) : 0;
      }
    }
  } names;
  return names.text;
}

}  // namespace gift::simd
#endif
