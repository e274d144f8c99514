#include "device.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "common.h"
#include "common/error.h"
#include "numerics/codec.h"
#include "numerics/elementwise.h"

#ifdef GIFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gift/gift_cuda.h"
#endif

namespace giftc {

#ifdef GIFT_HAVE_CUDA
namespace {

giftResult_t cuda_failed(cudaError_t e, const char* what) {
  return gift::fail(GIFT_ERROR_DEVICE, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

// One device allocation, freed on every path.
struct DeviceMemory {
  void* p = nullptr;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { cudaFree(p); }
  giftResult_t alloc(uint64_t bytes) {
    const cudaError_t e = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
    return e == cudaSuccess ? GIFT_OK : cuda_failed(e, "cudaMalloc");
  }
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(p);
  }
};

giftResult_t copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return GIFT_OK;
  const cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  return e == cudaSuccess ? GIFT_OK : cuda_failed(e, "cudaMemcpy");
}

size_t width(giftDType_t d) { return d == GIFT_DTYPE_F32 ? 4 : 2; }

giftResult_t cuda_encode(const giftQuantParams* p, const void* src, giftDType_t dtype,
                         uint64_t rows, uint64_t cols, uint8_t* codes, void* scales,
                         uint64_t scales_bytes, giftEncodeStats* stats) {
  if (const giftResult_t r =
          gift::check_codec_buffers(p, src, dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  const uint64_t n = rows * cols;
  DeviceMemory d_src, d_codes, d_scales, d_stats;
  for (auto [m, bytes] : {std::pair{&d_src, n * width(dtype)}, std::pair{&d_codes, n},
                          std::pair{&d_scales, scales_bytes},
                          std::pair{&d_stats, uint64_t(sizeof(giftEncodeStats))}}) {
    if (const giftResult_t r = m->alloc(bytes)) return r;
  }
  if (const giftResult_t r = copy(d_src.p, src, n * width(dtype), cudaMemcpyHostToDevice)) return r;
  if (const giftResult_t r =
          giftEncodeDevice(p, d_src.p, dtype, rows, cols, d_codes.get(), d_scales.p, scales_bytes,
                           d_stats.get<giftEncodeStats>(), nullptr, 0, nullptr))
    return r;
  giftEncodeStats seen;
  for (const auto& [to, from, bytes] :
       {std::tuple<void*, const void*, uint64_t>{codes, d_codes.p, n},
        std::tuple<void*, const void*, uint64_t>{scales, d_scales.p, scales_bytes},
        std::tuple<void*, const void*, uint64_t>{&seen, d_stats.p, sizeof seen}}) {
    if (const giftResult_t r = copy(to, from, bytes, cudaMemcpyDeviceToHost)) return r;
  }
  if (stats) *stats = seen;
  return gift::nonfinite_result(*p, seen, cols);
}

giftResult_t cuda_decode(const giftQuantParams* p, const uint8_t* codes, const void* scales,
                         uint64_t scales_bytes, uint64_t rows, uint64_t cols, void* dst,
                         giftDType_t dtype) {
  if (const giftResult_t r =
          gift::check_codec_buffers(p, dst, dtype, rows, cols, codes, scales, scales_bytes))
    return r;
  const uint64_t n = rows * cols;
  DeviceMemory d_codes, d_scales, d_dst;
  if (const giftResult_t r = d_codes.alloc(n)) return r;
  if (const giftResult_t r = d_scales.alloc(scales_bytes)) return r;
  if (const giftResult_t r = d_dst.alloc(n * width(dtype))) return r;
  if (const giftResult_t r = copy(d_codes.p, codes, n, cudaMemcpyHostToDevice)) return r;
  if (const giftResult_t r = copy(d_scales.p, scales, scales_bytes, cudaMemcpyHostToDevice))
    return r;
  if (const giftResult_t r = giftDecodeDevice(p, d_codes.get(), d_scales.p, scales_bytes, rows,
                                              cols, d_dst.p, dtype, nullptr))
    return r;
  return copy(dst, d_dst.p, n * width(dtype), cudaMemcpyDeviceToHost);
}

// Throws the failure of a CUDA call made by the benchmark (exit status 3).
void must(cudaError_t e, const char* what) {
  if (e != cudaSuccess) check(cuda_failed(e, what));
}

// Best of several timed runs of f on the default stream, after a warm-up.
template <typename F>
double best_device_seconds(F&& f) {
  cudaEvent_t a = nullptr, b = nullptr;
  must(cudaEventCreate(&a), "cudaEventCreate");
  must(cudaEventCreate(&b), "cudaEventCreate");
  f();
  double best = 1e30;
  for (int i = 0; i < 10; ++i) {
    must(cudaEventRecord(a), "cudaEventRecord");
    f();
    must(cudaEventRecord(b), "cudaEventRecord");
    must(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    must(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    best = std::min(best, double(ms) * 1e-3);
  }
  must(cudaEventDestroy(a), "cudaEventDestroy");
  must(cudaEventDestroy(b), "cudaEventDestroy");
  return best;
}

}  // namespace
#endif

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::kCpu;
  if (s != "cuda") throw Failure(kUsage, "--device: '" + s + "' is not cpu or cuda");
#ifdef GIFT_HAVE_CUDA
  if (giftCudaDeviceCount() == 0) throw Failure(kIoError, "--device cuda: no usable CUDA device");
  return Device::kCuda;
#else
  throw Failure(kUsage, "--device cuda: this giftc was built without CUDA");
#endif
}

decltype(&giftEncode) encoder_for(Device d) {
#ifdef GIFT_HAVE_CUDA
  if (d == Device::kCuda) return &cuda_encode;
#endif
  (void)d;
  return &giftEncode;
}

decltype(&giftDecode) decoder_for(Device d) {
#ifdef GIFT_HAVE_CUDA
  if (d == Device::kCuda) return &cuda_decode;
#endif
  (void)d;
  return &giftDecode;
}

DeviceTimes time_on_device(const giftQuantParams& p, giftDType_t dtype, uint64_t rows,
                           uint64_t cols) {
#ifdef GIFT_HAVE_CUDA
  const uint64_t n = rows * cols;
  uint64_t sb = 0, wsb = 0;
  check(giftScaleBytes(&p, rows, cols, &sb));
  check(giftEncodeDeviceWorkspaceSize(&p, rows, cols, &wsb));
  std::vector<uint8_t> host(n * width(dtype));
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (uint64_t i = 0; i < n; ++i) {
    const float x = nd(gen) * 1e-3f;
    if (dtype == GIFT_DTYPE_F32) {
      std::memcpy(&host[4 * i], &x, 4);
    } else {
      const uint16_t h =
          dtype == GIFT_DTYPE_BF16 ? gift::num::bf16_from_float(x) : gift::num::f16_from_float(x);
      std::memcpy(&host[2 * i], &h, 2);
    }
  }
  DeviceMemory src, dst, codes, scales, ws;
  check(src.alloc(host.size()));
  check(dst.alloc(std::max<uint64_t>(host.size(), n * 4)));
  check(codes.alloc(n));
  check(scales.alloc(sb));
  check(ws.alloc(wsb));
  check(copy(src.p, host.data(), host.size(), cudaMemcpyHostToDevice));
  cudaDeviceProp prop{};
  must(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  DeviceTimes t;
  t.device = prop.name;
  t.copy = best_device_seconds([&] {
    must(cudaMemcpyAsync(dst.p, src.p, host.size(), cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  });
  t.encode = best_device_seconds([&] {
    check(giftEncodeDevice(&p, src.p, dtype, rows, cols, codes.get(), scales.p, sb, nullptr, ws.p,
                           wsb, nullptr));
  });
  t.decode = best_device_seconds([&] {
    check(giftDecodeDevice(&p, codes.get(), scales.p, sb, rows, cols, dst.p, GIFT_DTYPE_F32,
                           nullptr));
  });
  return t;
#else
  (void)p, (void)dtype, (void)rows, (void)cols;
  throw Failure(kUsage, "--device cuda: this giftc was built without CUDA");
#endif
}

}  // namespace giftc
