#include "device.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "common.h"

#ifdef GIFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gift/gift_cuda.h"
#endif

namespace giftc {

#ifdef GIFT_HAVE_CUDA
namespace {

void must(cudaError_t e, const char* what);

using DevicePtr = std::unique_ptr<void, cudaError_t (*)(void*)>;

// `bytes` of device memory, freed on every path.
DevicePtr device_alloc(uint64_t bytes) {
  void* p = nullptr;
  must(cudaMalloc(&p, std::max<uint64_t>(bytes, 1)), "cudaMalloc");
  return DevicePtr(p, cudaFree);
}

// Throws the failure of a CUDA call made by the benchmark (exit status 3).
void must(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Failure(kIoError, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
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

void use_device(giftFrameWriter* w, Device d) {
#ifdef GIFT_HAVE_CUDA
  check(giftFrameWriterUseCuda(w, d == Device::kCuda));
#else
  (void)w, (void)d;
#endif
}

void use_device(giftFrame* f, Device d) {
#ifdef GIFT_HAVE_CUDA
  check(giftFrameUseCuda(f, d == Device::kCuda));
#else
  (void)f, (void)d;
#endif
}

DeviceTimes time_on_device(const giftQuantParams& p, giftDType_t dtype, uint64_t rows,
                           uint64_t cols) {
#ifdef GIFT_HAVE_CUDA
  const uint64_t n = rows * cols;
  uint64_t sb = 0, wsb = 0;
  check(giftScaleBytes(&p, rows, cols, &sb));
  check(giftEncodeDeviceWorkspaceSize(&p, rows, cols, &wsb));
  std::vector<float> values(n);
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (float& x : values) x = nd(gen) * 1e-3f;
  std::vector<uint8_t> host(n * giftDTypeSize(dtype));
  check(giftConvert(values.data(), GIFT_DTYPE_F32, host.data(), dtype, n));
  const DevicePtr src = device_alloc(host.size()),
                  dst = device_alloc(std::max<uint64_t>(host.size(), n * 4)),
                  codes = device_alloc(n), scales = device_alloc(sb), ws = device_alloc(wsb);
  must(cudaMemcpy(src.get(), host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaDeviceProp prop{};
  must(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  DeviceTimes t;
  t.device = prop.name;
  t.copy = best_device_seconds([&] {
    must(cudaMemcpyAsync(dst.get(), src.get(), host.size(), cudaMemcpyDeviceToDevice),
         "cudaMemcpyAsync");
  });
  t.encode = best_device_seconds([&] {
    check(giftEncodeDevice(&p, src.get(), dtype, rows, cols, static_cast<uint8_t*>(codes.get()),
                           scales.get(), sb, nullptr, ws.get(), wsb, nullptr));
  });
  t.decode = best_device_seconds([&] {
    check(giftDecodeDevice(&p, static_cast<uint8_t*>(codes.get()), scales.get(), sb, rows, cols,
                           dst.get(), GIFT_DTYPE_F32, nullptr));
  });
  return t;
#else
  (void)p, (void)dtype, (void)rows, (void)cols;
  throw Failure(kUsage, "--device cuda: this giftc was built without CUDA");
#endif
}

}  // namespace giftc
