// The device API (gift_cuda.h) against the CPU path: the same codes, scales and statistics
// byte for byte for every layout, FP8 kind, scale type, rounding mode and input type, on
// shapes that are not multiples of the block, the tile or the 16-element vector run, and on
// misaligned pointers; decoding exact; the whitener within fp32 tolerance of the CPU's.
//
// Every device output is poisoned (0xAA) before each call, with guard bytes after it, so an
// element the kernels did not write, or a byte written past the end, fails the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "coords/fit.h"
#include "coords/whitener.h"
#include "cuda/device_test_util.h"
#include "gift/gift.h"
#include "gift/gift_cuda.h"
#include "kernels/whitener.h"
#include "numerics/elementwise.h"

namespace {

using namespace gift::testing;
namespace num = gift::num;

constexpr size_t kGuard = 64;

struct Shape {
  uint64_t rows, cols;
};

const Shape kShapes[] = {{1, 1},     {1, 15},   {3, 17},    {7, 128},   {5, 129}, {33, 1000},
                         {64, 4096}, {2, 5000}, {130, 257}, {1, 70001}, {0, 10},  {10, 0}};

giftQuantParams layout(giftScaleLayout_t l, uint32_t a = 0, uint32_t b = 0) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.layout = l;
  if (l == GIFT_SCALE_BLOCK) p.block = a;
  if (l == GIFT_SCALE_TILE) {
    p.tile_rows = a;
    p.tile_cols = b;
  }
  return p;
}

const giftQuantParams kLayouts[] = {
    layout(GIFT_SCALE_TENSOR),        layout(GIFT_SCALE_ROW),
    layout(GIFT_SCALE_BLOCK, 16),     layout(GIFT_SCALE_BLOCK, 128),
    layout(GIFT_SCALE_BLOCK, 1024),   layout(GIFT_SCALE_BLOCK, 4096),
    layout(GIFT_SCALE_TILE, 4, 64),   layout(GIFT_SCALE_TILE, 128, 128),
    layout(GIFT_SCALE_TILE, 3, 5),    layout(GIFT_SCALE_TILE, 1, 0x80000000u),
    layout(GIFT_SCALE_TILE, 300, 300)};

std::string describe(const giftQuantParams& p, giftDType_t dt, const Shape& s) {
  std::ostringstream o;
  o << s.rows << "x" << s.cols << " layout " << p.layout << " block " << p.block << " tile "
    << p.tile_rows << "x" << p.tile_cols << " kind " << p.kind << " scale " << p.scale_dtype
    << " rounding " << p.rounding << " dtype " << dt << " nonfinite " << p.nonfinite;
  return o.str();
}

size_t width(giftDType_t dt) { return dt == GIFT_DTYPE_F32 ? 4 : 2; }

// Values spanning FP8's range and beyond: normal gradients with rows of other magnitudes,
// all-zero rows (zero groups), huge values (saturation) and tiny ones (subnormal codes).
std::vector<uint8_t> make_input(const Shape& s, giftDType_t dt, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> n;
  const uint64_t count = s.rows * s.cols;
  std::vector<uint8_t> out(count * width(dt));
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t row = s.cols ? i / s.cols : 0;
    const float mag = row % 7 == 3 ? 0.0f : row % 7 == 5 ? 1e30f : row % 7 == 6 ? 1e-30f : 1e-2f;
    float x = n(gen) * mag;
    if (dt == GIFT_DTYPE_F16 && mag > 1.0f) x = n(gen) * 1e4f;  // finite in fp16 to 6.5 sigma
    if (dt == GIFT_DTYPE_F32) {
      std::memcpy(&out[4 * i], &x, 4);
    } else {
      const uint16_t h = dt == GIFT_DTYPE_BF16 ? num::bf16_from_float(x) : num::f16_from_float(x);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

void put(std::vector<uint8_t>* in, giftDType_t dt, uint64_t i, float x) {
  if (dt == GIFT_DTYPE_F32) {
    std::memcpy(&(*in)[4 * i], &x, 4);
  } else {
    const uint16_t h = dt == GIFT_DTYPE_BF16 ? num::bf16_from_float(x) : num::f16_from_float(x);
    std::memcpy(&(*in)[2 * i], &h, 2);
  }
}

// The first `offset` bytes of each device buffer are skipped, to test misaligned pointers.
struct Offsets {
  size_t src = 0, codes = 0;
};

// Encodes on the CPU and on the device and expects identical bytes.
void expect_same_encoding(const giftQuantParams& p, giftDType_t dt, const Shape& s,
                          const std::vector<uint8_t>& input, Offsets off = {}) {
  const std::string what = describe(p, dt, s);
  const uint64_t n = s.rows * s.cols;
  uint64_t sb = 0;
  ASSERT_EQ(giftScaleBytes(&p, s.rows, s.cols, &sb), GIFT_OK);
  std::vector<uint8_t> codes(n), scales(sb);
  giftEncodeStats stats{};
  const giftResult_t host = giftEncode(nullptr, &p, input.data(), dt, s.rows, s.cols, codes.data(),
                                       scales.data(), sb, &stats);
  ASSERT_TRUE(host == GIFT_OK || host == GIFT_ERROR_NONFINITE_INPUT) << what;

  DeviceBuffer<uint8_t> d_src, d_codes, d_scales, d_stats;
  CUDA_CHECK(d_src.Alloc(input.size() + off.src + kGuard));
  CUDA_CHECK(d_codes.Alloc(n + off.codes + kGuard));
  CUDA_CHECK(d_scales.Alloc(sb + kGuard));
  CUDA_CHECK(d_stats.Alloc(sizeof(giftEncodeStats)));
  for (auto* b : {&d_src, &d_codes, &d_scales, &d_stats}) CUDA_CHECK(b->Poison());
  CUDA_CHECK(cudaMemcpy(d_src.get() + off.src, input.data(), input.size(), cudaMemcpyHostToDevice));
  ASSERT_EQ(giftEncodeDevice(&p, d_src.get() + off.src, dt, s.rows, s.cols,
                             d_codes.get() + off.codes, d_scales.get(), sb,
                             reinterpret_cast<giftEncodeStats*>(d_stats.get()), nullptr, 0, 0),
            GIFT_OK)
      << what << ": " << giftGetLastErrorMessage();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> dc, ds, dstats;
  CUDA_CHECK(d_codes.Download(&dc));
  CUDA_CHECK(d_scales.Download(&ds));
  CUDA_CHECK(d_stats.Download(&dstats));
  for (size_t i = 0; i < off.codes; ++i) ASSERT_EQ(dc[i], kPoisonByte) << what << ": before codes";
  uint64_t bad = 0, first_bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (dc[off.codes + i] != codes[i] && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " codes differ, the first at " << first_bad
                     << " (host " << int(codes[first_bad]) << ", device "
                     << int(dc[off.codes + first_bad]) << ")";
  for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dc[off.codes + n + i], kPoisonByte) << what;
  EXPECT_TRUE(std::equal(scales.begin(), scales.end(), ds.begin())) << what << ": scales differ";
  for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(ds[sb + i], kPoisonByte) << what;
  giftEncodeStats dev{};
  std::memcpy(&dev, dstats.data(), sizeof dev);
  EXPECT_EQ(num::bits_of(dev.amax), num::bits_of(stats.amax)) << what;
  EXPECT_EQ(dev.nonfinite_count, stats.nonfinite_count) << what;
  EXPECT_EQ(dev.first_nonfinite, stats.first_nonfinite) << what;
}

using CudaCodec = WithCudaDevice<::testing::Test>;

TEST_F(CudaCodec, EncodeEqualsTheCpuOnEveryLayoutKindScaleRoundingAndType) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
      const std::vector<uint8_t> input = make_input(s, dt, seed++);
      for (giftQuantParams p : kLayouts) {
        for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
          for (const giftScaleDType_t sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
            for (const giftRounding_t rd : {GIFT_ROUND_NEAREST, GIFT_ROUND_STOCHASTIC}) {
              p.kind = kind;
              p.scale_dtype = sd;
              p.rounding = rd;
              p.seed = 0x1234567890ull + seed;
              p.tensor_index = seed;
              expect_same_encoding(p, dt, s, input);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaCodec, MisalignedPointersTakeTheScalarPathWithTheSameBytes) {
  const Shape s{33, 1000};
  for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
    const std::vector<uint8_t> input = make_input(s, dt, 77);
    for (const Offsets off : {Offsets{width(dt), 0}, Offsets{0, 1}, Offsets{width(dt), 3}}) {
      for (const giftQuantParams& p : {kLayouts[3], kLayouts[4], kLayouts[6]}) {
        expect_same_encoding(p, dt, s, input, off);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// More groups than the grid has threads, and more items (rows, tiles) than the two-pass
// kernels have resident blocks (an H200 holds about 132 x 8 of them): every kernel's
// grid-stride loop runs many times.
TEST_F(CudaCodec, LargeTensorsLoopOverTheGrid) {
  const Shape s{8192, 2048};
  for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16}) {
    const std::vector<uint8_t> input = make_input(s, dt, 11);
    for (const int i : {0, 1, 2, 3, 7, 8}) {
      expect_same_encoding(kLayouts[i], dt, s, input);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaCodec, NonFiniteInputsGiveTheCpusCodesAndStatistics) {
  const Shape s{9, 300};
  for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
    std::vector<uint8_t> input = make_input(s, dt, 5);
    put(&input, dt, 1000, NAN);
    put(&input, dt, 17, INFINITY);
    put(&input, dt, 2000, -INFINITY);
    for (giftQuantParams p : kLayouts) {
      for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
        for (const giftNonFinite_t nf : {GIFT_NONFINITE_ERROR, GIFT_NONFINITE_KEEP}) {
          for (const giftScaleDType_t sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
            for (const giftRounding_t rd : {GIFT_ROUND_NEAREST, GIFT_ROUND_STOCHASTIC}) {
              p.kind = kind;
              p.nonfinite = nf;
              p.scale_dtype = sd;
              p.rounding = rd;
              expect_same_encoding(p, dt, s, input);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaCodec, DecodeEqualsTheCpuForEveryOutputType) {
  std::mt19937 gen(3);
  for (const Shape& s : kShapes) {
    for (giftQuantParams p : kLayouts) {
      for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
        for (const giftScaleDType_t sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
          p.kind = kind;
          p.scale_dtype = sd;
          const uint64_t n = s.rows * s.cols;
          uint64_t sb = 0;
          ASSERT_EQ(giftScaleBytes(&p, s.rows, s.cols, &sb), GIFT_OK);
          // Every code, NaN and Inf codes included, under random scales (a NaN E8M0 scale too).
          std::vector<uint8_t> codes(n), scales(sb);
          for (uint8_t& c : codes) c = uint8_t(gen());
          if (sd == GIFT_SCALE_DTYPE_E8M0) {
            for (uint8_t& b : scales) b = uint8_t(gen());
          } else {
            std::lognormal_distribution<float> ln(-4.0f, 3.0f);
            for (uint64_t g = 0; g < sb / 4; ++g) {
              const float v = ln(gen);
              std::memcpy(&scales[4 * g], &v, 4);
            }
          }
          // Codes at an odd address and outputs one element in, on some shapes: scalar paths.
          const size_t shift = (s.rows + s.cols) % 2;
          DeviceBuffer<uint8_t> d_codes, d_scales;
          CUDA_CHECK(d_codes.Alloc(n + 1));
          CUDA_CHECK(d_scales.Alloc(sb + 1));
          CUDA_CHECK(cudaMemcpy(d_codes.get() + shift, codes.data(), n, cudaMemcpyHostToDevice));
          CUDA_CHECK(d_scales.Upload(scales));
          for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
            const std::string what = describe(p, dt, s);
            std::vector<uint8_t> host(n * width(dt));
            ASSERT_EQ(giftDecode(nullptr, &p, codes.data(), scales.data(), sb, s.rows, s.cols,
                                 host.data(), dt),
                      GIFT_OK);
            DeviceBuffer<uint8_t> d_out;
            const size_t out_shift = shift * width(dt);
            CUDA_CHECK(d_out.Alloc(out_shift + host.size() + kGuard));
            CUDA_CHECK(d_out.Poison());
            ASSERT_EQ(giftDecodeDevice(&p, d_codes.get() + shift, d_scales.get(), sb, s.rows,
                                       s.cols, d_out.get() + out_shift, dt, 0),
                      GIFT_OK)
                << what << ": " << giftGetLastErrorMessage();
            std::vector<uint8_t> dev;
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(d_out.Download(&dev));
            for (size_t i = 0; i < out_shift; ++i) ASSERT_EQ(dev[i], kPoisonByte) << what;
            EXPECT_TRUE(std::equal(host.begin(), host.end(), dev.begin() + out_shift)) << what;
            for (size_t i = 0; i < kGuard; ++i)
              ASSERT_EQ(dev[out_shift + host.size() + i], kPoisonByte) << what;
          }
        }
      }
    }
  }
}

TEST_F(CudaCodec, CallerWorkspaceStreamsAndArgumentErrors) {
  const Shape s{40, 300};
  giftQuantParams p = kLayouts[6];  // tiles: a workspace word per group
  const std::vector<uint8_t> input = make_input(s, GIFT_DTYPE_F32, 9);
  uint64_t ws_bytes = 0, sb = 0;
  ASSERT_EQ(giftEncodeDeviceWorkspaceSize(&p, s.rows, s.cols, &ws_bytes), GIFT_OK);
  ASSERT_EQ(giftScaleBytes(&p, s.rows, s.cols, &sb), GIFT_OK);
  EXPECT_GE(ws_bytes, sb);  // a word per group, as many as fp32 scales take
  DeviceBuffer<uint8_t> src, codes, scales, ws;
  CUDA_CHECK(src.Alloc(input.size()));
  CUDA_CHECK(codes.Alloc(s.rows * s.cols));
  CUDA_CHECK(scales.Alloc(sb));
  CUDA_CHECK(ws.Alloc(ws_bytes + 256));
  CUDA_CHECK(src.Upload(input));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EXPECT_EQ(giftEncodeDevice(&p, src.get(), GIFT_DTYPE_F32, s.rows, s.cols, codes.get(),
                             scales.get(), sb, nullptr, ws.get(), ws_bytes - 1, stream),
            GIFT_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(giftEncodeDevice(&p, src.get(), GIFT_DTYPE_F32, s.rows, s.cols, codes.get(),
                             scales.get(), sb, nullptr, ws.get() + 8, ws_bytes, stream),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftEncodeDevice(&p, src.get(), GIFT_DTYPE_F32, s.rows, s.cols, codes.get(),
                             scales.get(), sb - 1, nullptr, ws.get(), ws_bytes, stream),
            GIFT_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(giftEncodeDevice(&p, src.get() + 1, GIFT_DTYPE_F32, s.rows, s.cols, codes.get(),
                             scales.get(), sb, nullptr, ws.get(), ws_bytes, stream),
            GIFT_ERROR_INVALID_ARGUMENT);  // fp32 input at an odd address
  EXPECT_EQ(giftEncodeDevice(&p, src.get(), GIFT_DTYPE_F32, s.rows, s.cols, codes.get(),
                             scales.get() + 2, sb, nullptr, ws.get(), ws_bytes, stream),
            GIFT_ERROR_INVALID_ARGUMENT);  // fp32 scales off their alignment
  DeviceBuffer<giftEncodeStats> stats;
  CUDA_CHECK(stats.Alloc(2));
  EXPECT_EQ(giftEncodeDevice(
                &p, src.get(), GIFT_DTYPE_F32, s.rows, s.cols, codes.get(), scales.get(), sb,
                reinterpret_cast<giftEncodeStats*>(reinterpret_cast<uint8_t*>(stats.get()) + 4),
                ws.get(), ws_bytes, stream),
            GIFT_ERROR_INVALID_ARGUMENT);  // stats off their alignment
  // Twice with one workspace on one stream, the second time on values a thousand times
  // smaller: a census left over from the first call would keep its larger amaxes, and the
  // second call's scales, codes and statistics would differ from the CPU's.
  std::vector<uint8_t> small(input.size());
  for (size_t i = 0; i < input.size(); i += 4) {
    float x;
    std::memcpy(&x, &input[i], 4);
    x *= 1e-3f;
    std::memcpy(&small[i], &x, 4);
  }
  DeviceBuffer<uint8_t> src_small;
  CUDA_CHECK(src_small.Alloc(small.size()));
  CUDA_CHECK(src_small.Upload(small));
  CUDA_CHECK(stats.Poison());
  for (const uint8_t* in : {src.get(), src_small.get()}) {
    ASSERT_EQ(giftEncodeDevice(&p, in, GIFT_DTYPE_F32, s.rows, s.cols, codes.get(), scales.get(),
                               sb, stats.get(), ws.get(), ws_bytes, stream),
              GIFT_OK)
        << giftGetLastErrorMessage();
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::vector<uint8_t> host_codes(s.rows * s.cols), host_scales(sb), dev_codes, dev_scales;
  giftEncodeStats host_stats{};
  ASSERT_EQ(giftEncode(nullptr, &p, small.data(), GIFT_DTYPE_F32, s.rows, s.cols, host_codes.data(),
                       host_scales.data(), sb, &host_stats),
            GIFT_OK);
  CUDA_CHECK(codes.Download(&dev_codes));
  CUDA_CHECK(scales.Download(&dev_scales));
  std::vector<giftEncodeStats> dev_stats;
  CUDA_CHECK(stats.Download(&dev_stats));
  EXPECT_EQ(dev_codes, host_codes);
  EXPECT_EQ(dev_scales, host_scales);
  EXPECT_EQ(num::bits_of(dev_stats[0].amax), num::bits_of(host_stats.amax));
  EXPECT_EQ(dev_stats[0].nonfinite_count, 0u);
}

// ---- The whitener ---------------------------------------------------------------------------

gift::coords::Whitener random_whitener(uint32_t dim, uint32_t rank, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd;
  std::vector<double> u(uint64_t(dim) * rank), l(rank), diag(dim);
  for (double& x : u) x = nd(gen);
  for (uint32_t j = 0; j < rank; ++j) {  // Gram-Schmidt: orthonormal columns
    for (uint32_t k = 0; k < j; ++k) {
      double dot = 0;
      for (uint32_t i = 0; i < dim; ++i) dot += u[i * rank + j] * u[i * rank + k];
      for (uint32_t i = 0; i < dim; ++i) u[i * rank + j] -= dot * u[i * rank + k];
    }
    double norm = 0;
    for (uint32_t i = 0; i < dim; ++i) norm += u[i * rank + j] * u[i * rank + j];
    for (uint32_t i = 0; i < dim; ++i) u[i * rank + j] /= std::sqrt(norm);
    l[j] = 100.0 / (j + 1);
  }
  for (double& d : diag) d = 0.01 + std::fabs(nd(gen)) * 0.1;
  gift::coords::Whitener w;
  EXPECT_EQ(gift::coords::make_whitener(u, l, diag, dim, &w), GIFT_OK);
  return w;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST_F(CudaCodec, WhitenerAndInverseMatchTheCpuWithinFp32Tolerance) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(gift::kernels::set_math_mode(h, false), GIFT_OK);
  for (const Shape& s : {Shape{50, 96}, Shape{1, 300}, Shape{257, 130}}) {
    const uint32_t dim = uint32_t(s.cols), rank = 8;
    const gift::coords::Whitener t = random_whitener(dim, rank, dim);
    gift::kernels::DeviceWhitener dt;
    ASSERT_EQ(dt.upload(t), GIFT_OK) << giftGetLastErrorMessage();
    std::mt19937 gen(1);
    std::normal_distribution<float> n;
    std::vector<float> w(s.rows * s.cols);
    for (float& x : w) x = n(gen);
    std::vector<float> cpu = w, dev;
    gift::coords::whiten(t, cpu.data(), s.rows);
    DeviceBuffer<float> d;
    CUDA_CHECK(d.Alloc(w.size()));
    CUDA_CHECK(d.Upload(w));
    ASSERT_EQ(dt.whiten(d.get(), s.rows, h), GIFT_OK) << giftGetLastErrorMessage();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(d.Download(&dev));
    EXPECT_LT(rel_diff(cpu, dev), 1e-5) << s.rows << "x" << s.cols;
    ASSERT_EQ(dt.unwhiten(d.get(), s.rows, h), GIFT_OK) << giftGetLastErrorMessage();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(d.Download(&dev));
    EXPECT_LT(rel_diff(w, dev), 1e-5) << s.rows << "x" << s.cols;
  }
  cublasDestroy(h);
}

TEST_F(CudaCodec, SecondMomentMatchesTheCpu) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const uint64_t rows = 300;
  const uint32_t dim = 70;
  std::mt19937 gen(4);
  std::normal_distribution<float> n;
  std::vector<float> w(rows * dim);
  for (float& x : w) x = n(gen);
  const std::vector<double> cpu =
      gift::coords::gradient_second_moment(w.data(), GIFT_DTYPE_F32, rows, dim);
  DeviceBuffer<float> dw, da;
  CUDA_CHECK(dw.Alloc(w.size()));
  CUDA_CHECK(dw.Upload(w));
  CUDA_CHECK(da.Alloc(uint64_t(dim) * dim));
  // NaN everywhere: with decay 0 (beta 0) cuBLAS must not read it.
  CUDA_CHECK(cudaMemset(da.get(), 0xFF, uint64_t(dim) * dim * sizeof(float)));
  ASSERT_EQ(gift::kernels::accumulate_second_moment(dw.get(), rows, dim, 0.0f, da.get(), h),
            GIFT_OK);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> dev;
  CUDA_CHECK(da.Download(&dev));
  std::vector<float> ref(cpu.begin(), cpu.end());
  EXPECT_LT(rel_diff(ref, dev), 1e-5);
  cublasDestroy(h);
}

}  // namespace
