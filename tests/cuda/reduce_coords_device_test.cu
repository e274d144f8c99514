// The exact device whitener against the CPU's, bit for bit; and device reduce plans in GIFT
// coordinates and their saved states against the CPU plans: every message, reduced shard,
// result, choice of coordinates and saved state byte for byte (GIFT and AUTO, with and
// without error feedback), states carried CPU -> GPU -> CPU in the middle of a run, and a
// rank in another basis named by the receiver's status.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "coords/whitener.h"
#include "coords_reference.h"
#include "cuda/device_test_util.h"
#include "cuda/reduce_reference.h"
#include "gift/gift_transport_cuda.h"
#include "kernels/whitener.h"

namespace {

using namespace gift::testing;
using gift::test::BasisPtr;
using gift::test::coords_input;
using gift::test::fit_basis;
using gift::test::kCoordsBucket;

class ExactDeviceWhitener : public WithCudaDevice<::testing::Test> {};

// The device plan's whitener against the CPU's, bit for bit, in both directions, on sizes
// with leftover rows and columns (the CPU side fuses its multiply-adds only with FMA).
TEST_F(ExactDeviceWhitener, GivesTheCpuWhitenersBits) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "the CPU whitener fuses only with FMA";
#endif
  std::mt19937_64 gen(5);
  std::normal_distribution<double> nd;
  struct Size {
    uint32_t dim, rank;
    uint64_t rows;
  };
  for (const Size z : {Size{64, 8, 37}, Size{37, 5, 9}, Size{256, 16, 64}, Size{16, 0, 3}}) {
    std::vector<double> u(uint64_t(z.dim) * z.rank), l(z.rank), diag(z.dim);
    for (double& x : u) x = nd(gen);
    for (uint32_t j = 0; j < z.rank; ++j) l[j] = 50.0 / (1.0 + j);
    for (double& x : diag) x = 0.5 + std::abs(nd(gen));
    gift::coords::Whitener t;
    ASSERT_EQ(gift::coords::make_whitener(u, l, diag, z.dim, &t), GIFT_OK)
        << giftGetLastErrorMessage();
    gift::kernels::DeviceWhitener d;
    ASSERT_EQ(d.upload(t), GIFT_OK) << giftGetLastErrorMessage();
    std::vector<float> w(z.rows * z.dim);
    for (float& x : w) x = float(nd(gen));
    DeviceBuffer<float> dw;
    CUDA_CHECK(dw.Alloc(w.size()));
    for (const bool inverse : {false, true}) {
      std::vector<float> want = w, got;
      inverse ? gift::coords::unwhiten(t, want.data(), z.rows)
              : gift::coords::whiten(t, want.data(), z.rows);
      CUDA_CHECK(dw.Upload(w));
      ASSERT_EQ(inverse ? d.unwhiten_exact(dw.get(), z.rows, nullptr)
                        : d.whiten_exact(dw.get(), z.rows, nullptr),
                GIFT_OK)
          << giftGetLastErrorMessage();
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(dw.Download(&got));
      for (size_t k = 0; k < w.size(); ++k) {
        uint32_t a, b;
        memcpy(&a, &want[k], 4);
        memcpy(&b, &got[k], 4);
        ASSERT_EQ(a, b) << "dim " << z.dim << " rank " << z.rank
                        << (inverse ? " unwhiten" : " whiten") << " element " << k << ": "
                        << want[k] << " on the CPU, " << got[k] << " on the GPU";
      }
    }
  }
}

// `world` device plans on one GPU; messages move with cudaMemcpy as a backend would.
class DeviceWorld {
 public:
  ~DeviceWorld() {
    for (auto* p : plans_) giftReduceDevicePlanDestroy(p);
  }

  void Create(const giftAllReduceConfig& c, int world, const std::vector<TensorSpec>& specs) {
    specs_ = specs;
    w_ = uint64_t(world);
    const std::vector<giftBucketTensor> d = gift::test::describe(specs);
    plans_.assign(w_, nullptr);
    for (uint64_t r = 0; r < w_; ++r) {
      ASSERT_EQ(giftReduceDevicePlanCreate(&c, world, int(r), d.data(), d.size(), &plans_[r]),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
    m_ = giftReduceDevicePlanMessageBytes(plans_[0]);
    CUDA_CHECK(send_.Alloc(w_ * w_ * m_));
    CUDA_CHECK(recv_.Alloc(w_ * w_ * m_));
    CUDA_CHECK(gathered_.Alloc(w_ * m_));
    // Zeroed once, as a communicator's buffers are: the steps never write messages' padding.
    CUDA_CHECK(cudaMemset(send_.get(), 0, w_ * w_ * m_));
    CUDA_CHECK(cudaMemset(gathered_.get(), 0, w_ * m_));
  }

  giftReduceDevicePlan* plan(uint64_t r) const { return plans_[r]; }
  uint64_t message_bytes() const { return m_; }

  // One call on in[rank]; rec receives what the CPU world records (coordinates and states
  // included).
  void Call(const std::vector<Bucket>& in, CallRecord* rec) {
    std::vector<std::unique_ptr<DeviceTensors>> tensors;
    for (uint64_t r = 0; r < w_; ++r) {
      tensors.push_back(std::make_unique<DeviceTensors>());
      CUDA_CHECK(tensors[r]->upload(in[r]));
      ASSERT_EQ(giftReduceEncodeShardsDevice(plans_[r], tensors[r]->in(), send_.get() + r * w_ * m_,
                                             nullptr),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
    for (uint64_t to = 0; to < w_; ++to) {
      for (uint64_t from = 0; from < w_; ++from) {
        CUDA_CHECK(cudaMemcpy(recv_.get() + (to * w_ + from) * m_,
                              send_.get() + (from * w_ + to) * m_, m_, cudaMemcpyDeviceToDevice));
      }
    }
    for (uint64_t r = 0; r < w_; ++r) {
      ASSERT_EQ(giftReduceSumShardDevice(plans_[r], recv_.get() + r * w_ * m_,
                                         gathered_.get() + r * m_, nullptr),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
    *rec = CallRecord{};
    std::vector<uint8_t> all_send, all_gathered;
    for (uint64_t r = 0; r < w_; ++r) {
      ASSERT_EQ(
          giftReduceDecodeResultDevice(plans_[r], gathered_.get(), tensors[r]->out(), nullptr),
          GIFT_OK)
          << giftGetLastErrorMessage();
      ASSERT_EQ(giftReduceDevicePlanStatus(plans_[r]), GIFT_OK) << giftGetLastErrorMessage();
    }
    CUDA_CHECK(send_.Download(&all_send));
    CUDA_CHECK(gathered_.Download(&all_gathered));
    for (uint64_t r = 0; r < w_; ++r) {
      rec->send.emplace_back(all_send.begin() + r * w_ * m_, all_send.begin() + (r + 1) * w_ * m_);
      rec->reduced.emplace_back(all_gathered.begin() + r * m_, all_gathered.begin() + (r + 1) * m_);
      rec->out.push_back(empty_like(specs_));
      CUDA_CHECK(tensors[r]->download(&rec->out.back()));
      rec->coords.emplace_back(specs_.size());
      ASSERT_EQ(giftReduceDevicePlanCoords(plans_[r], rec->coords.back().data(), specs_.size()),
                GIFT_OK);
      rec->state.emplace_back(giftReduceDevicePlanStateBytes(plans_[r]));
      ASSERT_EQ(giftReduceDevicePlanSaveState(plans_[r], rec->state.back().data(),
                                              rec->state.back().size()),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
  }

 private:
  std::vector<TensorSpec> specs_;
  uint64_t w_ = 0, m_ = 0;
  std::vector<giftReduceDevicePlan*> plans_;
  DeviceBuffer<uint8_t> send_, recv_, gathered_;
};

void ExpectSameCall(const CallRecord& gpu, const CallRecord& cpu, uint64_t m,
                    const std::string& what) {
  const uint64_t w = cpu.send.size();
  for (uint64_t r = 0; r < w; ++r) {
    for (uint64_t s = 0; s < w; ++s) {
      ASSERT_EQ(0, memcmp(&gpu.send[r][s * m], &cpu.send[r][s * m], m))
          << what << ": rank " << r << "'s message for " << s;
    }
    ASSERT_EQ(gpu.reduced[r], cpu.reduced[r]) << what << ": rank " << r << "'s reduced shard";
    for (size_t t = 0; t < cpu.out[r].size(); ++t) {
      ASSERT_EQ(gpu.out[r][t], cpu.out[r][t]) << what << ": rank " << r << ", tensor " << t;
    }
    ASSERT_EQ(gpu.coords[r], cpu.coords[r]) << what << ": rank " << r << "'s coordinates";
    ASSERT_EQ(gpu.state[r], cpu.state[r]) << what << ": rank " << r << "'s saved state";
  }
}

// Inputs that change every call: rank r of call k gets the shared geometry with its own rows.
std::vector<std::vector<Bucket>> coords_inputs(int world, int calls) {
  std::vector<std::vector<Bucket>> in(calls);
  for (int k = 0; k < calls; ++k) {
    for (int r = 0; r < world; ++r) in[k].push_back(coords_input(r + world * k));
  }
  return in;
}

struct CoordsCase {
  int world;
  giftCoordsMode_t mode;
  int error_feedback;
  giftRounding_t rounding;
  giftReduceOp_t op;
};

std::ostream& operator<<(std::ostream& o, const CoordsCase& c) {
  return o << "world " << c.world << " coords " << c.mode << " ef " << c.error_feedback
           << " rounding " << c.rounding << " op " << c.op;
}

giftAllReduceConfig coords_config(const CoordsCase& k) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.integrity = 0;
  c.threads = 1;
  c.seed = 17;
  c.coords = k.mode;
  c.reselect_every = 2;  // AUTO measures on calls 1, 3, 5
  c.error_feedback = k.error_feedback;
  c.rounding = k.rounding;
  c.op = k.op;
  return c;
}

// The CPU plans' run of `calls` calls of case k in GIFT coordinates, which the device plans
// must repeat byte for byte.
struct CpuCoordsRun {
  CpuCoordsRun(const CoordsCase& k, int calls)
      : config(coords_config(k)),
        basis(fit_basis(16)),
        inputs(coords_inputs(k.world, calls)),
        cpu(cpu_world(config, kCoordsBucket, inputs, basis.get())) {}
  giftAllReduceConfig config;
  BasisPtr basis;
  std::vector<std::vector<Bucket>> inputs;
  std::vector<CallRecord> cpu;
};

class DevicePlansInGiftCoords : public WithCudaDevice<::testing::TestWithParam<CoordsCase>> {};

TEST_P(DevicePlansInGiftCoords, WriteTheCpuPlansBytesAndStates) {
  const CoordsCase& k = GetParam();
  const int calls = 5;
  const CpuCoordsRun run(k, calls);
  const auto& [c, basis, inputs, cpu] = run;

  DeviceWorld gpu;
  ASSERT_NO_FATAL_FAILURE(gpu.Create(c, k.world, kCoordsBucket));
  for (int r = 0; r < k.world; ++r) {
    ASSERT_EQ(giftReduceDevicePlanSetBasis(gpu.plan(r), basis.get()), GIFT_OK)
        << giftGetLastErrorMessage();
  }
  for (int call = 0; call < calls; ++call) {
    CallRecord rec;
    ASSERT_NO_FATAL_FAILURE(gpu.Call(inputs[call], &rec));
    std::ostringstream what;
    what << GetParam() << ", call " << call;
    ASSERT_NO_FATAL_FAILURE(ExpectSameCall(rec, cpu[call], gpu.message_bytes(), what.str()));
  }
  // The matrix that gains from whitening travels in GIFT coordinates at the end.
  EXPECT_EQ(cpu.back().coords[0][0], GIFT_COORDS_GIFT);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, DevicePlansInGiftCoords,
    ::testing::Values(
        CoordsCase{1, GIFT_COORDS_MODE_GIFT, 1, GIFT_ROUND_NEAREST, GIFT_REDUCE_SUM},
        CoordsCase{2, GIFT_COORDS_MODE_GIFT, 0, GIFT_ROUND_NEAREST, GIFT_REDUCE_AVG},
        CoordsCase{2, GIFT_COORDS_MODE_AUTO, 1, GIFT_ROUND_NEAREST, GIFT_REDUCE_AVG},
        CoordsCase{3, GIFT_COORDS_MODE_AUTO, 1, GIFT_ROUND_STOCHASTIC, GIFT_REDUCE_SUM},
        CoordsCase{3, GIFT_COORDS_MODE_AUTO, 0, GIFT_ROUND_NEAREST, GIFT_REDUCE_SUM}));

class DevicePlanStates : public WithCudaDevice<::testing::Test> {};

// A run checkpointed on CPU plans after call 2, resumed on device plans for call 3, whose
// states resume CPU plans for calls 4 and 5: every byte equals the uninterrupted CPU run.
TEST_F(DevicePlanStates, RoundTripCpuToGpuToCpu) {
  const CoordsCase k{2, GIFT_COORDS_MODE_AUTO, 1, GIFT_ROUND_STOCHASTIC, GIFT_REDUCE_AVG};
  const int calls = 5;
  const CpuCoordsRun run(k, calls);
  const auto& [c, basis, inputs, cpu] = run;

  DeviceWorld gpu;
  ASSERT_NO_FATAL_FAILURE(gpu.Create(c, k.world, kCoordsBucket));
  for (int r = 0; r < k.world; ++r) {
    // The state loads only into a plan holding its basis.
    EXPECT_EQ(
        giftReduceDevicePlanLoadState(gpu.plan(r), cpu[1].state[r].data(), cpu[1].state[r].size()),
        GIFT_ERROR_BASIS_MISSING);
    ASSERT_EQ(giftReduceDevicePlanSetBasis(gpu.plan(r), basis.get()), GIFT_OK)
        << giftGetLastErrorMessage();
    EXPECT_EQ(giftReduceDevicePlanLoadState(gpu.plan(r), cpu[1].state[r].data(),
                                            cpu[1].state[r].size() - 1),
              GIFT_ERROR_INVALID_ARGUMENT);
    ASSERT_EQ(
        giftReduceDevicePlanLoadState(gpu.plan(r), cpu[1].state[r].data(), cpu[1].state[r].size()),
        GIFT_OK)
        << giftGetLastErrorMessage();
    std::vector<uint8_t> again(giftReduceDevicePlanStateBytes(gpu.plan(r)));
    ASSERT_EQ(giftReduceDevicePlanSaveState(gpu.plan(r), again.data(), again.size()), GIFT_OK);
    EXPECT_EQ(again, cpu[1].state[r]) << "rank " << r << ": a loaded state saves unchanged";
  }
  CallRecord third;
  ASSERT_NO_FATAL_FAILURE(gpu.Call(inputs[2], &third));
  ASSERT_NO_FATAL_FAILURE(ExpectSameCall(third, cpu[2], gpu.message_bytes(), "call 3 on the GPU"));

  const std::vector<std::vector<Bucket>> rest(inputs.begin() + 3, inputs.end());
  const std::vector<CallRecord> resumed =
      cpu_world(c, kCoordsBucket, rest, basis.get(), &third.state);
  for (size_t i = 0; i < resumed.size(); ++i) {
    const uint64_t m = gpu.message_bytes();
    ASSERT_NO_FATAL_FAILURE(
        ExpectSameCall(resumed[i], cpu[3 + i], m, "call " + std::to_string(4 + i) + " on the CPU"));
  }
}

// A rank in another basis: the receiver's status names the sender and its basis, as the CPU
// step does.
TEST_F(DevicePlanStates, ARankInAnotherBasisIsNamedByTheReceiversStatus) {
  const CoordsCase k{2, GIFT_COORDS_MODE_GIFT, 0, GIFT_ROUND_NEAREST, GIFT_REDUCE_SUM};
  const giftAllReduceConfig c = coords_config(k);
  const BasisPtr a = fit_basis(16), b = fit_basis(8);
  DeviceWorld gpu;
  ASSERT_NO_FATAL_FAILURE(gpu.Create(c, k.world, kCoordsBucket));
  ASSERT_EQ(giftReduceDevicePlanSetBasis(gpu.plan(0), a.get()), GIFT_OK);
  ASSERT_EQ(giftReduceDevicePlanSetBasis(gpu.plan(1), b.get()), GIFT_OK);
  const uint64_t m = gpu.message_bytes();
  const std::vector<Bucket> in = {coords_input(0), coords_input(1)};
  DeviceTensors t0, t1;
  CUDA_CHECK(t0.upload(in[0]));
  CUDA_CHECK(t1.upload(in[1]));
  DeviceBuffer<uint8_t> send0, send1, recv, out;
  for (auto* buf : {&send0, &send1, &recv, &out}) {
    CUDA_CHECK(buf->Alloc(2 * m));
    CUDA_CHECK(cudaMemset(buf->get(), 0, 2 * m));
  }
  ASSERT_EQ(giftReduceEncodeShardsDevice(gpu.plan(0), t0.in(), send0.get(), nullptr), GIFT_OK);
  ASSERT_EQ(giftReduceEncodeShardsDevice(gpu.plan(1), t1.in(), send1.get(), nullptr), GIFT_OK);
  // Rank 0 receives its own shard 0 and rank 1's.
  CUDA_CHECK(cudaMemcpy(recv.get(), send0.get(), m, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(recv.get() + m, send1.get(), m, cudaMemcpyDeviceToDevice));
  ASSERT_EQ(giftReduceSumShardDevice(gpu.plan(0), recv.get(), out.get(), nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceDevicePlanStatus(gpu.plan(0)), GIFT_ERROR_BASIS_MISSING);
  const std::string msg = giftGetLastErrorMessage();
  EXPECT_NE(msg.find("from rank 1"), std::string::npos) << msg;
  char hex[33];
  giftBasisIdFormat(giftBasisGetId(b.get()), hex);
  EXPECT_NE(msg.find(hex), std::string::npos) << msg;
  EXPECT_EQ(giftReduceDevicePlanStatus(gpu.plan(0)), GIFT_OK) << "the record is cleared";
}

}  // namespace
