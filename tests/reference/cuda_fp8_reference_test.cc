// The normative FP8 rule against CUDA's own host conversion (cuda_fp8.h), on all 2^32 fp32
// bit patterns, through the scalar rule and both vectorized span kernels. Also decode of
// all 256 codes against CUDA's FP8 -> half conversion.
#include <cuda_fp8.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "numerics/elementwise.h"
#include "numerics/simd.h"

namespace {

using gift::num::Fp8;

struct Case {
  Fp8 kind;
  __nv_fp8_interpretation_t cuda;
  giftFp8Kind_t api;
};

class CudaReference : public ::testing::TestWithParam<Case> {};

TEST_P(CudaReference, AllFp32BitPatternsScalarAndVector) {
  const Case k = GetParam();
  constexpr uint64_t kChunk = uint64_t(1) << 22;
  constexpr int64_t kChunks = int64_t((uint64_t(1) << 32) / kChunk);
  int64_t first_bad = -1;
#pragma omp parallel
  {
    std::vector<float> x(kChunk);
    std::vector<uint8_t> vec(kChunk), bounded(kChunk);
#pragma omp for schedule(dynamic)
    for (int64_t c = 0; c < kChunks; ++c) {
      const uint32_t base = uint32_t(uint64_t(c) * kChunk);
      for (uint64_t i = 0; i < kChunk; ++i) x[i] = gift::num::float_of(base + uint32_t(i));
      // Multiplying by 1 is exact, so the span kernel sees the raw patterns.
      gift::simd::quantize_rn(x.data(), GIFT_DTYPE_F32, kChunk, 1.0f, false, k.api, vec.data());
      // The block encoder's conversion, defined for |x| < 2^17.
      gift::simd::quantize_rn_bounded(x.data(), GIFT_DTYPE_F32, kChunk, 1.0f, false, k.api,
                                      bounded.data());
      for (uint64_t i = 0; i < kChunk; ++i) {
        const uint8_t want = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, k.cuda);
        const uint8_t scalar = k.kind == Fp8::kE4M3
                                   ? gift::num::fp8_from_float_rn<Fp8::kE4M3>(x[i])
                                   : gift::num::fp8_from_float_rn<Fp8::kE5M2>(x[i]);
        const bool bounded_domain = std::fabs(x[i]) < 131072.0f;
        if (scalar != want || vec[i] != want || (bounded_domain && bounded[i] != want)) {
#pragma omp critical
          if (first_bad < 0 || int64_t(base + i) < first_bad) first_bad = int64_t(base + i);
          break;
        }
      }
    }
  }
  EXPECT_EQ(first_bad, -1) << "first mismatching fp32 pattern 0x" << std::hex << first_bad;
}

TEST_P(CudaReference, DecodeAll256Codes) {
  const Case k = GetParam();
  for (int c = 0; c < 256; ++c) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), k.cuda);
    const float want = __half2float(__half(h));
    const float got = k.kind == Fp8::kE4M3 ? gift::num::fp8_to_float<Fp8::kE4M3>(uint8_t(c))
                                           : gift::num::fp8_to_float<Fp8::kE5M2>(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(gift::num::bits_of(got), gift::num::bits_of(want)) << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaReference,
                         ::testing::Values(Case{Fp8::kE4M3, __NV_E4M3, GIFT_FP8_E4M3},
                                           Case{Fp8::kE5M2, __NV_E5M2, GIFT_FP8_E5M2}),
                         [](const auto& info) {
                           return std::string(info.param.kind == Fp8::kE4M3 ? "E4M3" : "E5M2");
                         });

}  // namespace
