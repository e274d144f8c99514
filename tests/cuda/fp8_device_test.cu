// The shared per-element header (numerics/elementwise.h) on the GPU. The functions the CPU
// encoder calls are run in kernels and must give the host's bytes (FP8 codes, decode, scales,
// stochastic rounding and its Philox words, 16-bit floats), and the FP8 rule must equal the
// GPU's own conversion, __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind) (the cvt.rn.satfinite
// instruction on sm_89 and later), for all 2^32 fp32 bit patterns.
//
// Without a usable CUDA device (CI, build machines) every test skips. With
// GIFT_REQUIRE_CUDA_DEVICE=1 a missing device is a failure instead, so a GPU run cannot pass by
// skipping everything (tests/cuda/run_on_gpu.sh sets it).
//
// Every output buffer is poisoned with 0xAA bytes before its kernel, and every result is
// stored widened (codes as 32-bit words, floats and 16-bit values as 64-bit words), so the
// poison is never a valid result and an element the kernel did not write fails the test.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/device_test_util.h"
#include "numerics/elementwise.h"

namespace {

namespace num = gift::num;
using namespace gift::testing;
using num::Fp8;

bool IsNanBits(uint64_t w) { return w <= 0xFFFFFFFFu && (w & 0x7FFFFFFFu) > 0x7F800000u; }

// For ExpectSameWords: every word bit for bit, NaNs included.
const auto kExact = [](size_t) { return false; };

std::string Hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Host and device words must be equal. Where nan_ok(i), two fp32 NaNs of any payload count as
// equal (for results of a float operation on a NaN input, whose payload IEEE leaves open).
// describe(i) names element i in the message; the first few mismatches are listed.
template <class NanOk, class Describe>
void ExpectSameWords(const std::vector<uint64_t>& host, const std::vector<uint64_t>& dev,
                     NanOk nan_ok, Describe describe) {
  ASSERT_EQ(host.size(), dev.size());
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] == dev[i] || (nan_ok(i) && IsNanBits(host[i]) && IsNanBits(dev[i]))) continue;
    if (bad < 8) {
      first << "\n  " << describe(i) << ": host " << Hex(host[i]) << ", device " << Hex(dev[i])
            << (dev[i] == 0xAAAAAAAAAAAAAAAAull || dev[i] == 0xAAAAAAAAull ? " (never written)"
                                                                           : "");
    }
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << host.size() << " results differ:" << first.str();
}

using CudaDevice = WithCudaDevice<::testing::Test>;

struct Kind {
  Fp8 kind;
  __nv_fp8_interpretation_t cuda;
  const char* name;
};

// Names the parameter in test output (gtest would print its bytes, padding included).
void PrintTo(const Kind& k, std::ostream* os) { *os << k.name; }

class CudaDeviceKinds : public WithCudaDevice<::testing::TestWithParam<Kind>> {};

// ---- Inputs -----------------------------------------------------------------------------

// fp32 inputs that reach every branch of the rules: the boundaries of both kinds, any bit
// pattern (every class), values over the FP8 range and below it, fp32 subnormals, and values
// on or halfway between FP8 steps (ties).
std::vector<float> SampleInputs(size_t n, uint64_t seed) {
  static const uint32_t kSpecial[] = {
      0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001,
      0x7FC00000, 0x7FFFFFFF, 0x3F800000, 0x43E00000, 0x43E80000, 0x43EFFFFF, 0x43F00000,
      0x47600000, 0x476FFFFF, 0x47700000, 0x477FFFFF, 0x3C800000, 0x3C7FFFFF, 0x3B000000,
      0x3A800000, 0x3A800001, 0x38800000, 0x387FFFFF, 0x37800000, 0x37000000, 0x37000001};
  std::mt19937_64 rng(seed);
  std::vector<float> x;
  x.reserve(n);
  for (uint32_t s : kSpecial) {
    x.push_back(num::float_of(s));
    x.push_back(num::float_of(s | 0x80000000u));
  }
  while (x.size() < n) {
    const uint64_t w = rng();
    const uint32_t hi = uint32_t(w >> 32), sign = hi & 0x80000000u;
    uint32_t bits;
    switch (w & 3) {
      case 0:  // any pattern
        bits = hi;
        break;
      case 1:  // exponents 2^-28 .. 2^17: E5M2 subnormals up to past both maxima
        bits = sign | (uint32_t(127 - 28 + (w >> 2) % 46) << 23) | (hi & 0x7FFFFFu);
        break;
      case 2:  // fp32 subnormals and zeros
        bits = hi & 0x807FFFFFu;
        break;
      default:  // four leading mantissa bits only: FP8 values and exact ties
        bits = sign | (uint32_t(127 - 20 + (w >> 2) % 40) << 23) | (((hi >> 8) & 0xFu) << 19);
        break;
    }
    x.push_back(num::float_of(bits));
  }
  x.resize(n);
  return x;
}

// Group maxima for the scale rules: zero, every fp32 subnormal bit position, every exponent
// field with several mantissas, non-finite and negative values, and random finite ones.
std::vector<float> SampleAmax(size_t n_random, uint64_t seed) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                0xFFC00000, 0x7F800001, 0xBF800000, 0x007FFFFF, 0x7F7FFFFF};
  for (int k = 0; k < 23; ++k) {
    bits.push_back(1u << k);
    bits.push_back((2u << k) - 1u);
  }
  for (uint32_t e = 1; e < 255; ++e) {
    for (uint32_t m : {0x000000u, 0x000001u, 0x400000u, 0x600000u, 0x7FFFFFu}) {
      bits.push_back((e << 23) | m);
    }
  }
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n_random; ++i) {
    const uint32_t w = uint32_t(rng());
    // Half any positive finite pattern, half subnormals.
    bits.push_back(i & 1 ? (w % 0x7F800000u) : (w & 0x007FFFFFu));
  }
  std::vector<float> a;
  a.reserve(bits.size());
  for (uint32_t b : bits) a.push_back(num::float_of(b));
  return a;
}

// ---- Kernels ----------------------------------------------------------------------------

// Mismatch record of the exhaustive comparison; unsigned long long for atomics.
struct Mismatches {
  unsigned long long count;          // patterns where the rule and CUDA differ
  unsigned long long nan_count;      // of which NaN inputs
  unsigned long long first_nan;      // smallest such NaN pattern, or ~0
  unsigned long long first_non_nan;  // smallest such non-NaN pattern, or ~0
  unsigned long long visited;        // patterns compared, 2^32 at the end
};

template <Fp8 K, __nv_fp8_interpretation_t I>
__global__ void ExhaustiveRnKernel(uint64_t base, uint64_t n, Mismatches* m) {
  unsigned long long visited = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t bits = uint32_t(base + i);
    const float x = num::float_of(bits);
    const uint8_t got = num::fp8_rn_rule<K>(x);
    const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, I);
    ++visited;
    if (got != want) {
      atomicAdd(&m->count, 1ull);
      if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        atomicAdd(&m->nan_count, 1ull);
        atomicMin(&m->first_nan, static_cast<unsigned long long>(bits));
      } else {
        atomicMin(&m->first_non_nan, static_cast<unsigned long long>(bits));
      }
    }
  }
  atomicAdd(&m->visited, visited);
}

// Both conversions of one pattern on the device, for the failure message.
template <Fp8 K, __nv_fp8_interpretation_t I>
__global__ void ProbeRnKernel(uint32_t bits, uint32_t* out) {
  const float x = num::float_of(bits);
  out[0] = num::fp8_rn_rule<K>(x);
  out[1] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, I);
}

template <Fp8 K>
__global__ void RnKernel(const float* x, size_t n, uint32_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = num::fp8_from_float_rn<K>(x[i]);
  }
}

template <Fp8 K>
__global__ void DecodeKernel(uint64_t* out) {
  const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < 256) out[c] = num::bits_of(num::fp8_to_float<K>(static_cast<uint8_t>(c)));
}

template <Fp8 K>
__global__ void SrKernel(const float* x, const uint32_t* r, size_t n, uint64_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = num::fp8_from_float_sr<K>(x[i], r[i]);
  }
}

// Element first + i of a tensor, rounded as the encoder does it: the uniform is word
// (index & 3) of sr_uniforms(seed, tensor, index >> 2).
template <Fp8 K>
__global__ void SrEncodeKernel(const float* x, size_t n, uint64_t first, uint64_t seed,
                               uint32_t tensor, uint64_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t index = first + i;
    const uint32_t r = num::sr_uniforms(seed, tensor, index >> 2).v[index & 3];
    out[i] = num::fp8_from_float_sr<K>(x[i], r);
  }
}

__global__ void UniformsKernel(uint64_t seed, uint32_t tensor, const uint64_t* j, size_t n,
                               uint64_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const num::U32x4 u = num::sr_uniforms(seed, tensor, j[i]);
    for (int k = 0; k < 4; ++k) out[4 * i + k] = u.v[k];
  }
}

constexpr int kScaleWords = 5;

// Per amax: E8M0 byte for both kinds, fp32 scale for both kinds, floor_log2 (finite a > 0).
__global__ void ScaleKernel(const float* amax, size_t n, uint64_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float a = amax[i];
    uint64_t* o = out + kScaleWords * i;
    o[0] = num::scale_e8m0(a, Fp8::kE4M3);
    o[1] = num::scale_e8m0(a, Fp8::kE5M2);
    o[2] = num::bits_of(num::scale_f32(a, Fp8::kE4M3));
    o[3] = num::bits_of(num::scale_f32(a, Fp8::kE5M2));
    o[4] = a > 0.0f && num::bits_of(a) < 0x7F800000u ? uint32_t(num::floor_log2(a)) : 0u;
  }
}

// Per E8M0 byte: its value and its reciprocal.
__global__ void E8m0Kernel(uint64_t* out) {
  const unsigned b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < 256) {
    out[2 * b] = num::bits_of(num::e8m0_to_float(static_cast<uint8_t>(b)));
    out[2 * b + 1] = num::bits_of(num::e8m0_reciprocal(static_cast<uint8_t>(b)));
  }
}

// Per fp32 input: bf16 and binary16 codes, one word.
__global__ void Narrow16Kernel(const float* x, size_t n, uint64_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = uint64_t(num::bf16_from_float(x[i])) | (uint64_t(num::f16_from_float(x[i])) << 16);
  }
}

// Per 16-bit pattern: its value as bf16 and as binary16.
__global__ void Widen16Kernel(uint64_t* out) {
  const unsigned h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h < 65536) {
    out[2 * h] = num::bits_of(num::bf16_to_float(static_cast<uint16_t>(h)));
    out[2 * h + 1] = num::bits_of(num::f16_to_float(static_cast<uint16_t>(h)));
  }
}

// ---- Round to nearest ---------------------------------------------------------------------

template <Fp8 K, __nv_fp8_interpretation_t I>
void CheckAllPatternsAgainstHardware(const char* name) {
  constexpr uint64_t kChunk = uint64_t(1) << 28;
  DeviceBuffer<Mismatches> m;
  CUDA_CHECK(m.Alloc(1));
  const Mismatches init{0, 0, ~0ull, ~0ull, 0};
  CUDA_CHECK(cudaMemcpy(m.get(), &init, sizeof init, cudaMemcpyHostToDevice));
  for (uint64_t base = 0; base < (uint64_t(1) << 32); base += kChunk) {
    ExhaustiveRnKernel<K, I><<<Blocks(kChunk), kThreads>>>(base, kChunk, m.get());
    CUDA_CHECK_LAUNCH();
  }
  Mismatches got{};
  CUDA_CHECK(cudaMemcpy(&got, m.get(), sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got.visited, uint64_t(1) << 32) << name << ": not every pattern was compared";

  std::string detail;
  if (got.count) {
    DeviceBuffer<uint32_t> probe;
    CUDA_CHECK(probe.Alloc(2));
    CUDA_CHECK(probe.Poison());
    const uint32_t first = uint32_t(got.first_non_nan != ~0ull ? got.first_non_nan : got.first_nan);
    ProbeRnKernel<K, I><<<1, 1>>>(first, probe.get());
    CUDA_CHECK_LAUNCH();
    std::vector<uint32_t> codes;
    CUDA_CHECK(probe.Download(&codes));
    detail = "; at pattern " + Hex(first) + " the rule gives " + Hex(codes[0]) +
             " and __nv_cvt_float_to_fp8 gives " + Hex(codes[1]);
  }
  EXPECT_EQ(got.count - got.nan_count, 0u)
      << name << ": " << got.count - got.nan_count << " non-NaN fp32 patterns differ, first "
      << Hex(got.first_non_nan) << detail;
  EXPECT_EQ(got.nan_count, 0u) << name << ": " << got.nan_count << " NaN patterns differ, first "
                               << Hex(got.first_nan) << detail;
}

TEST_P(CudaDeviceKinds, RnEqualsHardwareConversionOnAll2To32Patterns) {
  const Kind k = GetParam();
  if (prop_.major * 10 + prop_.minor < 89) {
    // The comparison still runs, but against cuda_fp8.hpp's software path, not the hardware.
    std::printf(
        "note: %s is sm_%d%d; __nv_cvt_float_to_fp8 uses cvt.rn.satfinite only on "
        "sm_89 and later\n",
        prop_.name, prop_.major, prop_.minor);
  }
  RecordProperty("device", prop_.name);
  if (k.kind == Fp8::kE4M3) {
    CheckAllPatternsAgainstHardware<Fp8::kE4M3, __NV_E4M3>(k.name);
  } else {
    CheckAllPatternsAgainstHardware<Fp8::kE5M2, __NV_E5M2>(k.name);
  }
}

template <Fp8 K>
void CheckRnAgainstHost() {
  const std::vector<float> x = SampleInputs(size_t(1) << 22, 0x5EED0001);
  DeviceBuffer<float> dx;
  DeviceBuffer<uint32_t> dout;
  CUDA_CHECK(dx.Alloc(x.size()));
  CUDA_CHECK(dx.Upload(x));
  CUDA_CHECK(dout.Alloc(x.size()));
  CUDA_CHECK(dout.Poison());
  RnKernel<K><<<Blocks(x.size()), kThreads>>>(dx.get(), x.size(), dout.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint32_t> dev32;
  CUDA_CHECK(dout.Download(&dev32));
  std::vector<uint64_t> host(x.size()), dev(dev32.begin(), dev32.end());
  for (size_t i = 0; i < x.size(); ++i) host[i] = num::fp8_from_float_rn<K>(x[i]);
  ExpectSameWords(host, dev, kExact, [&](size_t i) { return "x " + Hex(num::bits_of(x[i])); });
}

// The device result equals the host's too (the exhaustive test compares device with device).
TEST_P(CudaDeviceKinds, RnEqualsHost) {
  if (GetParam().kind == Fp8::kE4M3) {
    CheckRnAgainstHost<Fp8::kE4M3>();
  } else {
    CheckRnAgainstHost<Fp8::kE5M2>();
  }
}

// ---- Decode -------------------------------------------------------------------------------

template <Fp8 K>
void CheckDecodeAll256() {
  DeviceBuffer<uint64_t> dout;
  CUDA_CHECK(dout.Alloc(256));
  CUDA_CHECK(dout.Poison());
  DecodeKernel<K><<<1, 256>>>(dout.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> dev, host(256);
  CUDA_CHECK(dout.Download(&dev));
  for (int c = 0; c < 256; ++c) host[c] = num::bits_of(num::fp8_to_float<K>(uint8_t(c)));
  // Bit for bit, NaN codes included: both sides build the canonical NaN from bits.
  for (int c = 0; c < 256; ++c) {
    if (IsNanBits(host[c])) EXPECT_TRUE(IsNanBits(dev[c])) << "code " << c << " is NaN on host";
  }
  ExpectSameWords(host, dev, kExact, [](size_t i) { return "code " + Hex(i); });
}

TEST_P(CudaDeviceKinds, DecodeAll256CodesEqualsHost) {
  if (GetParam().kind == Fp8::kE4M3) {
    CheckDecodeAll256<Fp8::kE4M3>();
  } else {
    CheckDecodeAll256<Fp8::kE5M2>();
  }
}

// ---- Stochastic rounding ------------------------------------------------------------------

template <Fp8 K>
void CheckSrAgainstHost() {
  const size_t n = size_t(1) << 22;
  const std::vector<float> x = SampleInputs(n, 0x5EED0002);
  std::vector<uint32_t> r(n);
  std::mt19937 rng(0x5EED0003);
  for (size_t i = 0; i < n; ++i) {
    r[i] = i % 97 == 0 ? 0u : i % 89 == 0 ? 0xFFFFFFFFu : uint32_t(rng());
  }
  DeviceBuffer<float> dx;
  DeviceBuffer<uint32_t> dr;
  DeviceBuffer<uint64_t> dout;
  CUDA_CHECK(dx.Alloc(n));
  CUDA_CHECK(dx.Upload(x));
  CUDA_CHECK(dr.Alloc(n));
  CUDA_CHECK(dr.Upload(r));
  CUDA_CHECK(dout.Alloc(n));

  // fp8_from_float_sr(x, r) with given words.
  CUDA_CHECK(dout.Poison());
  SrKernel<K><<<Blocks(n), kThreads>>>(dx.get(), dr.get(), n, dout.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> dev, host(n);
  CUDA_CHECK(dout.Download(&dev));
  for (size_t i = 0; i < n; ++i) host[i] = num::fp8_from_float_sr<K>(x[i], r[i]);
  ExpectSameWords(host, dev, kExact,
                  [&](size_t i) { return "x " + Hex(num::bits_of(x[i])) + " r " + Hex(r[i]); });

  // The encoder's chain, with indices whose Philox counter crosses 2^32 (index 2^34).
  const uint64_t seed = 0x0123456789ABCDEFull, first = (uint64_t(1) << 34) - n / 2;
  const uint32_t tensor = 7;
  CUDA_CHECK(dout.Poison());
  SrEncodeKernel<K><<<Blocks(n), kThreads>>>(dx.get(), n, first, seed, tensor, dout.get());
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(dout.Download(&dev));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t index = first + i;
    host[i] =
        num::fp8_from_float_sr<K>(x[i], num::sr_uniforms(seed, tensor, index >> 2).v[index & 3]);
  }
  ExpectSameWords(host, dev, kExact, [&](size_t i) {
    return "index " + Hex(first + i) + " x " + Hex(num::bits_of(x[i]));
  });
}

TEST_P(CudaDeviceKinds, StochasticRoundingEqualsHost) {
  if (GetParam().kind == Fp8::kE4M3) {
    CheckSrAgainstHost<Fp8::kE4M3>();
  } else {
    CheckSrAgainstHost<Fp8::kE5M2>();
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaDeviceKinds,
                         ::testing::Values(Kind{Fp8::kE4M3, __NV_E4M3, "E4M3"},
                                           Kind{Fp8::kE5M2, __NV_E5M2, "E5M2"}),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param.name);
                         });

TEST_F(CudaDevice, PhiloxUniformsEqualHost) {
  const size_t n = size_t(1) << 20;
  std::vector<uint64_t> j(n);
  std::mt19937_64 rng(0x5EED0004);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0:
        j[i] = i;  // small counters
        break;
      case 1:
        j[i] = (uint64_t(1) << 32) - 2048 + i / 4 % 4096;  // low word wrapping
        break;
      case 2:
        j[i] = ~uint64_t(0) - i / 4;  // largest counters
        break;
      default:
        j[i] = rng();
        break;
    }
  }
  DeviceBuffer<uint64_t> dj, dout;
  CUDA_CHECK(dj.Alloc(n));
  CUDA_CHECK(dj.Upload(j));
  CUDA_CHECK(dout.Alloc(4 * n));
  const struct {
    uint64_t seed;
    uint32_t tensor;
  } keys[] = {{0, 0}, {42, 0}, {0x9E3779B97F4A7C15ull, 12345}, {~0ull, ~0u}};
  for (const auto& key : keys) {
    CUDA_CHECK(dout.Poison());
    UniformsKernel<<<Blocks(n), kThreads>>>(key.seed, key.tensor, dj.get(), n, dout.get());
    CUDA_CHECK_LAUNCH();
    std::vector<uint64_t> dev, host(4 * n);
    CUDA_CHECK(dout.Download(&dev));
    for (size_t i = 0; i < n; ++i) {
      const num::U32x4 u = num::sr_uniforms(key.seed, key.tensor, j[i]);
      for (int k = 0; k < 4; ++k) host[4 * i + k] = u.v[k];
    }
    ExpectSameWords(host, dev, kExact, [&](size_t i) {
      return "seed " + Hex(key.seed) + " tensor " + Hex(key.tensor) + " j " + Hex(j[i / 4]) +
             " word " + std::to_string(i % 4);
    });
  }
}

// ---- Scales -------------------------------------------------------------------------------

TEST_F(CudaDevice, ScalesEqualHost) {
  const std::vector<float> amax = SampleAmax(size_t(1) << 20, 0x5EED0005);
  const size_t n = amax.size();
  DeviceBuffer<float> da;
  DeviceBuffer<uint64_t> dout;
  CUDA_CHECK(da.Alloc(n));
  CUDA_CHECK(da.Upload(amax));
  CUDA_CHECK(dout.Alloc(kScaleWords * n));
  CUDA_CHECK(dout.Poison());
  ScaleKernel<<<Blocks(n), kThreads>>>(da.get(), n, dout.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> dev, host(kScaleWords * n);
  CUDA_CHECK(dout.Download(&dev));
  for (size_t i = 0; i < n; ++i) {
    const float a = amax[i];
    uint64_t* o = host.data() + kScaleWords * i;
    o[0] = num::scale_e8m0(a, Fp8::kE4M3);
    o[1] = num::scale_e8m0(a, Fp8::kE5M2);
    o[2] = num::bits_of(num::scale_f32(a, Fp8::kE4M3));
    o[3] = num::bits_of(num::scale_f32(a, Fp8::kE5M2));
    o[4] = a > 0.0f && num::bits_of(a) < 0x7F800000u ? uint32_t(num::floor_log2(a)) : 0u;
  }
  static const char* const kWhat[kScaleWords] = {"scale_e8m0 E4M3", "scale_e8m0 E5M2",
                                                 "scale_f32 E4M3", "scale_f32 E5M2", "floor_log2"};
  // A NaN amax divides to a NaN whose payload may differ between CPU and GPU; only the
  // scale_f32 words may differ that way.
  const auto f32_word = [](size_t i) { return i % kScaleWords == 2 || i % kScaleWords == 3; };
  ExpectSameWords(host, dev, f32_word, [&](size_t i) {
    return std::string(kWhat[i % kScaleWords]) + " of amax " +
           Hex(num::bits_of(amax[i / kScaleWords]));
  });

  DeviceBuffer<uint64_t> de;
  CUDA_CHECK(de.Alloc(2 * 256));
  CUDA_CHECK(de.Poison());
  E8m0Kernel<<<1, 256>>>(de.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> edev, ehost(2 * 256);
  CUDA_CHECK(de.Download(&edev));
  for (int b = 0; b < 256; ++b) {
    ehost[2 * b] = num::bits_of(num::e8m0_to_float(uint8_t(b)));
    ehost[2 * b + 1] = num::bits_of(num::e8m0_reciprocal(uint8_t(b)));
  }
  ExpectSameWords(ehost, edev, kExact, [](size_t i) {
    return std::string(i % 2 ? "e8m0_reciprocal" : "e8m0_to_float") + " of " + Hex(i / 2);
  });
}

// ---- 16-bit floats ------------------------------------------------------------------------

TEST_F(CudaDevice, Float16ConversionsEqualHost) {
  const std::vector<float> x = SampleInputs(size_t(1) << 22, 0x5EED0006);
  const size_t n = x.size();
  DeviceBuffer<float> dx;
  DeviceBuffer<uint64_t> dout;
  CUDA_CHECK(dx.Alloc(n));
  CUDA_CHECK(dx.Upload(x));
  CUDA_CHECK(dout.Alloc(n));
  CUDA_CHECK(dout.Poison());
  Narrow16Kernel<<<Blocks(n), kThreads>>>(dx.get(), n, dout.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> dev, host(n);
  CUDA_CHECK(dout.Download(&dev));
  for (size_t i = 0; i < n; ++i) {
    host[i] = uint64_t(num::bf16_from_float(x[i])) | (uint64_t(num::f16_from_float(x[i])) << 16);
  }
  ExpectSameWords(host, dev, kExact,
                  [&](size_t i) { return "bf16|f16 << 16 of x " + Hex(num::bits_of(x[i])); });

  DeviceBuffer<uint64_t> dw;
  CUDA_CHECK(dw.Alloc(2 * 65536));
  CUDA_CHECK(dw.Poison());
  Widen16Kernel<<<65536 / kThreads, kThreads>>>(dw.get());
  CUDA_CHECK_LAUNCH();
  std::vector<uint64_t> wdev, whost(2 * 65536);
  CUDA_CHECK(dw.Download(&wdev));
  for (uint32_t h = 0; h < 65536; ++h) {
    whost[2 * h] = num::bits_of(num::bf16_to_float(uint16_t(h)));
    whost[2 * h + 1] = num::bits_of(num::f16_to_float(uint16_t(h)));
  }
  ExpectSameWords(whost, wdev, kExact, [](size_t i) {
    return std::string(i % 2 ? "f16_to_float" : "bf16_to_float") + " of " + Hex(i / 2);
  });
}

}  // namespace
