// The all-reduce's device local steps (gift_transport_cuda.h) against the CPU plans: the
// fused decode-and-sum kernel against a host reference, and whole simulated worlds whose
// every message and result must equal the CPU's byte for byte, error feedback and
// stochastic rounding included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/device_test_util.h"
#include "cuda/reduce_reference.h"
#include "gift/gift_transport_cuda.h"
#include "kernels/reduce.h"
#include "numerics/elementwise.h"

namespace {

using namespace gift::testing;
namespace num = gift::num;

bool same_float(float a, float b) {
  return (a != a && b != b) || num::bits_of(a) == num::bits_of(b);
}

class SumShardKernel : public WithCudaDevice<::testing::Test> {};

// Random codes (NaN and Inf codes included) and scales in `world` messages; the kernel's sum
// against decode_element summed left to right on the host, and for GIFT_REDUCE_AVG divided by
// world, or where that is not finite each value divided first (fp32 scales up to 2^119 in the
// third variant, and random E8M0 scales, make sums of finite values overflow).
TEST_F(SumShardKernel, MatchesTheHostSumInRankOrder) {
  std::mt19937 gen(7);
  for (int world : {1, 2, 3, 8}) {
    for (uint32_t block : {16u, 128u, 4096u}) {
      for (bool e8m0 : {false, true}) {
        for (giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
          // sum; avg with a residual; avg of values near FLT_MAX
          for (int variant = 0; variant < 3; ++variant) {
            const uint64_t count = 3 * block + 7;
            const uint64_t groups = (count + block - 1) / block;
            const uint64_t scales_at = 64;
            const uint64_t codes_at = scales_at + (groups * (e8m0 ? 1 : 4) + 63) / 64 * 64;
            const uint64_t m = codes_at + (count + 63) / 64 * 64;
            std::vector<uint8_t> msgs(m * world);
            for (auto& b : msgs) b = uint8_t(gen());
            if (!e8m0) {  // finite positive fp32 scales over many binades
              for (int r = 0; r < world; ++r) {
                for (uint64_t g = 0; g < groups; ++g) {
                  const int binade = variant == 2 ? 100 + int(gen() % 19) : int(gen() % 60) - 40;
                  const float s = std::ldexp(1.0f + float(gen() % 1000) / 1000.0f, binade);
                  memcpy(&msgs[r * m + scales_at + 4 * g], &s, 4);
                }
              }
            }
            std::vector<float> residual(count);
            for (auto& x : residual) x = float(int(gen() % 2001) - 1000) * 1e-3f;
            const bool avg = variant >= 1;

            DeviceBuffer<uint8_t> d_msgs;
            DeviceBuffer<float> d_res, d_sum;
            CUDA_CHECK(d_msgs.Alloc(msgs.size()));
            CUDA_CHECK(d_msgs.Upload(msgs));
            CUDA_CHECK(d_res.Alloc(count));
            CUDA_CHECK(d_res.Upload(residual));
            CUDA_CHECK(d_sum.Alloc(count + 16));
            CUDA_CHECK(d_sum.Poison());
            gift::kernels::SumShardArgs a;
            a.in = {d_msgs.get(), m, scales_at, codes_at};
            a.world = world;
            a.count = count;
            a.block = block;
            a.e8m0 = e8m0;
            a.kind = kind;
            a.average = avg;
            a.residual = avg ? d_res.get() : nullptr;
            a.sum = d_sum.get();
            ASSERT_EQ(gift::kernels::sum_shard(a, nullptr), GIFT_OK) << giftGetLastErrorMessage();
            CUDA_CHECK_LAUNCH();
            std::vector<float> got;
            CUDA_CHECK(d_sum.Download(&got));

            std::ostringstream what;
            what << "world " << world << " block " << block << " e8m0 " << e8m0 << " kind " << kind
                 << " avg " << avg;
            for (uint64_t i = 0; i < count; ++i) {
              const auto value = [&](int r) {
                const uint8_t* msg = &msgs[r * m];
                const uint64_t g = i / block;
                float s;
                if (e8m0) {
                  s = num::e8m0_to_float(msg[scales_at + g]);
                } else {
                  memcpy(&s, msg + scales_at + 4 * g, 4);
                }
                const uint8_t c = msg[codes_at + i];
                return kind == GIFT_FP8_E4M3 ? num::decode_element<num::Fp8::kE4M3>(c, s)
                                             : num::decode_element<num::Fp8::kE5M2>(c, s);
              };
              float sum = value(0);
              for (int r = 1; r < world; ++r) sum += value(r);
              if (avg) {
                sum /= float(world);
                if (!std::isfinite(sum)) {
                  sum = value(0) / float(world);
                  for (int r = 1; r < world; ++r) sum += value(r) / float(world);
                }
                sum += residual[i];
              }
              ASSERT_TRUE(same_float(got[i], sum))
                  << what.str() << " element " << i << ": " << got[i] << " vs " << sum;
            }
            for (uint64_t i = count; i < count + 16; ++i) {
              uint32_t bits = num::bits_of(got[i]);
              ASSERT_EQ(bits, 0xAAAAAAAAu) << what.str() << ": wrote past the shard";
            }
          }
        }
      }
    }
  }
}

struct WorldCase {
  int world;
  giftFp8Kind_t kind;
  uint32_t block;
  giftScaleDType_t scale_dtype;
  giftRounding_t rounding;
  giftReduceOp_t op;
  int error_feedback;
  bool single;  // one fp32 tensor instead of the mixed bucket
};

std::ostream& operator<<(std::ostream& o, const WorldCase& c) {
  return o << "world " << c.world << " kind " << c.kind << " block " << c.block << " scale "
           << c.scale_dtype << " rounding " << c.rounding << " op " << c.op << " ef "
           << c.error_feedback << " single " << c.single;
}

class DevicePlans : public WithCudaDevice<::testing::TestWithParam<WorldCase>> {};

// `world` device plans on one GPU, messages moved with cudaMemcpy as a backend would, three
// calls in place; every message and every result equals the CPU plans'.
TEST_P(DevicePlans, WriteTheCpuPlansBytes) {
  const WorldCase& k = GetParam();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.kind = k.kind;
  c.block = k.block;
  c.scale_dtype = k.scale_dtype;
  c.rounding = k.rounding;
  c.seed = 99;
  c.op = k.op;
  c.error_feedback = k.error_feedback;
  c.integrity = 0;
  const std::vector<TensorSpec> specs =
      k.single ? std::vector<TensorSpec>{{"flat", GIFT_DTYPE_F32, {3001}}}
               : gift::test::mixed_bucket();
  const int calls = 3;
  const auto inputs = world_inputs(specs, k.world, calls, 5);
  const std::vector<CallRecord> cpu = cpu_world(c, specs, inputs);

  const uint64_t w = uint64_t(k.world);
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  std::vector<giftReduceDevicePlan*> plans(w, nullptr);
  struct Free {
    std::vector<giftReduceDevicePlan*>& p;
    ~Free() {
      for (auto* x : p) giftReduceDevicePlanDestroy(x);
    }
  } free_plans{plans};
  for (uint64_t r = 0; r < w; ++r) {
    ASSERT_EQ(giftReduceDevicePlanCreate(&c, k.world, int(r), d.data(), d.size(), &plans[r]),
              GIFT_OK)
        << giftGetLastErrorMessage();
  }
  const uint64_t m = giftReduceDevicePlanMessageBytes(plans[0]);
  ASSERT_EQ(m, cpu[0].send[0].size() / w);
  DeviceBuffer<uint8_t> send, recv, gathered;
  CUDA_CHECK(send.Alloc(w * w * m));
  CUDA_CHECK(recv.Alloc(w * w * m));
  CUDA_CHECK(gathered.Alloc(w * m));
  // Zeroed once, as a communicator's buffers are: the steps never write messages' padding.
  CUDA_CHECK(cudaMemset(send.get(), 0, w * w * m));
  CUDA_CHECK(cudaMemset(gathered.get(), 0, w * m));
  for (int call = 0; call < calls; ++call) {
    std::vector<std::unique_ptr<DeviceTensors>> tensors;
    for (uint64_t r = 0; r < w; ++r) {
      tensors.push_back(std::make_unique<DeviceTensors>());
      CUDA_CHECK(tensors[r]->upload(inputs[call][r]));
      ASSERT_EQ(
          giftReduceEncodeShardsDevice(plans[r], tensors[r]->in(), send.get() + r * w * m, nullptr),
          GIFT_OK)
          << giftGetLastErrorMessage();
    }
    for (uint64_t to = 0; to < w; ++to) {
      for (uint64_t from = 0; from < w; ++from) {
        CUDA_CHECK(cudaMemcpy(recv.get() + (to * w + from) * m, send.get() + (from * w + to) * m, m,
                              cudaMemcpyDeviceToDevice));
      }
    }
    for (uint64_t r = 0; r < w; ++r) {
      ASSERT_EQ(giftReduceSumShardDevice(plans[r], recv.get() + r * w * m, gathered.get() + r * m,
                                         nullptr),
                GIFT_OK)
          << giftGetLastErrorMessage();
    }
    for (uint64_t r = 0; r < w; ++r) {
      ASSERT_EQ(giftReduceDecodeResultDevice(plans[r], gathered.get(), tensors[r]->out(), nullptr),
                GIFT_OK)
          << giftGetLastErrorMessage();
      ASSERT_EQ(giftReduceDevicePlanStatus(plans[r]), GIFT_OK) << giftGetLastErrorMessage();
    }
    std::vector<uint8_t> all_send, all_gathered;
    CUDA_CHECK(send.Download(&all_send));
    CUDA_CHECK(gathered.Download(&all_gathered));
    for (uint64_t r = 0; r < w; ++r) {
      for (uint64_t s = 0; s < w; ++s) {
        ASSERT_EQ(0, memcmp(&all_send[(r * w + s) * m], &cpu[call].send[r][s * m], m))
            << GetParam() << ": call " << call << ", rank " << r << "'s message for " << s;
      }
      ASSERT_EQ(0, memcmp(&all_gathered[r * m], cpu[call].reduced[r].data(), m))
          << GetParam() << ": call " << call << ", rank " << r << "'s reduced shard";
      Bucket out = empty_like(specs);
      CUDA_CHECK(tensors[r]->download(&out));
      for (size_t t = 0; t < specs.size(); ++t) {
        ASSERT_EQ(out[t], cpu[call].out[r][t])
            << GetParam() << ": call " << call << ", rank " << r << ", tensor " << specs[t].name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, DevicePlans,
    ::testing::Values(WorldCase{1, GIFT_FP8_E4M3, 128, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_NEAREST,
                                GIFT_REDUCE_SUM, 1, false},
                      WorldCase{1, GIFT_FP8_E4M3, 128, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_NEAREST,
                                GIFT_REDUCE_SUM, 0, true},
                      WorldCase{2, GIFT_FP8_E5M2, 32, GIFT_SCALE_DTYPE_E8M0, GIFT_ROUND_NEAREST,
                                GIFT_REDUCE_AVG, 1, false},
                      WorldCase{3, GIFT_FP8_E4M3, 16, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_STOCHASTIC,
                                GIFT_REDUCE_AVG, 1, false},
                      WorldCase{4, GIFT_FP8_E4M3, 128, GIFT_SCALE_DTYPE_E8M0, GIFT_ROUND_NEAREST,
                                GIFT_REDUCE_SUM, 0, true},
                      WorldCase{5, GIFT_FP8_E5M2, 128, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_STOCHASTIC,
                                GIFT_REDUCE_SUM, 0, false}));

class DevicePlanStatus : public WithCudaDevice<::testing::Test> {};

// Data problems surface at the status query, naming the call and step.
TEST_F(DevicePlanStatus, ReportsNonFiniteInputAndMisroutedMessages) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.integrity = 0;
  uint64_t n = 300;
  const giftBucketTensor t = {"x", GIFT_DTYPE_F32, 1, &n};
  giftReduceDevicePlan* p = nullptr;
  ASSERT_EQ(giftReduceDevicePlanCreate(&c, 1, 0, &t, 1, &p), GIFT_OK) << giftGetLastErrorMessage();
  const uint64_t m = giftReduceDevicePlanMessageBytes(p);
  std::vector<float> x(n, 1.0f);
  x[17] = NAN;
  DeviceBuffer<float> d_x;
  DeviceBuffer<uint8_t> send, reduced;
  CUDA_CHECK(d_x.Alloc(n));
  CUDA_CHECK(d_x.Upload(x));
  CUDA_CHECK(send.Alloc(m));
  CUDA_CHECK(reduced.Alloc(m));
  const void* in[] = {d_x.get()};
  void* out[] = {d_x.get()};
  EXPECT_EQ(giftReduceEncodeShardsDevice(p, in, send.get(), nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceSumShardDevice(p, send.get(), reduced.get(), nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceDecodeResultDevice(p, reduced.get(), out, nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceDevicePlanStatus(p), GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("call 1 in the input"), std::string::npos)
      << giftGetLastErrorMessage();
  EXPECT_EQ(giftReduceDevicePlanStatus(p), GIFT_OK) << "the record is cleared";

  // Call 2 reads call 1's message: stale, so refused.
  CUDA_CHECK(d_x.Upload(std::vector<float>(n, 1.0f)));
  DeviceBuffer<uint8_t> fresh;
  CUDA_CHECK(fresh.Alloc(m));
  EXPECT_EQ(giftReduceEncodeShardsDevice(p, in, fresh.get(), nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceSumShardDevice(p, send.get(), reduced.get(), nullptr), GIFT_OK);
  EXPECT_EQ(giftReduceDevicePlanStatus(p), GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("from rank 0 in the all-to-all"),
            std::string::npos)
      << giftGetLastErrorMessage();
  giftReduceDevicePlanDestroy(p);
}

// GIFT_NONFINITE_KEEP: a NaN travels (its messages say so), the status reports nothing, the
// result holds the NaN there, and the call commits no residual: the next call's result is
// the first call's without it.
TEST_F(DevicePlanStatus, KeptNonFiniteIsNoErrorAndCommitsNothing) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.integrity = 0;
  c.nonfinite = GIFT_NONFINITE_KEEP;
  uint64_t n = 300;
  const giftBucketTensor t = {"x", GIFT_DTYPE_F32, 1, &n};
  giftReduceDevicePlan* p = nullptr;
  ASSERT_EQ(giftReduceDevicePlanCreate(&c, 1, 0, &t, 1, &p), GIFT_OK) << giftGetLastErrorMessage();
  const uint64_t m = giftReduceDevicePlanMessageBytes(p);
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = 0.1f * float(i % 7) - 0.3f;  // not all exact in FP8
  DeviceBuffer<float> d_x;
  DeviceBuffer<uint8_t> send, reduced;
  CUDA_CHECK(d_x.Alloc(n));
  CUDA_CHECK(send.Alloc(m));
  CUDA_CHECK(reduced.Alloc(m));
  const void* in[] = {d_x.get()};
  void* out[] = {d_x.get()};
  const auto call = [&](const std::vector<float>& values, std::vector<float>* result) {
    CUDA_CHECK(d_x.Upload(values));
    EXPECT_EQ(giftReduceEncodeShardsDevice(p, in, send.get(), nullptr), GIFT_OK);
    EXPECT_EQ(giftReduceSumShardDevice(p, send.get(), reduced.get(), nullptr), GIFT_OK);
    EXPECT_EQ(giftReduceDecodeResultDevice(p, reduced.get(), out, nullptr), GIFT_OK);
    EXPECT_EQ(giftReduceDevicePlanStatus(p), GIFT_OK) << giftGetLastErrorMessage();
    CUDA_CHECK(d_x.Download(result));
  };
  std::vector<float> first, poisoned, after;
  call(x, &first);
  std::vector<float> bad = x;
  bad[17] = NAN;
  call(bad, &poisoned);
  std::vector<uint8_t> msgs;
  CUDA_CHECK(reduced.Download(&msgs));
  gift::transport::MessageHeader h;
  memcpy(&h, msgs.data(), sizeof h);
  EXPECT_TRUE(h.flags & gift::transport::kHoldsNonFinite);
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::isnan(poisoned[i]), i == 17) << "element " << i;
  }
  // A fresh plan's second call on x equals this plan's next call: the NaN call left nothing.
  giftReduceDevicePlan* q = nullptr;
  ASSERT_EQ(giftReduceDevicePlanCreate(&c, 1, 0, &t, 1, &q), GIFT_OK);
  std::swap(p, q);
  std::vector<float> expected;
  call(x, &first);
  call(x, &expected);
  std::swap(p, q);
  call(x, &after);
  EXPECT_EQ(after, expected);
  giftReduceDevicePlanDestroy(q);
  giftReduceDevicePlanDestroy(p);
}

// Refused before any device work, so this runs without a GPU.
TEST(DevicePlanConfig, RefusesIntegrityAndDumps) {
  uint64_t n = 10;
  const giftBucketTensor t = {"x", GIFT_DTYPE_F32, 1, &n};
  giftReduceDevicePlan* p = nullptr;
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  EXPECT_EQ(giftReduceDevicePlanCreate(&c, 1, 0, &t, 1, &p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("set integrity to 0"), std::string::npos);
  c.integrity = 0;
  c.dump_every = 5;
  EXPECT_EQ(giftReduceDevicePlanCreate(&c, 1, 0, &t, 1, &p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("dump_every"), std::string::npos);
  EXPECT_EQ(p, nullptr);
}

}  // namespace
