// The tensor encoder and decoder through the C API: group geometry, scale rules, the
// vectorized and threaded paths against a plain per-element reference written here.
#include <gtest/gtest.h>
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gift/gift.h"
#include "numerics/elementwise.h"
#include "numerics/simd.h"
#include "unit/compiler_half.h"

namespace {

using gift::num::Fp8;

struct Shape {
  uint64_t rows, cols;
};

std::vector<float> gradient_like(Shape s, uint32_t seed) {
  // Heavy-tailed, row-scaled values: amax varies across groups, as in real gradients.
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(s.rows * s.cols);
  for (uint64_t r = 0; r < s.rows; ++r) {
    const float row_scale = std::exp2(float(int(gen() % 24)) - 12.0f);
    for (uint64_t c = 0; c < s.cols; ++c) {
      const float t = n(gen);
      v[r * s.cols + c] = row_scale * t * t * t;
    }
  }
  return v;
}

giftQuantParams params(giftFp8Kind_t kind, giftScaleLayout_t layout, giftScaleDType_t sd,
                       uint32_t block = 128, uint32_t tr = 1, uint32_t tc = 1) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = kind;
  p.layout = layout;
  p.scale_dtype = sd;
  p.block = block;
  p.tile_rows = tr;
  p.tile_cols = tc;
  return p;
}

// The group of element (r, c) under p, by the layout's definition.
uint64_t group_of(const giftQuantParams& p, Shape s, uint64_t r, uint64_t c) {
  switch (p.layout) {
    case GIFT_SCALE_TENSOR:
      return 0;
    case GIFT_SCALE_ROW:
      return r;
    case GIFT_SCALE_BLOCK:
      return r * ((s.cols + p.block - 1) / p.block) + c / p.block;
    default:
      return (r / p.tile_rows) * ((s.cols + p.tile_cols - 1) / p.tile_cols) + c / p.tile_cols;
  }
}

struct Encoded {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
};

// Per-element reference of FORMAT.md's rule.
Encoded reference_encode(const giftQuantParams& p, const std::vector<float>& x, Shape s) {
  uint64_t ng = 0;
  EXPECT_EQ(giftScaleCount(&p, s.rows, s.cols, &ng), GIFT_OK);
  std::vector<float> amax(ng, 0.0f);
  for (uint64_t r = 0; r < s.rows; ++r)
    for (uint64_t c = 0; c < s.cols; ++c) {
      float& a = amax[group_of(p, s, r, c)];
      a = std::max(a, std::fabs(x[r * s.cols + c]));
    }
  const Fp8 kind = static_cast<Fp8>(p.kind);
  const float fmax = kind == Fp8::kE4M3 ? 448.0f : 57344.0f;
  const int emax = kind == Fp8::kE4M3 ? 8 : 15;
  Encoded e;
  std::vector<float> scale(ng);
  for (uint64_t g = 0; g < ng; ++g) {
    if (p.scale_dtype == GIFT_SCALE_DTYPE_F32) {
      scale[g] = amax[g] / fmax;
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&scale[g]);
      e.scales.insert(e.scales.end(), b, b + 4);
    } else {
      int ex = 0;
      if (amax[g] > 0) {
        std::frexp(amax[g], &ex);
        ex = std::clamp(ex - 1 - emax, -127, 127);
      } else {
        ex = -127;
      }
      scale[g] = float(std::ldexp(1.0, ex));
      e.scales.push_back(static_cast<uint8_t>(ex + 127));
    }
  }
  e.codes.resize(x.size());
  for (uint64_t r = 0; r < s.rows; ++r)
    for (uint64_t c = 0; c < s.cols; ++c) {
      const uint64_t i = r * s.cols + c;
      const float sc = scale[group_of(p, s, r, c)];
      if (amax[group_of(p, s, r, c)] == 0 || sc == 0) {
        e.codes[i] = 0;
        continue;
      }
      const float v = x[i] / sc;
      e.codes[i] = kind == Fp8::kE4M3 ? gift::num::fp8_from_float_rn<Fp8::kE4M3>(v)
                                      : gift::num::fp8_from_float_rn<Fp8::kE5M2>(v);
    }
  return e;
}

// The threads the codec helpers below run with: one context, so that tests can vary the
// thread count without touching the parameters (which decide the bytes).
giftCtx* test_ctx() {
  static giftCtx* ctx = [] {
    giftCtx* c = nullptr;
    giftCtxCreate(&c);
    return c;
  }();
  return ctx;
}
int g_threads = 0;
void use_threads(int threads) {
  g_threads = threads;
  EXPECT_EQ(giftCtxSetThreads(test_ctx(), threads), GIFT_OK);
}

Encoded encode(const giftQuantParams& p, const void* x, giftDType_t dt, Shape s,
               giftEncodeStats* stats = nullptr, giftCtx* ctx = test_ctx()) {
  uint64_t bytes = 0;
  EXPECT_EQ(giftScaleBytes(&p, s.rows, s.cols, &bytes), GIFT_OK);
  Encoded e;
  e.codes.assign(s.rows * s.cols, 0xAA);  // poison: every code must be written
  e.scales.assign(bytes, 0xAA);
  const giftResult_t r =
      giftEncode(ctx, &p, x, dt, s.rows, s.cols, e.codes.data(), e.scales.data(), bytes, stats);
  EXPECT_EQ(r, GIFT_OK) << giftGetLastErrorMessage();
  return e;
}

std::vector<float> decode(const giftQuantParams& p, const Encoded& e, Shape s,
                          giftCtx* ctx = test_ctx()) {
  std::vector<float> out(s.rows * s.cols, -12345.0f);
  EXPECT_EQ(giftDecode(ctx, &p, e.codes.data(), e.scales.data(), e.scales.size(), s.rows, s.cols,
                       out.data(), GIFT_DTYPE_F32),
            GIFT_OK)
      << giftGetLastErrorMessage();
  return out;
}

std::string describe(const giftQuantParams& p, Shape s) {
  return "kind=" + std::to_string(p.kind) + " layout=" + std::to_string(p.layout) +
         " block=" + std::to_string(p.block) + " tile=" + std::to_string(p.tile_rows) + "x" +
         std::to_string(p.tile_cols) + " sd=" + std::to_string(p.scale_dtype) +
         " threads=" + std::to_string(g_threads) + " shape=" + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

// Decode is code * scale in fp32, exactly.
void expect_code_times_scale(const giftQuantParams& p, Shape s, const Encoded& e) {
  const std::vector<float> y = decode(p, e, s);
  for (uint64_t i = 0; i < y.size(); ++i) {
    const uint64_t g = group_of(p, s, i / s.cols, i % s.cols);
    float sc;
    if (p.scale_dtype == GIFT_SCALE_DTYPE_F32) {
      std::memcpy(&sc, e.scales.data() + 4 * g, 4);
    } else {
      sc = float(std::ldexp(1.0, int(e.scales[g]) - 127));
    }
    const float v = p.kind == GIFT_FP8_E4M3 ? gift::num::fp8_to_float<Fp8::kE4M3>(e.codes[i])
                                            : gift::num::fp8_to_float<Fp8::kE5M2>(e.codes[i]);
    ASSERT_EQ(y[i], v * sc) << describe(p, s) << " i=" << i;
  }
}

TEST(Codec, MatchesPerElementReferenceForEveryLayout) {
  const std::vector<Shape> shapes = {{1, 1}, {1, 37}, {7, 300}, {33, 128}, {5, 4099}, {64, 64}};
  std::vector<giftQuantParams> ps;
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
      ps.push_back(params(kind, GIFT_SCALE_TENSOR, sd));
      ps.push_back(params(kind, GIFT_SCALE_ROW, sd));
      for (uint32_t b : {16u, 32u, 128u, 4096u})
        ps.push_back(params(kind, GIFT_SCALE_BLOCK, sd, b));
      ps.push_back(params(kind, GIFT_SCALE_TILE, sd, 128, 3, 5));
      ps.push_back(params(kind, GIFT_SCALE_TILE, sd, 128, 32, 32));
    }
  uint32_t seed = 1;
  for (Shape s : shapes)
    for (giftQuantParams p : ps)
      for (int threads : {1, 2}) {
        use_threads(threads);
        const std::vector<float> x = gradient_like(s, seed++);
        const Encoded want = reference_encode(p, x, s);
        const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s);
        ASSERT_EQ(got.scales, want.scales) << describe(p, s);
        ASSERT_EQ(got.codes, want.codes) << describe(p, s);
        ASSERT_NO_FATAL_FAILURE(expect_code_times_scale(p, s, got));
      }
}

// Groups of every magnitude, their scales subnormal or zero included (a scale rounded down by
// half a subnormal step leaves values up to 1.5 times the FP8 maximum over it), in the layouts
// other than blocks, which convert a group's finite values as bounded (codec.cc, convert_span).
TEST(Codec, GroupsOfEveryMagnitudeMatchTheReference) {
  const Shape s{600, 96};
  std::mt19937 gen(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(s.rows * s.cols);
  for (uint64_t r = 0; r < s.rows; ++r) {
    // 64 mantissas in each binade from 2^-136 to 2^-133, where E5M2's fp32 scale is subnormal
    // (amax from 1.75 x 2^-134 to 1.3125 x 2^-133 gives one rounded down below amax / 57344);
    // then a binade a row from 2^-160 (scales of zero) up to fp32's largest.
    const float amax =
        r < 256 ? std::ldexp(1.0f + float(r % 64) / 64, -136 + int(r) / 64)
                : std::ldexp(1.0f + float(gen() % 1024) / 1024, std::min(-160 + int(r) - 256, 127));
    for (uint64_t c = 0; c < s.cols; ++c) x[r * s.cols + c] = amax * u(gen);
    x[r * s.cols + r % s.cols] = r % 3 ? amax : -amax;
  }
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
    for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
      for (const giftQuantParams& p :
           {params(kind, GIFT_SCALE_ROW, sd), params(kind, GIFT_SCALE_TILE, sd, 128, 1, 48),
            params(kind, GIFT_SCALE_TILE, sd, 128, 2, 96)}) {
        const Encoded want = reference_encode(p, x, s);
        const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s);
        ASSERT_EQ(got.scales, want.scales) << describe(p, s);
        ASSERT_EQ(got.codes, want.codes) << describe(p, s);
      }
}

// Tile rows are decoded in pieces of about 64K elements (codec.cc, decode_tile_rows): rows
// longer than that, with tiles that do not divide them nor the rows into whole tiles.
TEST(Codec, WideTileRowsDecodeInPieces) {
  const Shape s{5, 140003};
  const std::vector<float> x = gradient_like(s, 17);
  for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
    for (auto [tr, tc] : {std::pair{3u, 32u}, std::pair{2u, 100u}, std::pair{4u, 70001u}})
      for (int threads : {1, 2}) {
        use_threads(threads);
        const giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_TILE, sd, 128, tr, tc);
        const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s);
        ASSERT_EQ(got.scales, reference_encode(p, x, s).scales) << describe(p, s);
        ASSERT_NO_FATAL_FAILURE(expect_code_times_scale(p, s, got));
      }
}

TEST(Codec, LargeGroupsSplitAcrossThreadsGiveTheSameBytes) {
  // Tensor, row and tile scales (tiles as wide as the tensor) on a tensor large enough that one
  // group spans many threads' chunks.
  const Shape s{3, 400000};
  const std::vector<float> x = gradient_like(s, 99);
  for (auto layout : {GIFT_SCALE_TENSOR, GIFT_SCALE_ROW, GIFT_SCALE_TILE}) {
    giftQuantParams p = params(GIFT_FP8_E4M3, layout, GIFT_SCALE_DTYPE_F32, 128, 2, 400000);
    const Encoded want = reference_encode(p, x, s);
    for (int threads : {1, 2, 3, 0}) {
      use_threads(threads);
      const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s);
      ASSERT_EQ(got.scales, want.scales) << describe(p, s);
      ASSERT_EQ(got.codes, want.codes) << describe(p, s);
      const std::vector<float> y = decode(p, got, s);
      const std::vector<float> y1 = [&] {
        use_threads(1);
        const std::vector<float> one = decode(p, got, s);
        use_threads(threads);
        return one;
      }();
      ASSERT_EQ(0, std::memcmp(y.data(), y1.data(), y.size() * 4));
    }
  }
}

// Decoded outputs of 32 MiB and more are written with non-temporal stores (codec.cc,
// kStreamBytes): the same values as the cached stores of smaller decodes give, here the
// two halves of the tensor decoded apart, in every layout (each of decode_tensor's paths),
// for an output aligned to 64 and to 16 bytes.
TEST(Codec, LargeDecodesGiveTheValuesOfSmallOnes) {
  const Shape s{2048, 4224}, half{1024, 4224};  // 34.6 MiB of fp32
  const std::vector<float> x = gradient_like(s, 7);
  use_threads(0);
  std::vector<float> want(s.rows * s.cols), buffer(s.rows * s.cols + 32);
  for (auto layout : {GIFT_SCALE_BLOCK, GIFT_SCALE_TENSOR, GIFT_SCALE_ROW, GIFT_SCALE_TILE}) {
    const giftQuantParams p = params(GIFT_FP8_E4M3, layout, GIFT_SCALE_DTYPE_F32, 128, 32, 32);
    const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s);
    std::fill(want.begin(), want.end(), -7.0f);
    // Halves hold whole rows of groups, their scales in order; a tensor's one scale is both's.
    const uint64_t half_scales =
        layout == GIFT_SCALE_TENSOR ? e.scales.size() : e.scales.size() / 2;
    for (uint64_t h = 0; h < 2; ++h) {
      const uint64_t first = h * half.rows * half.cols;
      const uint8_t* sc = e.scales.data() + (layout == GIFT_SCALE_TENSOR ? 0 : h * half_scales);
      ASSERT_EQ(giftDecode(test_ctx(), &p, e.codes.data() + first, sc, half_scales, half.rows,
                           half.cols, want.data() + first, GIFT_DTYPE_F32),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
    for (size_t shift : {0, 4}) {  // floats past a 64-byte boundary
      float* out = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) &
                                            ~uintptr_t(63)) +
                   shift;
      std::fill(buffer.begin(), buffer.end(), -5.0f);
      ASSERT_EQ(giftDecode(test_ctx(), &p, e.codes.data(), e.scales.data(), e.scales.size(), s.rows,
                           s.cols, out, GIFT_DTYPE_F32),
                GIFT_OK)
          << giftGetLastErrorMessage();
      ASSERT_EQ(0, std::memcmp(out, want.data(), want.size() * 4))
          << describe(p, s) << " shift " << shift;
    }
  }
}

TEST(Codec, ErrorIsWithinHalfAStepOfTheGroupScale) {
  // Round to nearest: |x - decode| <= step/2 where the step at |x| is at most 2^-3 |x|
  // (E4M3) or the subnormal step, both in units of the scale.
  const Shape s{16, 1000};
  const std::vector<float> x = gradient_like(s, 5);
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 32);
  const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s);
  const std::vector<float> y = decode(p, e, s);
  for (uint64_t i = 0; i < x.size(); ++i) {
    float sc;
    std::memcpy(&sc, e.scales.data() + 4 * group_of(p, s, i / s.cols, i % s.cols), 4);
    const double bound =
        std::max(std::fabs(double(x[i])) / 16.0, std::ldexp(double(sc), -10)) * 1.0001;
    ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), bound) << i;
  }
}

TEST(Codec, ZeroGroupsDecodeToZero) {
  const Shape s{4, 256};
  std::vector<float> x(s.rows * s.cols, 0.0f);
  x[300] = 1.5f;  // row 1 is non-zero, the others are all zero
  for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
    giftQuantParams p = params(GIFT_FP8_E5M2, GIFT_SCALE_ROW, sd);
    const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s);
    const std::vector<float> y = decode(p, e, s);
    for (uint64_t i = 0; i < x.size(); ++i) {
      if (i / s.cols != 1) {
        ASSERT_EQ(e.codes[i], 0) << i;
        ASSERT_EQ(y[i], 0.0f);
        ASSERT_FALSE(std::signbit(y[i]));
      }
    }
    EXPECT_EQ(y[300], 1.5f);
  }
  // A group whose fp32 scale underflows (amax/max < smallest subnormal) is a zero group.
  std::vector<float> tiny = {1e-45f, -1e-45f, 0.0f, 1e-45f};
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_TENSOR, GIFT_SCALE_DTYPE_F32);
  const Encoded e = encode(p, tiny.data(), GIFT_DTYPE_F32, {1, 4});
  for (uint8_t c : e.codes) EXPECT_EQ(c, 0);
}

TEST(Codec, E8M0SaturatesAboveMaxAsOcpMx) {
  // amax = 500: s = 2^(8 - 8) = 1, and 500 saturates to 448 (E4M3), as MX v1.0 specifies.
  std::vector<float> x = {500.0f, -300.0f, 1.0f, 0.0f};
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_TENSOR, GIFT_SCALE_DTYPE_E8M0);
  giftEncodeStats st;
  const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, {1, 4}, &st);
  EXPECT_EQ(e.scales[0], 127);
  EXPECT_EQ(e.codes[0], 0x7E);
  EXPECT_EQ(decode(p, e, {1, 4})[1], -288.0f);  // 300 rounds to 288 (step 32)
  EXPECT_EQ(st.amax, 500.0f);
}

TEST(Codec, NonFiniteInputIsAnErrorThatNamesCountAndFirstIndex) {
  const Shape s{3, 200};
  std::vector<float> x = gradient_like(s, 8);
  x[257] = std::nanf("");
  x[412] = INFINITY;
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 64);
  std::vector<uint8_t> codes(x.size());
  uint64_t bytes;
  giftScaleBytes(&p, s.rows, s.cols, &bytes);
  std::vector<uint8_t> scales(bytes);
  giftEncodeStats st;
  EXPECT_EQ(giftEncode(nullptr, &p, x.data(), GIFT_DTYPE_F32, s.rows, s.cols, codes.data(),
                       scales.data(), bytes, &st),
            GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_EQ(std::string(giftGetLastErrorMessage()),
            "2 non-finite values in the input, the first at index 257 (row 1, column 57)");
  EXPECT_EQ(st.nonfinite_count, 2u);
  EXPECT_EQ(st.first_nonfinite, 257u);
}

TEST(Codec, InfInAnOtherwiseZeroGroupDecodesToInf) {
  // fp32 scale 0 (finite amax 0): Inf * 0 would be NaN; FORMAT.md 1.5 keeps Inf codes Inf.
  std::vector<float> x = {0.0f, INFINITY, 0.0f, -INFINITY};
  for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
    giftQuantParams p = params(GIFT_FP8_E5M2, GIFT_SCALE_TENSOR, sd);
    p.nonfinite = GIFT_NONFINITE_KEEP;
    const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, {1, 4});
    const std::vector<float> y = decode(p, e, {1, 4});
    EXPECT_EQ(y[1], INFINITY);
    EXPECT_EQ(y[3], -INFINITY);
    EXPECT_EQ(y[0], 0.0f);
  }
}

TEST(Codec, CallerFlushToZeroAndRoundingModeDoNotChangeTheBytes) {
  // Tiny values make subnormal FP8 codes and subnormal intermediate fp32 values.
  const Shape s{64, 256};
  std::vector<float> x = gradient_like(s, 31);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;
  std::vector<giftQuantParams> ps = {
      params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 32),
      params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_E8M0),
      params(GIFT_FP8_E5M2, GIFT_SCALE_TILE, GIFT_SCALE_DTYPE_E8M0, 128, 8, 8)};
  for (giftQuantParams p : ps) {
    for (int threads : {1, 2}) {
      use_threads(threads);
      const Encoded want = encode(p, x.data(), GIFT_DTYPE_F32, s);
      const std::vector<float> want_y = decode(p, want, s);
      // FTZ, DAZ and round-toward-zero on this thread and every pool thread.
      const unsigned saved = _mm_getcsr();
#pragma omp parallel num_threads(2)
      _mm_setcsr(saved | 0x8000u | 0x0040u | 0x6000u);
      _mm_setcsr(saved | 0x8000u | 0x0040u | 0x6000u);
      const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s);
      const std::vector<float> got_y = decode(p, got, s);
      const unsigned after = _mm_getcsr();
#pragma omp parallel num_threads(2)
      _mm_setcsr(saved);
      _mm_setcsr(saved);
      EXPECT_EQ(after, saved | 0x8000u | 0x0040u | 0x6000u) << "the caller's mode is restored";
      EXPECT_EQ(got.codes, want.codes) << describe(p, s);
      EXPECT_EQ(got.scales, want.scales) << describe(p, s);
      EXPECT_EQ(0, std::memcmp(got_y.data(), want_y.data(), want_y.size() * 4)) << describe(p, s);
    }
  }
}

// Called from each thread of a caller's parallel region (as the transport encodes its shards),
// where the runtime allows no nested region, the codec runs a team of one on each: the same
// codes, scales, statistics and decoded values as a call from outside, on each of encode's
// and decode's paths (blocks, tiles, the per-group path of rows, groups split into chunks).
TEST(Codec, CallsInsideAParallelRegionGiveTheBytesOfCallsOutside) {
  const Shape s{64, 4100};  // above kSplitGroupElems, so a tensor's scale splits on threads
  const std::vector<float> x = gradient_like(s, 77);
  const std::vector<giftQuantParams> ps = {
      params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 32),
      params(GIFT_FP8_E5M2, GIFT_SCALE_TILE, GIFT_SCALE_DTYPE_E8M0, 128, 8, 16),
      params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32),
      params(GIFT_FP8_E4M3, GIFT_SCALE_TENSOR, GIFT_SCALE_DTYPE_F32)};
  const int levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  for (const giftQuantParams& p : ps) {
    use_threads(0);
    giftEncodeStats want_stats{};
    const Encoded want = encode(p, x.data(), GIFT_DTYPE_F32, s, &want_stats);
    const std::vector<float> want_y = decode(p, want, s);
    Encoded got[2];
    giftEncodeStats got_stats[2] = {};
    std::vector<float> got_y[2];
    int team = 0;
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      giftCtx* ctx = nullptr;  // one context per thread, as gift.h asks
      giftCtxCreate(&ctx);
      got[t] = encode(p, x.data(), GIFT_DTYPE_F32, s, &got_stats[t], ctx);
      got_y[t] = decode(p, got[t], s, ctx);
      giftCtxFree(ctx);
#pragma omp single
      team = omp_get_num_threads();
    }
    if (team != 2) {
      omp_set_max_active_levels(levels);
      GTEST_SKIP() << "the runtime gave the outer region one thread";
    }
    for (int t = 0; t < 2; ++t) {
      SCOPED_TRACE("thread " + std::to_string(t) + ": " + describe(p, s));
      EXPECT_EQ(got[t].codes, want.codes);
      EXPECT_EQ(got[t].scales, want.scales);
      EXPECT_EQ(got_stats[t].amax, want_stats.amax);
      EXPECT_EQ(got_stats[t].nonfinite_count, want_stats.nonfinite_count);
      EXPECT_EQ(0, std::memcmp(got_y[t].data(), want_y.data(), want_y.size() * 4));
    }
  }
  omp_set_max_active_levels(levels);
}

TEST(Codec, KeepPolicyStoresNanAndInfCodesWithFiniteScales) {
  const Shape s{1, 64};
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = float(i) - 20.0f;  // finite amax 43
  x[3] = std::nanf("");
  x[5] = INFINITY;
  x[6] = -INFINITY;
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    giftQuantParams p = params(kind, GIFT_SCALE_TENSOR, GIFT_SCALE_DTYPE_F32);
    p.nonfinite = GIFT_NONFINITE_KEEP;
    giftEncodeStats st;
    const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s, &st);
    float sc;
    std::memcpy(&sc, e.scales.data(), 4);
    EXPECT_EQ(sc, 43.0f / (kind == GIFT_FP8_E4M3 ? 448.0f : 57344.0f));
    EXPECT_EQ(e.codes[3], 0x7F);
    EXPECT_EQ(e.codes[5], kind == GIFT_FP8_E5M2 ? 0x7C : 0x7F);
    EXPECT_EQ(e.codes[6], kind == GIFT_FP8_E5M2 ? 0xFC : 0x7F);
    const std::vector<float> y = decode(p, e, s);
    EXPECT_TRUE(std::isnan(y[3]));
    if (kind == GIFT_FP8_E5M2) {
      EXPECT_EQ(y[5], INFINITY);
      EXPECT_EQ(y[6], -INFINITY);
    }
    EXPECT_EQ(y[63], 43.0f);
    EXPECT_EQ(st.nonfinite_count, 3u);
  }
}

uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// Rows long enough for the block encoder to read them as four parts side by side (on AVX-512,
// where it chooses to; both ways are taken here): NaN and Inf in the first block, a middle
// one, the last block of a part and the last of a row make the encoder redo the run; every block
// then has the scale and codes it has with zeros in those places, but for the NaN and Inf codes
// themselves. The same for tiles, whose rows of tiles are taken in pieces (codec.cc,
// encode_tile_rows) and a piece holding one tile by tile.
TEST(Codec, NonFiniteValuesInLongRowsKeepEveryOtherCode) {
  // 157 blocks of 128 per row, parts of 40; and rows of whole blocks, the tensor one run of
  // 320 blocks across rows (codec.cc, for_each_block_run), parts of 80.
  struct Restore {
    ~Restore() { gift::simd::set_read_in_parts_for_test(-1); }
  } restore;
  for (const int parts : {0, 1})
    for (const Shape s : {Shape{2, 20000}, Shape{40, 1024}}) {
      gift::simd::set_read_in_parts_for_test(parts);
      const std::vector<uint64_t> at = {3, 64 * 128 + 5, 39 * 128 + 127, 20000 - 1,
                                        20000 + 80 * 128};
      std::vector<float> x = gradient_like(s, 41), zeroed = x;
      for (size_t k = 0; k < at.size(); ++k) {
        x[at[k]] = k % 2 ? -INFINITY : std::nanf("");
        zeroed[at[k]] = 0.0f;
      }
      for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2})
        for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
          for (giftQuantParams p : {params(kind, GIFT_SCALE_BLOCK, sd, 128),
                                    params(kind, GIFT_SCALE_TILE, sd, 128, 3, 100),
                                    params(kind, GIFT_SCALE_TILE, sd, 128, 8, 128)})
            for (int threads : {1, 2}) {
              use_threads(threads);
              p.nonfinite = GIFT_NONFINITE_KEEP;
              giftEncodeStats st;
              const Encoded got = encode(p, x.data(), GIFT_DTYPE_F32, s, &st);
              const Encoded want = encode(p, zeroed.data(), GIFT_DTYPE_F32, s);
              EXPECT_EQ(st.nonfinite_count, at.size());
              EXPECT_EQ(st.first_nonfinite, at[0]);
              ASSERT_EQ(got.scales, want.scales) << describe(p, s);
              for (uint64_t i = 0; i < x.size(); ++i) {
                const bool nan = std::isnan(x[i]), inf = std::isinf(x[i]);
                const uint8_t code = nan || kind == GIFT_FP8_E4M3 ? 0x7F : 0xFC;  // -Inf in E5M2
                ASSERT_EQ(got.codes[i], nan || inf ? code : want.codes[i])
                    << describe(p, s) << " i=" << i;
              }
            }
    }
}

TEST(Codec, Bf16AndFp16InputsEncodeAsTheirExactFp32Widening) {
  GIFT_SKIP_WITHOUT_FLOAT16();
  const Shape s{9, 515};
  const std::vector<float> x = gradient_like(s, 21);
  std::vector<uint16_t> xb(x.size()), xh(x.size());
  std::vector<float> wb(x.size()), wh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16_of(x[i]);
    wb[i] = gift::num::bf16_to_float(xb[i]);
    xh[i] = compiler_half_bits(x[i]);
    wh[i] = compiler_half_value(xh[i]);
  }
  for (auto layout : {GIFT_SCALE_TENSOR, GIFT_SCALE_BLOCK, GIFT_SCALE_TILE}) {
    giftQuantParams p = params(GIFT_FP8_E4M3, layout, GIFT_SCALE_DTYPE_F32, 32, 4, 100);
    const Encoded fb = encode(p, wb.data(), GIFT_DTYPE_F32, s);
    const Encoded b = encode(p, xb.data(), GIFT_DTYPE_BF16, s);
    EXPECT_EQ(b.codes, fb.codes);
    EXPECT_EQ(b.scales, fb.scales);
    const Encoded fh = encode(p, wh.data(), GIFT_DTYPE_F32, s);
    const Encoded h = encode(p, xh.data(), GIFT_DTYPE_F16, s);
    EXPECT_EQ(h.codes, fh.codes);
    EXPECT_EQ(h.scales, fh.scales);
  }
}

TEST(Codec, Bf16AndFp16OutputsRoundTheFp32Decode) {
  GIFT_SKIP_WITHOUT_FLOAT16();
  const Shape s{5, 333};
  const std::vector<float> x = gradient_like(s, 4);
  giftQuantParams p = params(GIFT_FP8_E5M2, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32);
  const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s);
  const std::vector<float> y = decode(p, e, s);
  std::vector<uint16_t> yb(x.size()), yh(x.size());
  ASSERT_EQ(giftDecode(test_ctx(), &p, e.codes.data(), e.scales.data(), e.scales.size(), s.rows,
                       s.cols, yb.data(), GIFT_DTYPE_BF16),
            GIFT_OK);
  ASSERT_EQ(giftDecode(test_ctx(), &p, e.codes.data(), e.scales.data(), e.scales.size(), s.rows,
                       s.cols, yh.data(), GIFT_DTYPE_F16),
            GIFT_OK);
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(yb[i], gift::num::bf16_from_float(y[i])) << i;
    ASSERT_EQ(yh[i], compiler_half_bits(y[i])) << i;
  }
}

TEST(Codec, StochasticRoundingIsDeterministicPerSeedTensorAndElement) {
  const Shape s{8, 1000};
  const std::vector<float> x = gradient_like(s, 12);
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 128);
  p.rounding = GIFT_ROUND_STOCHASTIC;
  p.seed = 42;
  use_threads(1);
  const Encoded a = encode(p, x.data(), GIFT_DTYPE_F32, s);
  use_threads(2);
  EXPECT_EQ(encode(p, x.data(), GIFT_DTYPE_F32, s).codes, a.codes);
  p.tensor_index = 1;
  EXPECT_NE(encode(p, x.data(), GIFT_DTYPE_F32, s).codes, a.codes);
  p.tensor_index = 0;
  p.seed = 43;
  EXPECT_NE(encode(p, x.data(), GIFT_DTYPE_F32, s).codes, a.codes);
  // Element i uses word i mod 4 of Philox block i / 4: check one element by hand.
  const uint64_t i = 4321;
  float sc;
  std::memcpy(&sc, a.scales.data() + 4 * (4 * 8 + 321 / 128), 4);  // row 4, block 2 of 8
  const uint32_t r = gift::num::sr_uniforms(42, 0, i / 4).v[i % 4];
  EXPECT_EQ(a.codes[i], gift::num::fp8_from_float_sr<Fp8::kE4M3>(x[i] / sc, r));
}

TEST(Codec, StochasticRoundingMeanConvergesThroughTheEncoder) {
  // Mean over seeds of the decoded tensor approaches x; bound as in fp8_rules_test.
  const Shape s{2, 256};
  const std::vector<float> x = gradient_like(s, 77);
  giftQuantParams p = params(GIFT_FP8_E5M2, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 64);
  p.rounding = GIFT_ROUND_STOCHASTIC;
  constexpr int kN = 4000;
  std::vector<double> sum(x.size(), 0.0);
  std::vector<float> step(x.size());
  for (int seed = 0; seed < kN; ++seed) {
    p.seed = uint64_t(seed);
    const Encoded e = encode(p, x.data(), GIFT_DTYPE_F32, s);
    const std::vector<float> y = decode(p, e, s);
    for (size_t i = 0; i < x.size(); ++i) {
      sum[i] += y[i];
      if (seed == 0) {
        float sc;
        std::memcpy(&sc, e.scales.data() + 4 * group_of(p, s, i / s.cols, i % s.cols), 4);
        // E5M2 step at |x|: 2^(floor(log2|x/sc|) - 2), at least the subnormal step 2^-16.
        const double v = std::fabs(double(x[i]) / sc);
        int ex = 0;
        if (v > 0) std::frexp(v, &ex);
        step[i] = float(std::ldexp(1.0, std::max(ex - 1 - 2, -16)) * sc);
      }
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(sum[i] / kN, double(x[i]), 4.0 * step[i] / std::sqrt(double(kN))) << i;
  }
}

TEST(Codec, InvalidArgumentsAreRejectedWithAMessage) {
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 100);
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(giftGetLastErrorMessage()),
            "block size 100 is not a power of two in [16, 4096]");
  p.block = 8192;
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
  p = params(GIFT_FP8_E4M3, GIFT_SCALE_TILE, GIFT_SCALE_DTYPE_F32, 128, 0, 4);
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
  // A C caller can store any int in an enum field; the library must read it as an int.
  p = params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32);
  const int seven = 7;
  std::memcpy(&p.kind, &seven, sizeof seven);
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);

  p = params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32);
  std::vector<float> x(40, 1.0f);
  std::vector<uint8_t> codes(40), scales(16);
  EXPECT_EQ(giftEncode(nullptr, &p, x.data(), GIFT_DTYPE_F32, 5, 8, codes.data(), scales.data(), 16,
                       nullptr),
            GIFT_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(std::string(giftGetLastErrorMessage()), "scales buffer holds 16 bytes, 20 needed");
  EXPECT_EQ(giftEncode(nullptr, &p, nullptr, GIFT_DTYPE_F32, 5, 8, codes.data(), scales.data(), 20,
                       nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  uint64_t n;
  EXPECT_EQ(giftScaleCount(&p, uint64_t(1) << 40, uint64_t(1) << 40, &n),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(giftGetErrorString(GIFT_ERROR_NONFINITE_INPUT), "non-finite input");
}

TEST(Codec, MisalignedBuffersAreRefusedNotMisread) {
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32);
  std::vector<uint8_t> bytes(4 * 40 + 4), codes(40), scales(4 * 5 + 4);
  float* aligned = reinterpret_cast<float*>(bytes.data());
  EXPECT_EQ(giftEncode(nullptr, &p, reinterpret_cast<uint8_t*>(aligned) + 1, GIFT_DTYPE_F32, 5, 8,
                       codes.data(), scales.data(), 20, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("not aligned"), std::string::npos);
  EXPECT_EQ(giftEncode(nullptr, &p, aligned, GIFT_DTYPE_F32, 5, 8, codes.data(), scales.data() + 2,
                       20, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftDecode(nullptr, &p, codes.data(), scales.data(), 20, 5, 8,
                       reinterpret_cast<uint8_t*>(aligned) + 2, GIFT_DTYPE_F32),
            GIFT_ERROR_INVALID_ARGUMENT);
  // Two-byte types need two-byte alignment only; E8M0 scales none.
  p.scale_dtype = GIFT_SCALE_DTYPE_E8M0;
  EXPECT_EQ(giftEncode(nullptr, &p, bytes.data() + 2, GIFT_DTYPE_BF16, 5, 8, codes.data(),
                       scales.data() + 1, 5, nullptr),
            GIFT_OK)
      << giftGetLastErrorMessage();
}

TEST(Codec, ScaleCountsFollowTheGrid) {
  uint64_t n = 0;
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 128);
  giftScaleCount(&p, 10, 300, &n);
  EXPECT_EQ(n, 30u);  // 3 blocks per row, the last 44 long
  p = params(GIFT_FP8_E4M3, GIFT_SCALE_TILE, GIFT_SCALE_DTYPE_E8M0, 128, 4, 64);
  giftScaleCount(&p, 10, 300, &n);
  EXPECT_EQ(n, 15u);
  uint64_t bytes = 0;
  giftScaleBytes(&p, 10, 300, &bytes);
  EXPECT_EQ(bytes, 15u);
  p = params(GIFT_FP8_E4M3, GIFT_SCALE_TENSOR, GIFT_SCALE_DTYPE_F32);
  giftScaleCount(&p, 0, 0, &n);
  EXPECT_EQ(n, 1u);
  p = params(GIFT_FP8_E4M3, GIFT_SCALE_ROW, GIFT_SCALE_DTYPE_F32);
  giftScaleCount(&p, 6, 0, &n);
  EXPECT_EQ(n, 6u);
}

}  // namespace
