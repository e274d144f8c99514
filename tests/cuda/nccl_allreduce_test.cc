// The NCCL backend (gift_nccl.h) end to end: one process drives every GPU of the machine
// (ncclCommInitAll, one thread per rank), and every rank's result must equal the CPU plans'
// result for the same world and inputs byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_test_util.h"
#include "cuda/reduce_reference.h"
#include "gift/gift_nccl.h"

namespace {

using namespace gift::testing;

class NcclAllReduce : public WithCudaDevice<::testing::TestWithParam<int>> {};

// GetParam(): the world, 0 for every GPU of the machine (on a one-GPU machine, world 1 again:
// run_on_gpu.sh counts a skip as a failure).
TEST_P(NcclAllReduce, EveryRankGetsTheCpuPlansResult) {
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int world = GetParam() ? GetParam() : devices;
  if (world > devices) GTEST_SKIP() << "needs " << world << " GPUs";

  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.integrity = 0;
  c.op = GIFT_REDUCE_AVG;
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const int calls = 3;
  const auto inputs = world_inputs(specs, world, calls, 11);
  const std::vector<CallRecord> cpu = cpu_world(c, specs, inputs);

  std::vector<int> ids(world);
  for (int r = 0; r < world; ++r) ids[r] = r;
  std::vector<ncclComm_t> comms(world);
  ASSERT_EQ(ncclCommInitAll(comms.data(), world, ids.data()), ncclSuccess);
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  std::vector<std::string> failures(world);
  std::vector<std::vector<Bucket>> results(world);
  auto rank_main = [&](int r) {
    std::string& f = failures[r];
    if (cudaSetDevice(r) != cudaSuccess) {
      f = "cudaSetDevice failed";
      return;
    }
    cudaStream_t stream = nullptr;
    giftDeviceComm* comm = nullptr;
    if (cudaStreamCreate(&stream) != cudaSuccess) {
      f = "cudaStreamCreate failed";
      return;
    }
    if (giftCommInitNccl(comms[r], &c, &comm) != GIFT_OK) {
      f = std::string("giftCommInitNccl: ") + giftGetLastErrorMessage();
    }
    for (int call = 0; f.empty() && call < calls; ++call) {
      DeviceTensors t;
      if (t.upload(inputs[call][r]) != cudaSuccess) {
        f = "upload failed";
        break;
      }
      // In place, on the rank's own stream, with no synchronisation until the download.
      if (giftDeviceAllReduceBucket(comm, d.data(), t.in(), t.out(), d.size(), stream) != GIFT_OK) {
        f = std::string("giftDeviceAllReduceBucket: ") + giftGetLastErrorMessage();
        break;
      }
      if (giftDeviceCommStatus(comm) != GIFT_OK) {
        f = std::string("giftDeviceCommStatus: ") + giftGetLastErrorMessage();
        break;
      }
      Bucket out = empty_like(specs);
      if (cudaStreamSynchronize(stream) != cudaSuccess || t.download(&out) != cudaSuccess) {
        f = "download failed";
        break;
      }
      results[r].push_back(std::move(out));
    }
    giftDeviceCommDestroy(comm);
    cudaStreamDestroy(stream);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(failures[r], "") << "rank " << r;
    for (int call = 0; call < calls; ++call) {
      for (size_t t = 0; t < specs.size(); ++t) {
        ASSERT_EQ(results[r][call][t], cpu[call].out[r][t])
            << "world " << world << ", call " << call << ", rank " << r << ", tensor "
            << specs[t].name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, NcclAllReduce, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param ? "one_gpu" : "all_gpus";
                         });

// Refused before NCCL is touched, so this runs without a GPU.
TEST(NcclConfig, RefusesNullArguments) {
  giftDeviceComm* comm = nullptr;
  EXPECT_EQ(giftCommInitNccl(nullptr, nullptr, &comm), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(comm, nullptr);
}

}  // namespace
