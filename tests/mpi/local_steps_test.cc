// The local steps of the all-reduce in one process: `world` plans stand for the ranks and
// the test moves their messages as a backend would (all-to-all, then all-gather). This is
// the whole algorithm; the MPI, NCCL and Python backends only move these bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "allreduce_reference.h"
#include "coords_reference.h"
#include "gift/gift_transport.h"
#include "transport/config.h"
#include "transport/message.h"
#include "transport/plan_coords.h"

namespace {

using gift::test::Bucket;
using gift::test::TensorSpec;
using PlanPtr = std::unique_ptr<giftReducePlan, decltype(&giftReducePlanDestroy)>;

// `world` ranks of one bucket; messages[r] is what rank r has to send.
class SimulatedWorld {
 public:
  SimulatedWorld(const giftAllReduceConfig& config, int world, std::vector<TensorSpec> specs)
      : specs_(std::move(specs)) {
    const std::vector<giftBucketTensor> d = gift::test::describe(specs_);
    for (int r = 0; r < world; ++r) {
      giftReducePlan* p = nullptr;
      EXPECT_EQ(giftReducePlanCreate(&config, world, r, d.data(), d.size(), &p), GIFT_OK)
          << giftGetLastErrorMessage();
      plans_.emplace_back(p, giftReducePlanDestroy);
    }
    bytes_ = giftReducePlanMessageBytes(plans_[0].get());
  }

  int world() const { return int(plans_.size()); }
  giftReducePlan* plan(int r) const { return plans_[r].get(); }

  // The same basis on every rank.
  void set_basis(const giftBasis* basis) {
    for (const PlanPtr& p : plans_) {
      EXPECT_EQ(giftReducePlanSetBasis(p.get(), basis), GIFT_OK) << giftGetLastErrorMessage();
    }
  }
  uint64_t message_bytes() const { return bytes_; }

  // Step 1 on every rank, then the all-to-all: recv[r] holds rank r's incoming messages.
  // The send buffers hold `stale` bytes before step 1.
  std::vector<std::vector<uint8_t>> scatter(const std::vector<Bucket>& inputs, uint8_t stale = 0) {
    const uint64_t w = uint64_t(world());
    std::vector<std::vector<uint8_t>> send(w, std::vector<uint8_t>(w * bytes_, stale));
    for (uint64_t r = 0; r < w; ++r) {
      const std::vector<const void*> in = pointers(inputs[r]);
      EXPECT_EQ(giftReduceEncodeShards(plans_[r].get(), in.data(), send[r].data()), GIFT_OK)
          << giftGetLastErrorMessage();
    }
    std::vector<std::vector<uint8_t>> recv(w, std::vector<uint8_t>(w * bytes_));
    for (uint64_t to = 0; to < w; ++to) {
      for (uint64_t from = 0; from < w; ++from) {
        memcpy(&recv[to][from * bytes_], &send[from][to * bytes_], bytes_);
      }
    }
    return recv;
  }

  // Step 3 on rank r.
  giftResult_t reduce(int r, const std::vector<uint8_t>& recv, uint8_t* out) {
    return giftReduceSumShard(plans_[r].get(), recv.data(), out);
  }

  // Steps 3 to 5 on every rank after scatter; returns each rank's result.
  std::vector<Bucket> finish(const std::vector<std::vector<uint8_t>>& recv) {
    const uint64_t w = uint64_t(world());
    std::vector<uint8_t> gathered(w * bytes_);
    for (uint64_t r = 0; r < w; ++r) {
      EXPECT_EQ(reduce(int(r), recv[r], &gathered[r * bytes_]), GIFT_OK)
          << giftGetLastErrorMessage();
    }
    std::vector<Bucket> out;
    for (uint64_t r = 0; r < w; ++r) {
      out.push_back(empty_bucket());
      std::vector<void*> o;
      for (auto& t : out.back()) o.push_back(t.data());
      EXPECT_EQ(giftReduceDecodeResult(plans_[r].get(), gathered.data(), o.data()), GIFT_OK)
          << giftGetLastErrorMessage();
    }
    return out;
  }

  std::vector<Bucket> allreduce(const std::vector<Bucket>& inputs) {
    return finish(scatter(inputs));
  }

 private:
  static std::vector<const void*> pointers(const Bucket& b) {
    std::vector<const void*> p;
    for (const auto& t : b) p.push_back(t.data());
    return p;
  }
  Bucket empty_bucket() const {
    Bucket b;
    for (const TensorSpec& s : specs_)
      b.emplace_back(s.elements() * gift::test::dtype_bytes(s.dtype));
    return b;
  }

  std::vector<TensorSpec> specs_;
  std::vector<PlanPtr> plans_;
  uint64_t bytes_ = 0;
};

std::vector<Bucket> inputs_for(const std::vector<TensorSpec>& specs, int world, uint64_t seed) {
  std::vector<Bucket> in;
  for (int r = 0; r < world; ++r) in.push_back(gift::test::make_input(specs, seed, r));
  return in;
}

void expect_within_bound(const std::vector<TensorSpec>& specs, const std::vector<Bucket>& in,
                         const Bucket& out, const giftAllReduceConfig& c) {
  std::vector<std::vector<double>> x;
  for (const Bucket& b : in) x.push_back(gift::test::flat(specs, b));
  const std::vector<double> exact = gift::test::exact_reduce(x, c.op);
  const std::vector<double> bound = gift::test::error_bound(x, specs, c);
  const std::vector<double> got = gift::test::flat(specs, out);
  ASSERT_EQ(got.size(), exact.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - exact[i]), bound[i]) << "element " << i << " of the bucket";
  }
}

struct Case {
  int world;
  giftReduceOp_t op;
  giftFp8Kind_t kind;
  giftScaleDType_t scales;
};

class LocalSteps : public ::testing::TestWithParam<Case> {};

TEST_P(LocalSteps, ReplicasAgreeAndStayWithinTheTwoRoundingBound) {
  const Case k = GetParam();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.op = k.op;
  c.kind = k.kind;
  c.scale_dtype = k.scales;
  c.threads = 1;
  for (const auto& specs : {gift::test::mixed_bucket(), gift::test::tiny_bucket(),
                            std::vector<TensorSpec>{{"none", GIFT_DTYPE_F32, {0}}}}) {
    SimulatedWorld sim(c, k.world, specs);
    const std::vector<Bucket> in = inputs_for(specs, k.world, 7);
    const std::vector<Bucket> out = sim.allreduce(in);
    for (int r = 1; r < k.world; ++r) EXPECT_EQ(out[r], out[0]) << "rank " << r;
    expect_within_bound(specs, in, out[0], c);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, LocalSteps,
    ::testing::Values(Case{1, GIFT_REDUCE_SUM, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_F32},
                      Case{2, GIFT_REDUCE_SUM, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_F32},
                      Case{3, GIFT_REDUCE_AVG, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_F32},
                      Case{4, GIFT_REDUCE_SUM, GIFT_FP8_E5M2, GIFT_SCALE_DTYPE_F32},
                      Case{4, GIFT_REDUCE_AVG, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_E8M0},
                      Case{5, GIFT_REDUCE_AVG, GIFT_FP8_E5M2, GIFT_SCALE_DTYPE_E8M0}));

// Every encode of a call draws its own random bits, however many the ranks: (seed,
// tensor_index) differs between any two. Past 46,340 ranks the index needs 64 bits; in 32
// it wrapped, and at 65,536 ranks the second encode of a shard drew the first's bits.
TEST(LocalSteps, EveryEncodeOfACallHasItsOwnRandomStreamInLargeWorlds) {
  giftQuantParams base;
  giftQuantParamsInit(&base);
  const giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  const auto id = [&](uint32_t step, int world, int sender, int shard) {
    const giftQuantParams q =
        gift::transport::encode_params(base, c, 7, step, world, sender, shard);
    return std::make_pair(q.seed, q.tensor_index);
  };
  for (const int world : {65536, 100000, 1 << 20}) {
    EXPECT_NE(id(0, world, 0, 0), id(1, world, 0, 0)) << world;
    EXPECT_NE(id(0, world, world - 1, world - 1), id(1, world, world - 1, world - 1)) << world;
    EXPECT_NE(id(1, world, 0, 0), id(0, world, 1, 0)) << world;
  }
  // Smaller worlds keep the index they had, and the seed: the bytes of every run so far.
  const giftQuantParams q = gift::transport::encode_params(base, c, 7, 1, 8, 3, 5);
  EXPECT_EQ(q.tensor_index, 1u * 8 * 8 + 3 * 8 + 5);
  EXPECT_EQ(q.seed, c.seed ^ (7 * 0x9E3779B97F4A7C15ull));
}

TEST(LocalSteps, MessagesStayNearOneBytePerElement) {
  // 1 MiB of fp32 over 4 ranks: each message carries a quarter of the bucket in FP8 plus
  // one fp32 scale per 128 elements and a 64-byte header; with measured coordinates (the
  // default) also 8 bytes of estimates per tensor, padded to 64.
  const std::vector<TensorSpec> specs = {{"g", GIFT_DTYPE_F32, {1u << 18}}};
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.coords = GIFT_COORDS_MODE_GIFT;
  EXPECT_EQ(SimulatedWorld(c, 4, specs).message_bytes(), 64u + (1u << 16) / 128 * 4 + (1u << 16));
  c.coords = GIFT_COORDS_MODE_AUTO;
  EXPECT_EQ(SimulatedWorld(c, 4, specs).message_bytes(),
            64u + (1u << 16) / 128 * 4 + (1u << 16) + 64u);
}

// Places a value in tensor `t`, element `e` of a bucket, in the tensor's dtype.
void put(const std::vector<TensorSpec>& specs, Bucket& b, size_t t, uint64_t e, float v) {
  gift::test::store(specs[t].dtype, v, b[t].data() + e * gift::test::dtype_bytes(specs[t].dtype));
}

// The algorithm of gift_transport.h written with whole-shard giftEncode/giftDecode calls:
// every rank's residual and every shard's, one call after another.
class ReferenceWorld {
 public:
  ReferenceWorld(const giftAllReduceConfig& c, int world, uint64_t total)
      : c_(c),
        world_(world),
        params_(gift::transport::quant_params(c)),
        residual_(size_t(world), std::vector<float>(total, 0.0f)),
        shard_residual_(size_t(world)) {
    EXPECT_EQ(gift::transport::make_layout(params_, c, total, 2, world, &l_), GIFT_OK);
    for (int r = 0; r < world; ++r) shard_residual_[size_t(r)].assign(l_.shard_count(r), 0.0f);
  }
  const gift::transport::Layout& layout() const { return l_; }

  // Call `call` on the ranks' fp32 buckets x: scattered[s][r] and reduced[r] are the messages
  // (codes and scales only), result the decoded bucket.
  struct Call {
    std::vector<std::vector<std::vector<uint8_t>>> scattered;
    std::vector<std::vector<uint8_t>> reduced;
    std::vector<float> result;
  };
  Call run(uint64_t call, const std::vector<std::vector<float>>& x) {
    Call out;
    const uint64_t total = x[0].size();
    out.result.resize(total);
    std::vector<std::vector<float>> residual = residual_, shard_residual = shard_residual_;
    std::vector<std::vector<float>> sums(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) sums[size_t(r)].resize(l_.shard_count(r));
    out.scattered.resize(size_t(world_));
    for (int s = 0; s < world_; ++s) {
      std::vector<float> v = x[size_t(s)];
      // Without error feedback nothing is added (not even zeros, which would turn -0 to +0).
      if (c_.error_feedback) {
        for (uint64_t i = 0; i < total; ++i) v[i] += residual_[size_t(s)][i];
      }
      for (int r = 0; r < world_; ++r) {
        const uint64_t begin = l_.shard_begin[size_t(r)], n = l_.shard_count(r);
        std::vector<float> decoded(n);
        out.scattered[size_t(s)].push_back(
            encode(call, gift::transport::kScatter, s, r, v.data() + begin, n, decoded.data()));
        for (uint64_t i = 0; i < n; ++i) {
          residual[size_t(s)][begin + i] = v[begin + i] - decoded[i];
          // The pieces in rank order; the average and the residual come after.
          float& sum = sums[size_t(r)][i];
          sum = s == 0 ? decoded[i] : sum + decoded[i];
        }
      }
    }
    bool finite = true;
    for (int r = 0; r < world_; ++r) {
      const uint64_t begin = l_.shard_begin[size_t(r)], n = l_.shard_count(r);
      std::vector<float>& sum = sums[size_t(r)];
      for (uint64_t i = 0; i < n; ++i) {
        if (c_.op == GIFT_REDUCE_AVG) sum[i] /= float(world_);
        if (c_.error_feedback) sum[i] += shard_residual_[size_t(r)][i];
      }
      out.reduced.push_back(
          encode(call, gift::transport::kGather, r, r, sum.data(), n, out.result.data() + begin));
      for (uint64_t i = 0; i < n; ++i) {
        shard_residual[size_t(r)][i] = sum[i] - out.result[begin + i];
        finite = finite && std::isfinite(out.result[begin + i]);
      }
    }
    if (finite && c_.error_feedback) {  // a call's residuals count once its result is finite
      residual_ = residual;
      shard_residual_ = shard_residual;
    }
    return out;
  }

 private:
  // A message's codes and scales for values[0, n), and their decode.
  std::vector<uint8_t> encode(uint64_t call, uint32_t step, int sender, int shard,
                              const float* values, uint64_t n, float* decoded) const {
    const giftQuantParams q =
        gift::transport::encode_params(params_, c_, call, step, world_, sender, shard);
    std::vector<uint8_t> msg(l_.message_bytes, 0);
    const uint64_t capacity = l_.codes_at - l_.scales_at;
    const giftResult_t rc =
        giftEncode(nullptr, &q, values, GIFT_DTYPE_F32, 1, n, msg.data() + l_.codes_at,
                   msg.data() + l_.scales_at, capacity, nullptr);
    EXPECT_EQ(rc, GIFT_OK) << giftGetLastErrorMessage();
    giftDecode(nullptr, &q, msg.data() + l_.codes_at, msg.data() + l_.scales_at, capacity, 1, n,
               decoded, GIFT_DTYPE_F32);
    return msg;
  }

  giftAllReduceConfig c_;
  int world_;
  giftQuantParams params_;
  gift::transport::Layout l_;
  std::vector<std::vector<float>> residual_, shard_residual_;
};

// Every message is the codec's encode of its whole shard (giftEncode, one call) and the
// result its decode, with both residuals, over three calls: shards of several of the steps'
// chunks, on one and two threads; stochastic rounding (whose random words count elements
// from the shard's start); E5M2 with E8M0 scales in blocks of 4096; and a NaN kept in a
// shard's second chunk, whose call commits no residual.
TEST(LocalSteps, MessagesAreTheCodecsEncodeOfTheirShards) {
  const std::vector<TensorSpec> specs = {{"a", GIFT_DTYPE_F32, {3, 40000}},
                                         {"b", GIFT_DTYPE_BF16, {777}}};
  const uint64_t total = 120000 + 777;
  const int world = 3;
  giftAllReduceConfig stochastic = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  stochastic.rounding = GIFT_ROUND_STOCHASTIC;
  stochastic.seed = 11;
  stochastic.op = GIFT_REDUCE_AVG;
  stochastic.threads = 2;
  giftAllReduceConfig wide = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  wide.kind = GIFT_FP8_E5M2;
  wide.scale_dtype = GIFT_SCALE_DTYPE_E8M0;
  wide.block = 4096;
  wide.nonfinite = GIFT_NONFINITE_KEEP;
  wide.threads = 1;
  giftAllReduceConfig plain = GIFT_ALLREDUCE_CONFIG_INITIALIZER;  // no buffer of the bucket's size
  plain.error_feedback = 0;
  plain.threads = 2;
  for (const giftAllReduceConfig& c : {stochastic, wide, plain}) {
    SCOPED_TRACE(!c.error_feedback                     ? "no error feedback"
                 : c.rounding == GIFT_ROUND_STOCHASTIC ? "stochastic"
                                                       : "e5m2, e8m0, 4096, NaN");
    SimulatedWorld sim(c, world, specs);
    ReferenceWorld ref(c, world, total);
    const gift::transport::Layout& l = ref.layout();
    ASSERT_EQ(l.message_bytes, sim.message_bytes());
    uint64_t scale_bytes = 0;
    const giftQuantParams params = gift::transport::quant_params(c);
    giftScaleBytes(&params, 1, l.max_shard, &scale_bytes);
    for (uint64_t call = 1; call <= 3; ++call) {
      std::vector<Bucket> in = inputs_for(specs, world, call);
      if (c.nonfinite == GIFT_NONFINITE_KEEP && call == 2) {
        put(specs, in[2], 0, l.shard_begin[1] + 20000, NAN);  // shard 1, its second chunk
      }
      std::vector<std::vector<float>> x;
      for (const Bucket& b : in) {
        const std::vector<double> d = gift::test::flat(specs, b);
        x.emplace_back(d.begin(), d.end());
      }
      const ReferenceWorld::Call want = ref.run(call, x);
      const auto same = [&](const uint8_t* got, const std::vector<uint8_t>& w, int shard) {
        return memcmp(got + l.codes_at, w.data() + l.codes_at, l.shard_count(shard)) == 0 &&
               memcmp(got + l.scales_at, w.data() + l.scales_at, scale_bytes) == 0;
      };
      const std::vector<std::vector<uint8_t>> recv = sim.scatter(in);
      const uint64_t m = l.message_bytes;
      std::vector<uint8_t> gathered(uint64_t(world) * m);
      for (int r = 0; r < world; ++r) {
        for (int s = 0; s < world; ++s) {
          EXPECT_TRUE(
              same(&recv[size_t(r)][uint64_t(s) * m], want.scattered[size_t(s)][size_t(r)], r))
              << "call " << call << ": message of rank " << s << " for rank " << r;
        }
        ASSERT_EQ(sim.reduce(r, recv[size_t(r)], &gathered[uint64_t(r) * m]), GIFT_OK)
            << giftGetLastErrorMessage();
        EXPECT_TRUE(same(&gathered[uint64_t(r) * m], want.reduced[size_t(r)], r))
            << "call " << call << ": reduced message of rank " << r;
      }
      for (int r = 0; r < world; ++r) {
        Bucket out = in[0];
        std::vector<void*> o;
        for (auto& t : out) o.push_back(t.data());
        ASSERT_EQ(giftReduceDecodeResult(sim.plan(r), gathered.data(), o.data()), GIFT_OK)
            << giftGetLastErrorMessage();
        const std::vector<double> got = gift::test::flat(specs, out);
        for (uint64_t i = 0; i < total; ++i) {
          float w = want.result[i];
          if (i >= 120000) {  // tensor b goes out in bf16, rounded as a conversion does
            uint8_t bf16[2];
            gift::test::store(GIFT_DTYPE_BF16, w, bf16);
            w = gift::test::to_float(GIFT_DTYPE_BF16, bf16);
          }
          ASSERT_TRUE(std::isnan(w) ? std::isnan(got[i]) : got[i] == double(w))
              << "call " << call << ", rank " << r << ", element " << i;
        }
      }
    }
  }
}

// Every rank's received messages and reduced message of one call, the send and reduced
// buffers holding `stale` bytes before the steps.
std::vector<std::vector<uint8_t>> call_messages(const giftAllReduceConfig& c, int world,
                                                const std::vector<TensorSpec>& specs,
                                                const giftBasis* basis, uint8_t stale) {
  SimulatedWorld sim(c, world, specs);
  if (basis) sim.set_basis(basis);
  const std::vector<std::vector<uint8_t>> recv = sim.scatter(inputs_for(specs, world, 1), stale);
  std::vector<std::vector<uint8_t>> messages;
  for (int r = 0; r < world; ++r) {
    std::vector<uint8_t> out(sim.message_bytes(), stale);
    EXPECT_EQ(sim.reduce(r, recv[size_t(r)], out.data()), GIFT_OK) << giftGetLastErrorMessage();
    messages.push_back(recv[size_t(r)]);
    messages.push_back(out);
  }
  return messages;
}

// Every byte of a message is the step's own: buffers that held other bytes before give the
// same messages as zeroed ones, shorter and empty shards included (padding after their
// scales and codes, fp32 or E8M0), and the space for estimates and the decision of AUTO's
// measuring call, carried or not.
TEST(LocalSteps, MessagesHoldNoStaleBytes) {
  giftAllReduceConfig unequal = GIFT_ALLREDUCE_CONFIG_INITIALIZER;  // shards of 13, 13, 14 blocks
  ASSERT_EQ(unequal.coords, GIFT_COORDS_MODE_AUTO);  // room for estimates, none carried
  giftAllReduceConfig empty = unequal;               // 2 blocks for 3 ranks
  empty.scale_dtype = GIFT_SCALE_DTYPE_E8M0;
  empty.block = 4096;
  const gift::test::BasisPtr basis = gift::test::fit_basis(16);
  struct Case {
    const char* name;
    giftAllReduceConfig config;
    std::vector<TensorSpec> specs;
    const giftBasis* basis;
  };
  const std::vector<Case> cases = {
      {"unequal shards", unequal, {{"a", GIFT_DTYPE_F32, {5, 1000}}}, nullptr},
      {"an empty shard, e8m0", empty, {{"a", GIFT_DTYPE_F32, {5, 1000}}}, nullptr},
      {"measuring call", unequal, gift::test::kCoordsBucket, basis.get()}};
  const int world = 3;
  for (const Case& k : cases) {
    const auto zeroed = call_messages(k.config, world, k.specs, k.basis, 0);
    const auto stale = call_messages(k.config, world, k.specs, k.basis, 0xA5);
    ASSERT_EQ(zeroed.size(), stale.size());
    for (size_t i = 0; i < zeroed.size(); ++i) {
      EXPECT_TRUE(zeroed[i] == stale[i])
          << k.name << ": " << (i % 2 ? "reduced message of rank " : "messages received by rank ")
          << i / 2;
    }
  }
}

// A checkpointed run resumes where it left off: the same bytes as the uninterrupted run,
// because the call counter and both residuals travel with the state.
TEST(LocalSteps, SavedStateResumesTheSameRun) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.rounding = GIFT_ROUND_STOCHASTIC;
  SimulatedWorld run(c, 3, specs), resumed(c, 3, specs);
  run.allreduce(inputs_for(specs, 3, 1));
  for (int r = 0; r < 3; ++r) {
    std::vector<uint8_t> state(giftReducePlanStateBytes(run.plan(r)));
    ASSERT_EQ(giftReducePlanSaveState(run.plan(r), state.data(), state.size()), GIFT_OK);
    ASSERT_EQ(giftReducePlanLoadState(resumed.plan(r), state.data(), state.size()), GIFT_OK)
        << giftGetLastErrorMessage();
  }
  for (uint64_t seed = 2; seed < 4; ++seed) {
    EXPECT_EQ(run.allreduce(inputs_for(specs, 3, seed)),
              resumed.allreduce(inputs_for(specs, 3, seed)));
  }
  // A state does not load into a plan of another rank.
  std::vector<uint8_t> state(giftReducePlanStateBytes(run.plan(0)));
  ASSERT_EQ(giftReducePlanSaveState(run.plan(0), state.data(), state.size()), GIFT_OK);
  EXPECT_EQ(giftReducePlanLoadState(resumed.plan(1), state.data(), state.size()),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftReducePlanSaveState(run.plan(0), state.data(), state.size() - 1),
            GIFT_ERROR_BUFFER_TOO_SMALL);
  // A residual that is not finite (no plan commits one) is damage: refused, where it loaded
  // and failed every later call.
  ASSERT_EQ(giftReducePlanSaveState(run.plan(1), state.data(), state.size()), GIFT_OK);
  const float nan = std::nanf("");
  memcpy(state.data() + sizeof(gift::transport::StateHeader) + 7 * sizeof(float), &nan, 4);
  EXPECT_EQ(giftReducePlanLoadState(resumed.plan(1), state.data(), state.size()),
            GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("non-finite residual (value 7 of"),
            std::string::npos)
      << giftGetLastErrorMessage();
}

TEST(LocalSteps, SavedStateLoadsOnlyIntoTheSameShapesAndModeAndFromOlderVersions) {
  const std::vector<TensorSpec> wide = {{"w", GIFT_DTYPE_F32, {4, 64}}};
  const std::vector<TensorSpec> tall = {{"w", GIFT_DTYPE_F32, {64, 4}}};  // same count
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.rounding = GIFT_ROUND_STOCHASTIC;
  giftAllReduceConfig euclidean = c;
  euclidean.coords = GIFT_COORDS_MODE_EUCLIDEAN;  // c's is AUTO
  SimulatedWorld run(c, 1, wide), other(c, 1, tall), other_mode(euclidean, 1, wide);
  run.allreduce(inputs_for(wide, 1, 1));
  std::vector<uint8_t> state(giftReducePlanStateBytes(run.plan(0)));
  ASSERT_EQ(giftReducePlanSaveState(run.plan(0), state.data(), state.size()), GIFT_OK);
  for (SimulatedWorld* sim : {&other, &other_mode}) {
    ASSERT_EQ(giftReducePlanStateBytes(sim->plan(0)), state.size());
    EXPECT_EQ(giftReducePlanLoadState(sim->plan(0), state.data(), state.size()),
              GIFT_ERROR_INVALID_ARGUMENT);
  }
  // States of versions 1 (their fingerprint without the shapes) and 2 (without the mode), as
  // libgift wrote them before, still load, and resume the same run.
  gift::transport::StateHeader h;
  memcpy(&h, state.data(), sizeof h);
  ASSERT_EQ(h.version, 3u);
  gift::transport::BucketShape shape;
  const std::vector<giftBucketTensor> d = gift::test::describe(wide);
  ASSERT_EQ(gift::transport::read_bucket(d.data(), d.size(), &shape), GIFT_OK);
  const gift::transport::StateKey key = gift::transport::state_key(1, 0, c, shape);
  for (const auto& [version, fingerprint] :
       {std::make_pair(1u, key.v1), std::make_pair(2u, key.v2)}) {
    SimulatedWorld resumed(c, 1, wide);
    h.version = version;
    h.fingerprint = fingerprint;
    std::vector<uint8_t> old = state;
    memcpy(old.data(), &h, sizeof h);
    ASSERT_EQ(giftReducePlanLoadState(resumed.plan(0), old.data(), old.size()), GIFT_OK)
        << "version " << version << ": " << giftGetLastErrorMessage();
    SimulatedWorld again(c, 1, wide);  // the original run, resumed from its own state
    ASSERT_EQ(giftReducePlanLoadState(again.plan(0), state.data(), state.size()), GIFT_OK);
    EXPECT_EQ(again.allreduce(inputs_for(wide, 1, 2)), resumed.allreduce(inputs_for(wide, 1, 2)))
        << "version " << version;
  }
}

// The codec threads of each rank are a local choice: ranks configured differently must still
// send and decode the same bytes. Each shard here spans several threads' chunks; the
// ThreadSanitizer job runs this test too (scripts/sanitize.sh).
TEST(LocalSteps, CodecThreadsDoNotChangeTheResult) {
  std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  specs.push_back({"large", GIFT_DTYPE_F32, {1u << 20}});
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.rounding = GIFT_ROUND_STOCHASTIC;
  c.threads = 1;
  SimulatedWorld serial(c, 2, specs);
  c.threads = 2;
  SimulatedWorld threaded(c, 2, specs);
  // Two calls: the second also carries the error-feedback residuals of the first.
  for (uint64_t seed = 1; seed < 3; ++seed) {
    EXPECT_EQ(threaded.allreduce(inputs_for(specs, 2, seed)),
              serial.allreduce(inputs_for(specs, 2, seed)));
  }
}

#if defined(__SSE2__)
// Gradients so small that their scales, decoded values, sums and residuals are subnormal: a
// caller running with flush-to-zero (torch.set_flush_denormal) gets the bytes of one that
// does not, as a GPU rank computes them.
TEST(LocalSteps, CallersFlushToZeroDoesNotChangeTheResult) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.threads = 1;
  SimulatedWorld ieee(c, 2, specs), flushing(c, 2, specs);
  for (uint64_t seed = 1; seed < 3; ++seed) {  // the second call carries residuals too
    std::vector<Bucket> in = inputs_for(specs, 2, seed);
    for (Bucket& b : in) {
      for (size_t t = 0; t < b.size(); ++t) {
        if (specs[t].dtype != GIFT_DTYPE_F32) continue;
        float* v = reinterpret_cast<float*>(b[t].data());
        for (size_t i = 0; i < b[t].size() / 4; ++i) v[i] *= 1e-36f;
      }
    }
    const std::vector<Bucket> want = ieee.allreduce(in);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // FTZ and DAZ
    const std::vector<Bucket> got = flushing.allreduce(in);
    _mm_setcsr(csr);
    EXPECT_EQ(got, want) << "call " << seed;
  }
}
#endif

TEST(LocalSteps, CorruptedMessageIsCaughtAndNamesTheSender) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  SimulatedWorld sim(c, 3, specs);
  auto recv = sim.scatter(inputs_for(specs, 3, 1));
  recv[2][1 * sim.message_bytes() + 100] ^= 1;  // rank 1's message to rank 2
  std::vector<uint8_t> out(sim.message_bytes());
  EXPECT_EQ(sim.reduce(2, recv[2], out.data()), GIFT_ERROR_SECTION_CHECKSUM);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("from rank 1"), std::string::npos)
      << giftGetLastErrorMessage();
}

TEST(LocalSteps, AbandonedMessagesFailTheReceiversStepsNamingTheSender) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  for (const int integrity : {1, 0}) {
    c.integrity = integrity;
    SimulatedWorld sim(c, 3, specs);
    auto recv = sim.scatter(inputs_for(specs, 3, 1));
    const uint64_t m = sim.message_bytes();
    // Rank 1 failed its step 1: what it sends in the all-to-all says so.
    std::vector<uint8_t> abandoned(3 * m, 0xA5);
    ASSERT_EQ(giftReduceAbandon(sim.plan(1), abandoned.data(), 3), GIFT_OK);
    for (int to = 0; to < 3; ++to) {
      std::copy_n(abandoned.begin() + to * m, m, recv[to].begin() + 1 * m);
    }
    std::vector<uint8_t> gathered(3 * m);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(sim.reduce(r, recv[r], gathered.data() + r * m), GIFT_ERROR_REMOTE);
      EXPECT_NE(std::string(giftGetLastErrorMessage()).find("rank 1 abandoned call 1"),
                std::string::npos)
          << giftGetLastErrorMessage();
      ASSERT_EQ(giftReduceAbandon(sim.plan(r), gathered.data() + r * m, 1), GIFT_OK);
    }
    // Step 5 on the gathered abandoned messages fails too, naming the first sender.
    std::vector<float> out(1 << 12);
    std::vector<void*> o(specs.size(), out.data());
    EXPECT_EQ(giftReduceDecodeResult(sim.plan(2), gathered.data(), o.data()), GIFT_ERROR_REMOTE);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("rank 0 abandoned call 1"),
              std::string::npos)
        << giftGetLastErrorMessage();
  }
  EXPECT_EQ(giftReduceAbandon(nullptr, nullptr, 1), GIFT_ERROR_INVALID_ARGUMENT);
}

TEST(LocalSteps, MisroutedMessageIsRejectedEvenWithoutIntegrity) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.integrity = 0;
  SimulatedWorld sim(c, 3, specs);
  auto recv = sim.scatter(inputs_for(specs, 3, 1));
  const uint64_t m = sim.message_bytes();
  std::swap_ranges(recv[0].begin(), recv[0].begin() + m, recv[0].begin() + m);
  std::vector<uint8_t> out(m);
  EXPECT_EQ(sim.reduce(0, recv[0], out.data()), GIFT_ERROR_CORRUPT_INPUT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("from rank 0"), std::string::npos)
      << giftGetLastErrorMessage();
}

TEST(LocalSteps, ConfigStructIsSizedAndChecked) {
  const std::vector<TensorSpec> specs = gift::test::tiny_bucket();
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  giftReducePlan* p = nullptr;
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.magic = 0;
  EXPECT_EQ(giftReducePlanCreate(&c, 2, 0, d.data(), d.size(), &p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("magic"), std::string::npos);
  // A caller built against an older, shorter struct: fields past its size keep defaults.
  giftAllReduceConfig old = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  old.size = offsetof(giftAllReduceConfig, dump_every);
  old.dump_every = 1;  // beyond `size`: must not be read
  ASSERT_EQ(giftReducePlanCreate(&old, 2, 0, d.data(), d.size(), &p), GIFT_OK)
      << giftGetLastErrorMessage();
  giftReducePlanDestroy(p);
  EXPECT_EQ(giftReducePlanCreate(nullptr, 2, 2, d.data(), d.size(), &p),
            GIFT_ERROR_INVALID_ARGUMENT);
}

TEST(LocalSteps, BucketWhoseElementCountOverflowsIsRefused) {
  // Each tensor passes its own check; their sum wraps past 2^64.
  const uint64_t big = UINT64_MAX / 2 - 1, ten = 10;
  const giftBucketTensor d[] = {{"a", GIFT_DTYPE_F32, 1, &big},
                                {"b", GIFT_DTYPE_F32, 1, &big},
                                {"c", GIFT_DTYPE_F32, 1, &ten}};
  giftReducePlan* p = nullptr;
  EXPECT_EQ(giftReducePlanCreate(nullptr, 2, 0, d, 3, &p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("tensor 1: the bucket's element count"),
            std::string::npos)
      << giftGetLastErrorMessage();
}

TEST(LocalSteps, NonFiniteInputNamesTheTensor) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  std::vector<Bucket> in = inputs_for(specs, 1, 1);
  const float nan = NAN;
  memcpy(in[0][5].data() + 4 * 17, &nan, 4);
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  giftReducePlan* p = nullptr;
  ASSERT_EQ(giftReducePlanCreate(&c, 1, 0, d.data(), d.size(), &p), GIFT_OK);
  std::vector<const void*> ptrs;
  for (const auto& t : in[0]) ptrs.push_back(t.data());
  std::vector<uint8_t> send(giftReducePlanMessageBytes(p));
  EXPECT_EQ(giftReduceEncodeShards(p, ptrs.data(), send.data()), GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("element 17 of tensor 'big.fp32'"),
            std::string::npos)
      << giftGetLastErrorMessage();
  giftReducePlanDestroy(p);
  // Spread over the shards of three ranks, the values are all counted (the count was the
  // first shard's that held one), and the first is still the first.
  ASSERT_EQ(giftReducePlanCreate(&c, 3, 0, d.data(), d.size(), &p), GIFT_OK);
  memcpy(in[0][5].data() + 4 * 18, &nan, 4);
  gift::test::store(specs[6].dtype, INFINITY, in[0][6].data() + in[0][6].size() - 2);
  send.resize(3 * giftReducePlanMessageBytes(p));
  EXPECT_EQ(giftReduceEncodeShards(p, ptrs.data(), send.data()), GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_EQ(std::string(giftGetLastErrorMessage()),
            "3 non-finite value(s) in the input, the first at element 17 of tensor 'big.fp32'");
  giftReducePlanDestroy(p);
}

// GIFT_NONFINITE_KEEP: a NaN on one rank and an Inf on another reach every rank as an fp32
// all-reduce would leave them (NaN, and Inf where E5M2 holds it), every other element stays
// finite, and the call commits nothing: the next calls give the bytes of a run that never
// had it. A sum that overflows only on its shard's owner (two finite halves of 3e38) does
// the same.
TEST(LocalSteps, KeptNonFiniteReachesEveryRankAndLeavesNoTrace) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    SCOPED_TRACE(kind == GIFT_FP8_E4M3 ? "e4m3" : "e5m2");
    giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
    c.kind = kind;
    c.nonfinite = GIFT_NONFINITE_KEEP;
    const int world = 3;
    SimulatedWorld clean(c, world, specs), hit(c, world, specs);
    EXPECT_EQ(clean.allreduce(inputs_for(specs, world, 1)),
              hit.allreduce(inputs_for(specs, world, 1)));
    std::vector<Bucket> bad = inputs_for(specs, world, 2);
    put(specs, bad[1], 5, 17, NAN);      // big.fp32: the second shard
    put(specs, bad[2], 1, 3, INFINITY);  // b.bf16: the first shard
    put(specs, bad[0], 6, 100, 3e38f);   // tail.bf16, the last shard: 3e38 + 3e38 = Inf
    put(specs, bad[1], 6, 100, 3e38f);
    const std::vector<Bucket> out = hit.allreduce(bad);
    const std::vector<double> got = gift::test::flat(specs, out[0]);
    // Flat indices: big.fp32 starts at 231 + 130 + 45 + 1, tail.bf16 999 further.
    const uint64_t nan_at = 407 + 17, inf_at = 231 + 3, sum_at = 1406 + 100;
    for (uint64_t i = 0; i < got.size(); ++i) {
      if (i == nan_at || ((i == inf_at || i == sum_at) && kind == GIFT_FP8_E4M3)) {
        EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
      } else if (i == inf_at || i == sum_at) {
        EXPECT_EQ(got[i], INFINITY) << "element " << i;
      } else {
        EXPECT_TRUE(std::isfinite(got[i])) << "element " << i << ": " << got[i];
      }
    }
    for (int r = 1; r < world; ++r) EXPECT_EQ(out[size_t(r)], out[0]) << "rank " << r;
    for (uint64_t seed = 3; seed < 5; ++seed) {
      EXPECT_EQ(clean.allreduce(inputs_for(specs, world, seed)),
                hit.allreduce(inputs_for(specs, world, seed)));
    }
  }
}

// Values near FLT_MAX whose fp32 sum overflows while their average does not: the average is
// still within the two-rounding bound of the exact one, not Inf or NaN (the sum divided by
// world), on every rank. And an Inf beside them is the average's value, as dividing first
// gives it (their sum is NaN: Inf + -Inf).
TEST(LocalSteps, AverageOfValuesWhoseSumOverflowsStaysFinite) {
  const std::vector<TensorSpec> specs = {{"w", GIFT_DTYPE_F32, {300}},
                                         {"b", GIFT_DTYPE_BF16, {2, 70}}};
  for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    for (const giftScaleDType_t scales : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
      for (const int world : {2, 3, 4}) {
        SCOPED_TRACE(std::string(kind == GIFT_FP8_E4M3 ? "e4m3" : "e5m2") +
                     (scales == GIFT_SCALE_DTYPE_F32 ? ", f32 scales" : ", e8m0 scales") +
                     ", world " + std::to_string(world));
        giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
        c.op = GIFT_REDUCE_AVG;
        c.kind = kind;
        c.scale_dtype = scales;
        c.threads = 1;
        std::vector<Bucket> in = inputs_for(specs, world, 5);
        std::mt19937 gen{uint32_t(world)};
        for (int r = 0; r < world; ++r) {
          for (size_t t = 0; t < specs.size(); ++t) {
            for (uint64_t e = 0; e < specs[t].elements(); ++e) {
              // Mostly large and positive on every rank (exact in bf16): sums of two overflow.
              const float v = std::ldexp(1.0f + float(gen() % 128) / 128.0f, 127 - int(gen() % 2));
              put(specs, in[size_t(r)], t, e, gen() % 8 == 0 ? -v : v);
            }
          }
        }
        SimulatedWorld sim(c, world, specs);
        const std::vector<Bucket> out = sim.allreduce(in);
        for (int r = 1; r < world; ++r) EXPECT_EQ(out[size_t(r)], out[0]) << "rank " << r;
        expect_within_bound(specs, in, out[0], c);

        if (kind != GIFT_FP8_E5M2) continue;  // E4M3 has no Inf
        c.nonfinite = GIFT_NONFINITE_KEEP;
        SimulatedWorld keep(c, world, specs);
        for (int r = 0; r + 1 < world; ++r) put(specs, in[size_t(r)], 0, 7, 3e38f);
        put(specs, in[size_t(world - 1)], 0, 7, -INFINITY);
        const std::vector<double> got = gift::test::flat(specs, keep.allreduce(in)[0]);
        EXPECT_EQ(got[7], -INFINITY);
      }
    }
  }
}

// GIFT_NONFINITE_ERROR: the ranks whose step 1 succeeded keep their error feedback as it was
// when another rank's step 1 fails and the call is abandoned, as a communicator does.
TEST(LocalSteps, CallAbandonedAfterStepOneLeavesEveryRanksErrorFeedback) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  const int world = 3;
  SimulatedWorld clean(c, world, specs), hit(c, world, specs);
  EXPECT_EQ(clean.allreduce(inputs_for(specs, world, 1)),
            hit.allreduce(inputs_for(specs, world, 1)));
  std::vector<Bucket> bad = inputs_for(specs, world, 2);
  put(specs, bad[1], 0, 5, NAN);
  std::vector<uint8_t> send(uint64_t(world) * hit.message_bytes());
  for (int r = 0; r < world; ++r) {
    std::vector<const void*> ptrs;
    for (const auto& t : bad[size_t(r)]) ptrs.push_back(t.data());
    EXPECT_EQ(giftReduceEncodeShards(hit.plan(r), ptrs.data(), send.data()),
              r == 1 ? GIFT_ERROR_NONFINITE_INPUT : GIFT_OK);
  }
  for (uint64_t seed = 3; seed < 5; ++seed) {
    EXPECT_EQ(clean.allreduce(inputs_for(specs, world, seed)),
              hit.allreduce(inputs_for(specs, world, seed)));
  }
}

// Messages hold fp32 scales at multiples of 64 bytes from their start: a buffer that is not
// 4-byte aligned is refused by each step; E8M0 scales are bytes and need no alignment.
TEST(LocalSteps, MisalignedMessageBuffersAreRefusedForFp32Scales) {
  const std::vector<TensorSpec> specs = gift::test::tiny_bucket();
  for (const giftScaleDType_t scales : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
    giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
    c.scale_dtype = scales;
    SimulatedWorld sim(c, 1, specs);
    const Bucket in = inputs_for(specs, 1, 1)[0];
    std::vector<const void*> ptrs;
    for (const auto& t : in) ptrs.push_back(t.data());
    std::vector<uint8_t> buffer(sim.message_bytes() + 8);
    uint8_t* odd = buffer.data() + (reinterpret_cast<uintptr_t>(buffer.data()) % 4 == 0 ? 1 : 0);
    const giftResult_t want =
        scales == GIFT_SCALE_DTYPE_F32 ? GIFT_ERROR_INVALID_ARGUMENT : GIFT_OK;
    EXPECT_EQ(giftReduceEncodeShards(sim.plan(0), ptrs.data(), odd), want);
    std::vector<uint8_t> reduced(sim.message_bytes() + 8);
    uint8_t* odd_out =
        reduced.data() + (reinterpret_cast<uintptr_t>(reduced.data()) % 4 == 0 ? 1 : 0);
    EXPECT_EQ(giftReduceSumShard(sim.plan(0), odd, odd_out), want);
    if (want != GIFT_OK) {
      EXPECT_NE(std::string(giftGetLastErrorMessage()).find("not 4-byte aligned"),
                std::string::npos);
    }
  }
}

TEST(LocalSteps, UnknownNonFinitePolicyIsRefused) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.nonfinite = giftNonFinite_t(7);
  const std::vector<TensorSpec> specs = gift::test::tiny_bucket();
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  giftReducePlan* p = nullptr;
  EXPECT_EQ(giftReducePlanCreate(&c, 1, 0, d.data(), d.size(), &p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
}

// ---- GIFT coordinates --------------------------------------------------------------------

using gift::test::BasisPtr;
using gift::test::coords_input;
using gift::test::fit_basis;
using gift::test::kCoordsBucket;

std::vector<Bucket> coords_inputs(int world) {
  std::vector<Bucket> in;
  for (int r = 0; r < world; ++r) in.push_back(coords_input(r));
  return in;
}

std::vector<giftCoords_t> coords_of(giftReducePlan* p) {
  std::vector<giftCoords_t> c(kCoordsBucket.size());
  EXPECT_EQ(giftReducePlanCoords(p, c.data(), c.size()), GIFT_OK);
  return c;
}

// Relative L2 error of tensor i of `out` against the exact sum of the inputs.
double rel_error(const std::vector<Bucket>& in, const Bucket& out, size_t i) {
  const size_t n = out[i].size() / 4;
  const float* got = reinterpret_cast<const float*>(out[i].data());
  double err = 0, ref = 0;
  for (size_t k = 0; k < n; ++k) {
    double exact = 0;
    for (const Bucket& b : in) exact += reinterpret_cast<const float*>(b[i].data())[k];
    err += (got[k] - exact) * (got[k] - exact);
    ref += exact * exact;
  }
  return std::sqrt(err / ref);
}

giftAllReduceConfig coords_config(giftCoordsMode_t mode) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.threads = 1;
  c.error_feedback = 0;
  c.coords = mode;
  return c;
}

TEST(LocalStepsCoords, GiftCoordinatesLowerTheErrorOfAnAnisotropicMatrixOnEveryRank) {
  const int world = 3;
  const BasisPtr basis = fit_basis(16);
  const std::vector<Bucket> in = coords_inputs(world);
  SimulatedWorld euclid(coords_config(GIFT_COORDS_MODE_EUCLIDEAN), world, kCoordsBucket);
  SimulatedWorld gift(coords_config(GIFT_COORDS_MODE_GIFT), world, kCoordsBucket);
  euclid.set_basis(basis.get());
  gift.set_basis(basis.get());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(coords_of(euclid.plan(r)), std::vector<giftCoords_t>(3, GIFT_COORDS_EUCLIDEAN));
    EXPECT_EQ(
        coords_of(gift.plan(r)),
        (std::vector<giftCoords_t>{GIFT_COORDS_GIFT, GIFT_COORDS_GIFT, GIFT_COORDS_EUCLIDEAN}));
  }
  const std::vector<Bucket> e = euclid.allreduce(in), g = gift.allreduce(in);
  for (int r = 1; r < world; ++r) EXPECT_EQ(g[r], g[0]) << "rank " << r;
  const double err_e = rel_error(in, e[0], 0), err_g = rel_error(in, g[0], 0);
  EXPECT_LT(err_g, 0.6 * err_e) << "euclidean " << err_e << ", gift " << err_g;
  // The vector is encoded alike either way.
  EXPECT_EQ(e[0][2], g[0][2]);
}

TEST(LocalStepsCoords, MeasuredChoiceIsMadeOnceForAllRanksAfterTheFirstCall) {
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  SimulatedWorld sim(coords_config(GIFT_COORDS_MODE_AUTO), world, kCoordsBucket);
  sim.set_basis(basis.get());
  const std::vector<Bucket> in = coords_inputs(world);
  // The first call measures and travels Euclidean; the decision applies from the second.
  const std::vector<Bucket> first = sim.allreduce(in);
  const std::vector<giftCoords_t> chosen = coords_of(sim.plan(0));
  EXPECT_EQ(chosen[0], GIFT_COORDS_GIFT);
  EXPECT_EQ(chosen[1], GIFT_COORDS_EUCLIDEAN);  // isotropic: no gain over the margin
  EXPECT_EQ(chosen[2], GIFT_COORDS_EUCLIDEAN);
  for (int r = 1; r < world; ++r) EXPECT_EQ(coords_of(sim.plan(r)), chosen) << "rank " << r;
  const std::vector<Bucket> second = sim.allreduce(in);
  for (int r = 1; r < world; ++r) EXPECT_EQ(second[r], second[0]);
  EXPECT_LT(rel_error(in, second[0], 0), 0.6 * rel_error(in, first[0], 0));
}

// After a measuring call of `hit` that did not count (reselect_every 3): calls 1-4 of `clean`
// and the next four of `hit` give the same bytes and coordinates, measuring at 1 and 4, and
// the anisotropic matrix ends in GIFT coordinates.
void expect_measured_again(SimulatedWorld& hit, SimulatedWorld& clean,
                           const std::vector<Bucket>& in, const char* what) {
  for (int call = 1; call <= 4; ++call) {
    EXPECT_EQ(hit.allreduce(in), clean.allreduce(in)) << what << ", call " << call;
    EXPECT_EQ(coords_of(hit.plan(0)), coords_of(clean.plan(0))) << what << ", call " << call;
  }
  EXPECT_EQ(coords_of(hit.plan(0))[0], GIFT_COORDS_GIFT) << what;
}

// A measuring call whose result is not finite (GIFT_NONFINITE_KEEP) decides nothing and
// does not count: the next call measures and decides, and the run then equals one that never
// had that call (round to nearest: the call counter does not change the bytes).
TEST(LocalStepsCoords, NonFiniteMeasuringCallIsMeasuredAgain) {
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_AUTO);
  c.error_feedback = 1;
  c.nonfinite = GIFT_NONFINITE_KEEP;
  c.reselect_every = 3;
  SimulatedWorld clean(c, world, kCoordsBucket), hit(c, world, kCoordsBucket);
  clean.set_basis(basis.get());
  hit.set_basis(basis.get());
  const std::vector<Bucket> in = coords_inputs(world);
  std::vector<Bucket> bad = in;
  const float nan = NAN;
  memcpy(bad[1][2].data() + 4 * 3, &nan, 4);  // the bias, a vector: one NaN stays one NaN
  hit.allreduce(bad);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(coords_of(hit.plan(r)), coords_of(clean.plan(r))) << "rank " << r;
  }
  expect_measured_again(hit, clean, in, "a non-finite result");
}

// A measuring call abandoned before step 5 on every rank (here a NaN under
// GIFT_NONFINITE_ERROR fails rank 1's step 1; or every rank stops after step 3, as when a
// communicator's agreement fails the call) decides nothing and does not count: the next call
// measures and decides, and the run then equals one that never had that call. Before, step 1
// counted the call, so the run stayed Euclidean until the reselect_every-th call.
TEST(LocalStepsCoords, AbandonedMeasuringCallIsMeasuredAgain) {
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_AUTO);
  c.error_feedback = 1;
  c.reselect_every = 3;
  const std::vector<Bucket> in = coords_inputs(world);
  for (const bool after_step3 : {false, true}) {
    SimulatedWorld clean(c, world, kCoordsBucket), hit(c, world, kCoordsBucket);
    clean.set_basis(basis.get());
    hit.set_basis(basis.get());
    if (after_step3) {
      const auto recv = hit.scatter(in);
      std::vector<uint8_t> out(hit.message_bytes());
      for (int r = 0; r < world; ++r)
        ASSERT_EQ(hit.reduce(r, recv[size_t(r)], out.data()), GIFT_OK);
    } else {
      std::vector<Bucket> bad = in;
      const float nan = NAN;
      memcpy(bad[1][2].data() + 4 * 3, &nan, 4);
      for (int r = 0; r < world; ++r) {
        std::vector<const void*> ptrs;
        for (const auto& t : bad[size_t(r)]) ptrs.push_back(t.data());
        std::vector<uint8_t> send(uint64_t(world) * hit.message_bytes());
        EXPECT_EQ(giftReduceEncodeShards(hit.plan(r), ptrs.data(), send.data()),
                  r == 1 ? GIFT_ERROR_NONFINITE_INPUT : GIFT_OK);
      }
    }
    expect_measured_again(hit, clean, in, after_step3 ? "after step 3" : "after step 1");
  }
}

// A step 5 that fails on one rank alone (here a missing output buffer) still counts there
// towards the next measurement, as on the ranks whose step 5 completed: the ranks agree on
// which calls measure, and the calls after go on. Counted only on completion, the failed rank
// fell one behind, and from the next measuring call on every call failed ("the ranks disagree
// on whether this call measures").
TEST(LocalStepsCoords, AStep5ThatFailsOnOneRankKeepsTheRanksInStep) {
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_AUTO);
  c.reselect_every = 2;
  SimulatedWorld sim(c, world, kCoordsBucket);
  sim.set_basis(basis.get());
  const std::vector<Bucket> in = coords_inputs(world);
  sim.allreduce(in);  // call 1 measures
  const auto recv = sim.scatter(in);
  std::vector<uint8_t> gathered(uint64_t(world) * sim.message_bytes());
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(sim.reduce(r, recv[size_t(r)], gathered.data() + uint64_t(r) * sim.message_bytes()),
              GIFT_OK);
  }
  for (int r = 0; r < world; ++r) {
    Bucket out = in[0];
    std::vector<void*> o;
    for (auto& t : out) o.push_back(r == 1 ? nullptr : t.data());
    EXPECT_EQ(giftReduceDecodeResult(sim.plan(r), gathered.data(), o.data()),
              r == 1 ? GIFT_ERROR_INVALID_ARGUMENT : GIFT_OK);
  }
  for (int call = 3; call <= 6; ++call) {
    const std::vector<Bucket> out = sim.allreduce(in);  // each step checked inside
    EXPECT_EQ(out[1], out[0]) << "call " << call;
  }
}

// Another basis in GIFT mode drops the reduced residual of the tensors whitened until then: it
// is in the old basis's coordinates, which the tensors keep no longer (their coordinates stay
// GIFT, which is all that dropped it before). A plan taking B2 straight after a call in B1
// goes on as one that went through no basis (which drops it) to B2.
TEST(LocalStepsCoords, AnotherBasisDropsTheReducedResidualOfWhitenedTensors) {
  const int world = 2;
  const BasisPtr b1 = fit_basis(16), b2 = fit_basis(8);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_GIFT);
  c.error_feedback = 1;
  SimulatedWorld straight(c, world, kCoordsBucket), through(c, world, kCoordsBucket);
  straight.set_basis(b1.get());
  through.set_basis(b1.get());
  const std::vector<Bucket> in = coords_inputs(world);
  ASSERT_EQ(straight.allreduce(in), through.allreduce(in));
  straight.set_basis(b2.get());
  through.set_basis(nullptr);
  through.set_basis(b2.get());
  EXPECT_EQ(straight.allreduce(in), through.allreduce(in));
  // The same basis again changes nothing: the residual stays.
  SimulatedWorld again(c, world, kCoordsBucket), once(c, world, kCoordsBucket);
  again.set_basis(b1.get());
  once.set_basis(b1.get());
  ASSERT_EQ(again.allreduce(in), once.allreduce(in));
  again.set_basis(b1.get());
  EXPECT_EQ(again.allreduce(in), once.allreduce(in));
}

// A rank whose config measures (AUTO) sends estimates where a rank of another coordinates
// mode keeps no room for them: refused by name, never read or answered past the message.
// (A EUCLIDEAN plan in the same basis passes every other check of the header: both sides are
// in Euclidean coordinates until the measurement decides.)
TEST(LocalStepsCoords, EstimatesForAPlanOfAnotherModeAreRefused) {
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig measuring = coords_config(GIFT_COORDS_MODE_AUTO);
  measuring.integrity = 0;  // the layouts differ; what is checked is the header's claim
  for (const giftCoordsMode_t mode : {GIFT_COORDS_MODE_EUCLIDEAN, GIFT_COORDS_MODE_GIFT}) {
    giftAllReduceConfig other = measuring;
    other.coords = mode;
    SimulatedWorld sender(measuring, 1, kCoordsBucket), receiver(other, 1, kCoordsBucket);
    sender.set_basis(basis.get());
    receiver.set_basis(basis.get());
    ASSERT_GT(sender.message_bytes(), receiver.message_bytes());  // the room for estimates
    const std::vector<std::vector<uint8_t>> recv = sender.scatter({coords_input(0)});
    const std::vector<uint8_t> in(recv[0].begin(), recv[0].begin() + receiver.message_bytes());
    receiver.scatter({coords_input(0)});  // the receiver's call counter reaches the sender's
    std::vector<uint8_t> out(receiver.message_bytes());
    EXPECT_EQ(giftReduceSumShard(receiver.plan(0), in.data(), out.data()), GIFT_ERROR_CORRUPT_INPUT)
        << "mode " << mode;
    const std::string m = giftGetLastErrorMessage();
    EXPECT_NE(m.find("error estimates"), std::string::npos) << m;
  }
}

TEST(LocalStepsCoords, ARankInAnotherBasisIsNamedByTheReceiver) {
  const int world = 2;
  const BasisPtr a = fit_basis(16), b = fit_basis(8);
  SimulatedWorld sim(coords_config(GIFT_COORDS_MODE_GIFT), world, kCoordsBucket);
  ASSERT_EQ(giftReducePlanSetBasis(sim.plan(0), a.get()), GIFT_OK);
  ASSERT_EQ(giftReducePlanSetBasis(sim.plan(1), b.get()), GIFT_OK);
  std::vector<Bucket> in = {coords_input(0), coords_input(1)};
  const auto recv = sim.scatter(in);
  std::vector<uint8_t> out(sim.message_bytes());
  EXPECT_EQ(sim.reduce(0, recv[0], out.data()), GIFT_ERROR_BASIS_MISSING);
  const std::string m = giftGetLastErrorMessage();
  EXPECT_NE(m.find("from rank 1"), std::string::npos) << m;
  char hex[33];
  giftBasisIdFormat(giftBasisGetId(b.get()), hex);
  EXPECT_NE(m.find(hex), std::string::npos) << m;
}

// A step 1 that fails (a NaN in the last shard, after the first was encoded) leaves the
// rank's error feedback as it was: the next call gives exactly what it gives after a call
// that failed on its first shard, before any residual could change. (Updated in part, the
// residual would also be left in whitened coordinates.)
TEST(LocalStepsCoords, FailedEncodeLeavesTheErrorFeedbackAsItWas) {
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_GIFT);
  c.error_feedback = 1;
  SimulatedWorld late(c, world, kCoordsBucket), early(c, world, kCoordsBucket);
  late.set_basis(basis.get());
  early.set_basis(basis.get());
  const std::vector<Bucket> in = coords_inputs(world);
  ASSERT_EQ(late.allreduce(in), early.allreduce(in));
  const auto fail_with_nan_at = [&](SimulatedWorld& sim, size_t tensor, size_t element) {
    for (int r = 0; r < world; ++r) {
      Bucket bad = in[size_t(r)];
      const float nan = NAN;
      memcpy(bad[tensor].data() + 4 * element, &nan, 4);
      std::vector<const void*> ptrs;
      for (const auto& t : bad) ptrs.push_back(t.data());
      std::vector<uint8_t> send(uint64_t(world) * sim.message_bytes());
      EXPECT_EQ(giftReduceEncodeShards(sim.plan(r), ptrs.data(), send.data()),
                GIFT_ERROR_NONFINITE_INPUT);
    }
  };
  fail_with_nan_at(late, 2, 255);  // the bias' last element: the last shard
  fail_with_nan_at(early, 0, 0);   // the first element: the first shard
  for (int r = 0; r < world; ++r) {
    std::vector<uint8_t> a(giftReducePlanStateBytes(late.plan(r))), b(a.size());
    ASSERT_EQ(giftReducePlanSaveState(late.plan(r), a.data(), a.size()), GIFT_OK);
    ASSERT_EQ(giftReducePlanSaveState(early.plan(r), b.data(), b.size()), GIFT_OK);
    EXPECT_EQ(a, b) << "rank " << r;
  }
  EXPECT_EQ(late.allreduce(in), early.allreduce(in));
}

TEST(LocalStepsCoords, ErrorFeedbackKeptInOriginalCoordinatesMakesTheMeanConverge) {
  // A fixed gradient sent T times: with the residual mapped back to original coordinates,
  // the running mean of the results approaches the exact mean as 1/T.
  const int world = 2;
  const BasisPtr basis = fit_basis(16);
  giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_GIFT);
  c.error_feedback = 1;
  c.op = GIFT_REDUCE_AVG;
  SimulatedWorld sim(c, world, kCoordsBucket);
  sim.set_basis(basis.get());
  const std::vector<Bucket> in = coords_inputs(world);
  const size_t n = in[0][0].size() / 4;
  std::vector<double> exact(n, 0.0), sum(n, 0.0);
  for (const Bucket& b : in)
    for (size_t k = 0; k < n; ++k)
      exact[k] += reinterpret_cast<const float*>(b[0].data())[k] / double(world);
  auto mean_error = [&](int t) {
    double e = 0, r = 0;
    for (size_t k = 0; k < n; ++k) {
      e += (sum[k] / t - exact[k]) * (sum[k] / t - exact[k]);
      r += exact[k] * exact[k];
    }
    return std::sqrt(e / r);
  };
  double first = 0;
  for (int t = 1; t <= 32; ++t) {
    const std::vector<Bucket> out = sim.allreduce(in);
    for (size_t k = 0; k < n; ++k) sum[k] += reinterpret_cast<const float*>(out[0][0].data())[k];
    if (t == 1) first = mean_error(1);
  }
  EXPECT_LT(mean_error(32), first / 8) << "first " << first << ", after 32 " << mean_error(32);
}

// A NaN in a tensor sent in GIFT coordinates is counted as given, not as whitened (where it
// is its whole row's: "256 non-finite value(s) ..., the first at element 512").
TEST(LocalStepsCoords, NonFiniteInputIsCountedAsGiven) {
  const BasisPtr basis = fit_basis(16);
  const giftAllReduceConfig c = coords_config(GIFT_COORDS_MODE_GIFT);
  for (int world : {1, 2}) {
    SimulatedWorld sim(c, world, kCoordsBucket);
    sim.set_basis(basis.get());
    std::vector<Bucket> in = coords_inputs(world);
    const float nan = NAN;
    memcpy(in[0][0].data() + 4 * (2 * 256 + 5), &nan, 4);  // aniso's row 2, column 5
    std::vector<uint8_t> send(uint64_t(world) * sim.message_bytes());
    std::vector<const void*> ptrs;
    for (const auto& t : in[0]) ptrs.push_back(t.data());
    EXPECT_EQ(giftReduceEncodeShards(sim.plan(0), ptrs.data(), send.data()),
              GIFT_ERROR_NONFINITE_INPUT);
    EXPECT_EQ(std::string(giftGetLastErrorMessage()),
              "1 non-finite value(s) in the input, the first at element 517 of tensor 'aniso'")
        << "world " << world;
  }
}

}  // namespace
