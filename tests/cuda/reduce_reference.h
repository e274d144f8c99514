// The all-reduce's local steps of `world` ranks simulated in one process, on the CPU plans
// (the reference) and on device plans or communicators, with every message kept, so that
// device runs can be compared with the CPU byte for byte.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "allreduce_reference.h"
#include "gift/gift_transport.h"

namespace gift::testing {

using gift::test::Bucket;
using gift::test::TensorSpec;

// What one call of a simulated world produced: every rank's outgoing messages of the
// all-to-all, its reduced message and its result; with a basis, each rank's coordinates and
// saved state after the call.
struct CallRecord {
  std::vector<std::vector<uint8_t>> send;  // send[r]: world messages
  std::vector<std::vector<uint8_t>> reduced;
  std::vector<Bucket> out;
  std::vector<std::vector<giftCoords_t>> coords;
  std::vector<std::vector<uint8_t>> state;
};

inline Bucket empty_like(const std::vector<TensorSpec>& specs) {
  Bucket b;
  for (const TensorSpec& s : specs) b.emplace_back(s.elements() * gift::test::dtype_bytes(s.dtype));
  return b;
}

// `calls` calls of the CPU plans on inputs[call][rank]; with `basis`, set on every plan first
// (coordinates and states are then recorded), and with `states`, loaded after it.
inline std::vector<CallRecord> cpu_world(
    const giftAllReduceConfig& c, const std::vector<TensorSpec>& specs,
    const std::vector<std::vector<Bucket>>& inputs, const giftBasis* basis = nullptr,
    const std::vector<std::vector<uint8_t>>* states = nullptr) {
  using PlanPtr = std::unique_ptr<giftReducePlan, decltype(&giftReducePlanDestroy)>;
  const int world = int(inputs[0].size());
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  std::vector<PlanPtr> plans;
  for (int r = 0; r < world; ++r) {
    giftReducePlan* p = nullptr;
    EXPECT_EQ(giftReducePlanCreate(&c, world, r, d.data(), d.size(), &p), GIFT_OK)
        << giftGetLastErrorMessage();
    plans.emplace_back(p, giftReducePlanDestroy);
    if (basis) {
      EXPECT_EQ(giftReducePlanSetBasis(p, basis), GIFT_OK) << giftGetLastErrorMessage();
    }
    if (states) {
      EXPECT_EQ(giftReducePlanLoadState(p, (*states)[r].data(), (*states)[r].size()), GIFT_OK)
          << giftGetLastErrorMessage();
    }
  }
  const uint64_t m = giftReducePlanMessageBytes(plans[0].get()), w = uint64_t(world);
  std::vector<CallRecord> calls;
  for (const std::vector<Bucket>& in : inputs) {
    CallRecord rec;
    for (uint64_t r = 0; r < w; ++r) {
      rec.send.emplace_back(w * m);
      std::vector<const void*> t;
      for (const auto& x : in[r]) t.push_back(x.data());
      EXPECT_EQ(giftReduceEncodeShards(plans[r].get(), t.data(), rec.send[r].data()), GIFT_OK)
          << giftGetLastErrorMessage();
    }
    std::vector<uint8_t> gathered(w * m);
    for (uint64_t r = 0; r < w; ++r) {
      std::vector<uint8_t> recv(w * m);
      for (uint64_t s = 0; s < w; ++s) memcpy(&recv[s * m], &rec.send[s][r * m], m);
      EXPECT_EQ(giftReduceSumShard(plans[r].get(), recv.data(), &gathered[r * m]), GIFT_OK)
          << giftGetLastErrorMessage();
      rec.reduced.emplace_back(gathered.begin() + r * m, gathered.begin() + (r + 1) * m);
    }
    for (uint64_t r = 0; r < w; ++r) {
      rec.out.push_back(empty_like(specs));
      std::vector<void*> o;
      for (auto& x : rec.out.back()) o.push_back(x.data());
      EXPECT_EQ(giftReduceDecodeResult(plans[r].get(), gathered.data(), o.data()), GIFT_OK)
          << giftGetLastErrorMessage();
      if (basis) {
        rec.coords.emplace_back(specs.size());
        EXPECT_EQ(giftReducePlanCoords(plans[r].get(), rec.coords.back().data(), specs.size()),
                  GIFT_OK);
        rec.state.emplace_back(giftReducePlanStateBytes(plans[r].get()));
        EXPECT_EQ(giftReducePlanSaveState(plans[r].get(), rec.state.back().data(),
                                          rec.state.back().size()),
                  GIFT_OK);
      }
    }
    calls.push_back(std::move(rec));
  }
  return calls;
}

// The inputs of `calls` calls of `world` ranks, different on every call.
inline std::vector<std::vector<Bucket>> world_inputs(const std::vector<TensorSpec>& specs,
                                                     int world, int calls, uint64_t seed) {
  std::vector<std::vector<Bucket>> in(calls);
  for (int k = 0; k < calls; ++k) {
    for (int r = 0; r < world; ++r) {
      in[k].push_back(gift::test::make_input(specs, seed + uint64_t(k) * 101, r));
    }
  }
  return in;
}

// Device copies of a bucket's tensors, freed with the object.
class DeviceTensors {
 public:
  DeviceTensors() = default;
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;
  ~DeviceTensors() {
    for (void* p : ptrs_) cudaFree(p);
  }
  cudaError_t upload(const Bucket& b) {
    for (const auto& t : b) {
      void* p = nullptr;
      if (const cudaError_t e = cudaMalloc(&p, t.size() ? t.size() : 1)) return e;
      ptrs_.push_back(p);
      if (const cudaError_t e = cudaMemcpy(p, t.data(), t.size(), cudaMemcpyHostToDevice)) return e;
    }
    return cudaSuccess;
  }
  cudaError_t download(Bucket* b) const {
    for (size_t i = 0; i < ptrs_.size(); ++i) {
      if (const cudaError_t e =
              cudaMemcpy((*b)[i].data(), ptrs_[i], (*b)[i].size(), cudaMemcpyDeviceToHost)) {
        return e;
      }
    }
    return cudaSuccess;
  }
  const void* const* in() const { return ptrs_.data(); }
  void* const* out() const { return ptrs_.data(); }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace gift::testing
