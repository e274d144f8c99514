// GPU codec throughput against a device-to-device copy on the same device in the same run.
//
// Effective bandwidth = (bytes read + bytes written) / time, for the copy as for the codec:
// encode and decode are single streaming passes, so a copy of their own traffic is their
// physical limit and the ratio says how close they come. 1 GiB of fp32 input (GIFT_BENCH_BYTES
// overrides), E4M3, blocks of 128, fp32 scales, round to nearest; fp32 and bf16 input and
// output, and stochastic rounding of fp32. Also the whitener and its inverse at 1280 x 3456, r = 32
// against the encode of the same tensor. Each figure is the median of several timed runs after a
// warm-up.
//
//   bench_cuda [--json]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "coords/whitener.h"
#include "gift/gift.h"
#include "gift/gift_cuda.h"
#include "kernels/whitener.h"
#include "numerics/elementwise.h"

namespace {

constexpr int kReps = 15;

#define CHECK_CUDA(call)                                                           \
  do {                                                                             \
    const cudaError_t e_ = (call);                                                 \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "bench_cuda: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

#define CHECK_GIFT(call)                                                              \
  do {                                                                                \
    if ((call) != GIFT_OK) {                                                          \
      std::fprintf(stderr, "bench_cuda: %s: %s\n", #call, giftGetLastErrorMessage()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// Median seconds of f() on the default stream, timed with events.
template <typename F>
double median_seconds(F&& f) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  f();  // warm-up
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < kReps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    f();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string name;
  double seconds, bytes;  // traffic: bytes read + written
};

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  if (giftCudaDeviceCount() == 0) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const char* env = std::getenv("GIFT_BENCH_BYTES");
  const uint32_t wr = 1280, wc = 3456, rank = 32;  // the whitener's layer
  const uint64_t n = std::max<uint64_t>(
      uint64_t(wr) * wc, (env ? std::strtoull(env, nullptr, 10) : (uint64_t(1) << 30)) / 4);
  giftQuantParams p;
  giftQuantParamsInit(&p);
  uint64_t sb = 0, ws_bytes = 0;
  CHECK_GIFT(giftScaleBytes(&p, 1, n, &sb));
  CHECK_GIFT(giftEncodeDeviceWorkspaceSize(&p, 1, n, &ws_bytes));

  std::vector<float> host(n);
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (float& x : host) x = nd(gen) * 1e-3f;
  std::vector<uint16_t> host_bf16(n);
  for (uint64_t i = 0; i < n; ++i) host_bf16[i] = gift::num::bf16_from_float(host[i]);

  float *src = nullptr, *dst = nullptr;
  uint16_t* src_bf16 = nullptr;
  uint8_t *codes = nullptr, *scales = nullptr;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&src, n * 4));
  CHECK_CUDA(cudaMalloc(&dst, n * 4));
  CHECK_CUDA(cudaMalloc(&src_bf16, n * 2));
  CHECK_CUDA(cudaMalloc(&codes, n));
  CHECK_CUDA(cudaMalloc(&scales, sb));
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  CHECK_CUDA(cudaMemcpy(src, host.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(src_bf16, host_bf16.data(), n * 2, cudaMemcpyHostToDevice));

  std::vector<Row> rows;
  const double f32 = 4.0 * n, bf16 = 2.0 * n, fp8 = double(n) + double(sb);
  rows.push_back({"copy d2d (fp32 buffer)", median_seconds([&] {
                    CHECK_CUDA(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice));
                  }),
                  2 * f32});
  auto encode = [&](const giftQuantParams& q, const void* in, giftDType_t dt) {
    return median_seconds([&] {
      CHECK_GIFT(giftEncodeDevice(&q, in, dt, 1, n, codes, scales, sb, nullptr, ws, ws_bytes, 0));
    });
  };
  giftQuantParams sr = p;
  sr.rounding = GIFT_ROUND_STOCHASTIC;
  auto decode = [&](giftDType_t dt) {
    return median_seconds(
        [&] { CHECK_GIFT(giftDecodeDevice(&p, codes, scales, sb, 1, n, dst, dt, 0)); });
  };
  rows.push_back({"encode fp32 -> e4m3 block:128", encode(p, src, GIFT_DTYPE_F32), f32 + fp8});
  rows.push_back({"decode e4m3 block:128 -> fp32", decode(GIFT_DTYPE_F32), fp8 + f32});
  rows.push_back(
      {"encode bf16 -> e4m3 block:128", encode(p, src_bf16, GIFT_DTYPE_BF16), bf16 + fp8});
  rows.push_back({"encode fp32 -> e4m3 stochastic", encode(sr, src, GIFT_DTYPE_F32), f32 + fp8});
  rows.push_back({"decode e4m3 block:128 -> bf16", decode(GIFT_DTYPE_BF16), fp8 + bf16});

  // The whitener of one transformed layer against the encode of the same tensor.
  gift::coords::Whitener t;
  {
    std::vector<double> u(uint64_t(wc) * rank, 0.0), l(rank), diag(wc, 0.05);
    for (uint32_t j = 0; j < rank; ++j) {
      u[uint64_t(j) * rank + j] = 1.0;  // orthonormal columns: unit vectors
      l[j] = 10.0 / (j + 1);
    }
    CHECK_GIFT(gift::coords::make_whitener(u, l, diag, wc, &t));
  }
  gift::kernels::DeviceWhitener dt;
  CHECK_GIFT(dt.upload(t));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  CHECK_GIFT(gift::kernels::set_math_mode(h, false));
  const double whiten = median_seconds([&] {
    CHECK_GIFT(dt.whiten(src, wr, h));
    CHECK_GIFT(dt.unwhiten(src, wr, h));
  });
  uint64_t lsb = 0;
  CHECK_GIFT(giftScaleBytes(&p, wr, wc, &lsb));
  const double layer_encode = median_seconds([&] {
    CHECK_GIFT(giftEncodeDevice(&p, src, GIFT_DTYPE_F32, wr, wc, codes, scales, lsb, nullptr, ws,
                                ws_bytes, 0));
  });
  cublasDestroy(h);

  const double copy_bw = rows[0].bytes / rows[0].seconds;
  if (json) {
    std::printf("{\"device\": \"%s\", \"bytes\": %llu, \"rows\": [", prop.name,
                (unsigned long long)(n * 4));
    for (size_t i = 0; i < rows.size(); ++i) {
      const double bw = rows[i].bytes / rows[i].seconds;
      std::printf("%s{\"name\": \"%s\", \"ms\": %.4f, \"gb_per_s\": %.1f, \"ratio_to_copy\": %.3f}",
                  i ? ", " : "", rows[i].name.c_str(), rows[i].seconds * 1e3, bw / 1e9,
                  bw / copy_bw);
    }
    std::printf("], \"whitener_1280x3456_r32_ms\": %.4f, \"encode_1280x3456_ms\": %.4f}\n",
                whiten * 1e3, layer_encode * 1e3);
    return 0;
  }
  std::printf("%s, %d SMs; %llu MiB fp32 input; median of %d runs\n", prop.name,
              prop.multiProcessorCount, (unsigned long long)(n * 4 >> 20), kReps);
  std::printf("%-34s %10s %12s %10s\n", "what", "ms", "GB/s (r+w)", "vs copy");
  for (const Row& r : rows) {
    const double bw = r.bytes / r.seconds;
    std::printf("%-34s %10.3f %12.1f %10.3f\n", r.name.c_str(), r.seconds * 1e3, bw / 1e9,
                bw / copy_bw);
  }
  std::printf(
      "whitener + inverse 1280x3456 r=32: %.3f ms; encode of that tensor: %.3f ms (%.2fx)\n",
      whiten * 1e3, layer_encode * 1e3, whiten / layer_encode);
  return 0;
}
