// Shared by the CUDA device tests: checked CUDA calls, owned and poisoned device buffers, and
// the fixture that skips without a device (or fails, with GIFT_REQUIRE_CUDA_DEVICE set).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace gift::testing {

// Fails the current test (and returns from the enclosing void function) when a CUDA call does
// not return cudaSuccess.
#define CUDA_CHECK(call)                                                     \
  do {                                                                       \
    const cudaError_t cuda_check_err_ = (call);                              \
    ASSERT_EQ(cuda_check_err_, cudaSuccess)                                  \
        << #call << " failed: " << cudaGetErrorName(cuda_check_err_) << ": " \
        << cudaGetErrorString(cuda_check_err_);                              \
  } while (0)

// After every kernel launch: the launch error, then the execution error.
#define CUDA_CHECK_LAUNCH()              \
  do {                                   \
    CUDA_CHECK(cudaGetLastError());      \
    CUDA_CHECK(cudaDeviceSynchronize()); \
  } while (0)

constexpr unsigned kThreads = 256;
constexpr uint8_t kPoisonByte = 0xAA;

// Blocks for a grid-stride loop over n elements.
inline unsigned Blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 8192));
}

// Owns one device allocation; freed on every exit path, ASSERT returns included.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  cudaError_t Alloc(size_t n) {
    n_ = n;
    return cudaMalloc(&p_, n * sizeof(T));
  }
  cudaError_t Poison() { return cudaMemset(p_, kPoisonByte, n_ * sizeof(T)); }
  cudaError_t Upload(const std::vector<T>& h) {
    return cudaMemcpy(p_, h.data(), std::min(h.size(), n_) * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* h) const {
    h->resize(n_);
    return cudaMemcpy(h->data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Skips the test without a usable CUDA device, or fails it when GIFT_REQUIRE_CUDA_DEVICE is
// set to anything but 0.
template <class Base>
class WithCudaDevice : public Base {
 protected:
  void SetUp() override {
    const char* req = std::getenv("GIFT_REQUIRE_CUDA_DEVICE");
    const bool required = req && *req && std::strcmp(req, "0") != 0;
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      const std::string why = err != cudaSuccess
                                  ? std::string("cudaGetDeviceCount failed: ") +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err)
                                  : std::string("cudaGetDeviceCount found 0 devices");
      cudaGetLastError();  // clear it, so that it cannot leak into a later check
      if (required) GTEST_FAIL() << "no CUDA device: " << why << " (GIFT_REQUIRE_CUDA_DEVICE set)";
      GTEST_SKIP() << "no CUDA device: " << why;
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
    CUDA_CHECK(cudaFree(nullptr));  // creates the context, so that a broken driver shows here
  }

  cudaDeviceProp prop_{};
};

}  // namespace gift::testing
