// The local steps of the compressed all-reduce (gift_transport.h): one implementation that
// every backend drives, so every consumer of libgift gets the same bytes. The numerics go
// through the public codec API (giftEncode/giftDecode), as an external transport would.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/handles.h"
#include "common/ctx.h"
#include "common/error.h"
#include "common/xxh3.h"
#include "coords/whitener.h"
#include "gift/gift_transport.h"
#include "numerics/convert.h"
#include "numerics/fp_env.h"
#include "transport/config.h"
#include "transport/dump.h"
#include "transport/message.h"
#include "transport/plan_coords.h"

using gift::fail;

namespace {

using gift::transport::kCarriesDecision;
using gift::transport::kCarriesEstimates;
using gift::transport::kGather;
using gift::transport::kHoldsNonFinite;
using gift::transport::kMessageMagic;
using gift::transport::kScatter;
using gift::transport::MessageHeader;
using gift::transport::step_name;

}  // namespace

struct giftReducePlan {
  giftAllReduceConfig config;
  giftQuantParams params;
  giftCtx ctx;  // the config's threads
  gift::transport::DumpSettings dump;
  int world = 1;
  int rank = 0;
  uint64_t call = 0;

  gift::transport::BucketShape bucket;
  gift::transport::Layout layout;

  gift::transport::PlanCoords coords;  // GIFT coordinates (transport/plan_coords.h)

  // A call's residuals wait in the work buffers until step 5 commits them by a swap (see
  // giftReduceDecodeResult): flat holds this call's encode residual from step 1, sum the
  // reduced shard's from step 3, each while its flag is set.
  std::vector<float> flat;            // the bucket in fp32 (input, then result)
  std::vector<float> residual;        // error feedback of this rank's encode, over the bucket
  std::vector<float> sum;             // this rank's shard: the sum being reduced
  std::vector<float> shard_residual;  // error feedback of the reduced shard's encode
  std::vector<float> scratch;         // one decoded shard
  bool residual_pending = false;
  bool shard_residual_pending = false;

  uint64_t shard_count(int r) const { return layout.shard_count(r); }
};

namespace {

giftQuantParams encode_params(const giftReducePlan& p, uint32_t step, int sender, int shard) {
  return gift::transport::encode_params(p.params, p.config, p.call, step, p.world, sender, shard);
}

uint64_t tensor_elements(const giftReducePlan& p, size_t i) {
  return p.bucket.offset[i + 1] - p.bucket.offset[i];
}

// A tensor's slice of the flat bucket as the whitener sees it: rows x (last dimension).
void apply_whitener(const giftReducePlan& p, size_t i, float* flat, bool inverse) {
  const gift::coords::Whitener& t = *p.coords.whitener[i];
  const uint64_t rows = tensor_elements(p, i) / t.dim;
  float* w = flat + p.bucket.offset[i];
  inverse ? gift::coords::unwhiten(t, w, rows) : gift::coords::whiten(t, w, rows);
}

void apply_coords(const giftReducePlan& p, float* flat, bool inverse) {
  for (size_t i = 0; i < p.coords.in_gift.size(); ++i) {
    if (p.coords.in_gift[i]) apply_whitener(p, i, flat, inverse);
  }
}

// Applies a new choice of coordinates; the reduced shard's residual of a tensor that changes
// coordinates no longer means anything and is dropped (a call's uncommitted one too).
void set_coords(giftReducePlan& p, const std::vector<uint8_t>& in_gift) {
  if (!p.shard_residual.empty()) {
    for (const auto& [b, e] : p.coords.changed_ranges(p.bucket, p.layout, p.rank, in_gift)) {
      std::fill(p.shard_residual.begin() + b, p.shard_residual.begin() + e, 0.0f);
      if (p.shard_residual_pending) std::fill(p.sum.begin() + b, p.sum.begin() + e, 0.0f);
    }
  }
  p.coords.choose(in_gift);
}

// The tensor holding flat element `index`, for messages about non-finite inputs.
size_t tensor_of(const giftReducePlan& p, uint64_t index) {
  return size_t(std::upper_bound(p.bucket.offset.begin(), p.bucket.offset.end(), index) -
                p.bucket.offset.begin() - 1);
}

// Encodes values[0, count) into `msg` and, with error feedback, leaves values - decoded in
// `residual` (which may be `values` itself): what the next call adds back so that rounding
// errors do not accumulate. Kept NaN or Inf (GIFT_NONFINITE_KEEP) mark the message.
giftResult_t encode_message(giftReducePlan& p, uint32_t step, int shard, const float* values,
                            uint64_t count, float* residual, uint8_t* msg, uint32_t flags = 0,
                            const void* extra = nullptr, uint64_t extra_bytes = 0) {
  memset(msg, 0, p.layout.message_bytes);
  MessageHeader h{};
  p.coords.fill_header(&h);
  h.flags = flags;
  if (extra_bytes) memcpy(msg + p.layout.extra_at, extra, extra_bytes);
  h.magic = kMessageMagic;
  h.step = step;
  h.sender = uint32_t(p.rank);
  h.shard = uint32_t(shard);
  h.call = p.call;
  h.count = count;
  if (count > 0) {
    const giftQuantParams q = encode_params(p, step, p.rank, shard);
    const uint64_t scale_bytes = p.layout.codes_at - p.layout.scales_at;
    giftEncodeStats stats;
    if (const giftResult_t rc =
            giftEncode(&p.ctx, &q, values, GIFT_DTYPE_F32, 1, count, msg + p.layout.codes_at,
                       msg + p.layout.scales_at, scale_bytes, &stats)) {
      if (rc != GIFT_ERROR_NONFINITE_INPUT) return rc;
      const uint64_t at = p.layout.shard_begin[shard] + stats.first_nonfinite;
      const size_t t = tensor_of(p, at);
      return fail(
          rc, "%" PRIu64 " non-finite value(s) %s, the first at element %" PRIu64 " of tensor '%s'",
          stats.nonfinite_count, step == kScatter ? "in the input" : "in the reduced sum",
          at - p.bucket.offset[t], p.bucket.names[t].c_str());
    }
    if (stats.nonfinite_count) h.flags |= kHoldsNonFinite;
    if (residual) {
      giftDecode(&p.ctx, &q, msg + p.layout.codes_at, msg + p.layout.scales_at, scale_bytes, 1,
                 count, p.scratch.data(), GIFT_DTYPE_F32);
      for (uint64_t i = 0; i < count; ++i) residual[i] = values[i] - p.scratch[i];
    }
  }
  memcpy(msg, &h, sizeof h);
  if (p.config.integrity) {
    h.checksum = XXH3_64bits(msg + 8, p.layout.message_bytes - 8);
    memcpy(msg, &h.checksum, sizeof h.checksum);
  }
  return GIFT_OK;
}

// Checks that message `msg`, received from `sender` at `step`, is intact and is shard
// `shard` of this call.
giftResult_t check_message(const giftReducePlan& p, uint32_t step, int sender, int shard,
                           const uint8_t* msg) {
  MessageHeader h;
  memcpy(&h, msg, sizeof h);
  if (p.config.integrity && h.checksum != XXH3_64bits(msg + 8, p.layout.message_bytes - 8)) {
    return fail(GIFT_ERROR_SECTION_CHECKSUM,
                "the message from rank %d in %s (call %" PRIu64 ") fails its checksum", sender,
                step_name(step), p.call);
  }
  if (h.magic != kMessageMagic || h.step != step || h.sender != uint32_t(sender) ||
      h.shard != uint32_t(shard) || h.call != p.call || h.count != p.shard_count(shard)) {
    return fail(GIFT_ERROR_CORRUPT_INPUT,
                "the message from rank %d in %s is not shard %d of call %" PRIu64
                " (it says step %" PRIu32 ", sender %" PRIu32 ", shard %" PRIu32 ", call %" PRIu64
                ", %" PRIu64 " elements)",
                sender, step_name(step), shard, p.call, h.step, h.sender, h.shard, h.call, h.count);
  }
  return p.coords.check_header(h, sender, step);
}

// Whether any of the `world` messages at `msgs` holds a non-finite value.
bool holds_nonfinite(const giftReducePlan& p, const uint8_t* msgs) {
  for (int s = 0; s < p.world; ++s) {
    MessageHeader h;
    memcpy(&h, msgs + uint64_t(s) * p.layout.message_bytes, sizeof h);
    if (h.flags & kHoldsNonFinite) return true;
  }
  return false;
}

void decode_message(const giftReducePlan& p, const uint8_t* msg, uint64_t count, float* dst) {
  if (count == 0) return;
  giftDecode(&p.ctx, &p.params, msg + p.layout.codes_at, msg + p.layout.scales_at,
             p.layout.codes_at - p.layout.scales_at, 1, count, dst, GIFT_DTYPE_F32);
}

giftResult_t check_plan(const giftReducePlan* p) {
  gift::clear_error();
  return p ? GIFT_OK : fail(GIFT_ERROR_INVALID_ARGUMENT, "plan is NULL");
}

gift::transport::StateLayout state_layout(const giftReducePlan& p) {
  return {p.residual.size(), p.shard_residual.size(), p.coords.in_gift.size()};
}

uint64_t state_fingerprint(const giftReducePlan& p) {
  return gift::transport::state_fingerprint(p.world, p.rank, p.config, p.bucket);
}

}  // namespace

extern "C" {

giftResult_t giftReducePlanCreate(const giftAllReduceConfig* config, int world, int rank,
                                  const giftBucketTensor* tensors, size_t n,
                                  giftReducePlan** plan) {
  gift::clear_error();
  if (!plan) return fail(GIFT_ERROR_INVALID_ARGUMENT, "plan is NULL");
  *plan = nullptr;
  if (world < 1 || rank < 0 || rank >= world) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "rank %d of world %d", rank, world);
  }
  try {
    auto p = std::make_unique<giftReducePlan>();
    if (const giftResult_t rc = gift::transport::read_config(config, &p->config)) return rc;
    p->params = gift::transport::quant_params(p->config);
    p->ctx.threads = p->config.threads;
    if (const giftResult_t rc = giftQuantParamsValidate(&p->params)) return rc;
    p->dump = gift::transport::dump_settings(p->config);
    p->world = world;
    p->rank = rank;
    if (const giftResult_t rc = gift::transport::read_bucket(tensors, n, &p->bucket)) return rc;
    const uint64_t total = p->bucket.offset.back();
    if (const giftResult_t rc =
            gift::transport::make_layout(p->params, p->config, total, n, world, &p->layout))
      return rc;
    p->flat.resize(total);
    p->sum.resize(p->layout.max_shard);
    p->scratch.resize(p->layout.max_shard);
    if (p->config.error_feedback) {
      p->residual.assign(total, 0.0f);
      p->shard_residual.assign(p->layout.max_shard, 0.0f);
    }
    p->coords = gift::transport::PlanCoords(n);
    *plan = p.release();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for the work buffers of a reduce plan");
  }
}

void giftReducePlanDestroy(giftReducePlan* plan) { delete plan; }

giftResult_t giftReducePlanSetBasis(giftReducePlan* plan, const giftBasis* basis) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  try {
    std::vector<uint8_t> in_gift;
    p.coords.set_basis(p.bucket, p.config, basis, &in_gift);
    set_coords(p, in_gift);
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for the plan's copy of the basis");
  }
}

giftResult_t giftReducePlanCoords(const giftReducePlan* plan, giftCoords_t* coords, size_t n) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  return plan->coords.get(coords, n);
}

uint64_t giftReducePlanMessageBytes(const giftReducePlan* plan) {
  return plan ? plan->layout.message_bytes : 0;
}

uint64_t giftReducePlanStateBytes(const giftReducePlan* plan) {
  return plan ? state_layout(*plan).bytes() : 0;
}

giftResult_t giftReducePlanSaveState(const giftReducePlan* plan, void* state, uint64_t bytes) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  const giftReducePlan& p = *plan;
  const gift::transport::StateLayout l = state_layout(p);
  if (const giftResult_t rc =
          gift::transport::save_state(l, state_fingerprint(p), p.call, p.coords, state, bytes)) {
    return rc;
  }
  uint8_t* out = static_cast<uint8_t*>(state);
  if (!p.residual.empty()) {
    memcpy(out + l.residual_at(), p.residual.data(), p.residual.size() * sizeof(float));
  }
  if (!p.shard_residual.empty()) {
    memcpy(out + l.shard_residual_at(), p.shard_residual.data(),
           p.shard_residual.size() * sizeof(float));
  }
  return GIFT_OK;
}

giftResult_t giftReducePlanLoadState(giftReducePlan* plan, const void* state, uint64_t bytes) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  const gift::transport::StateLayout l = state_layout(p);
  uint64_t call = 0;
  if (const giftResult_t rc =
          gift::transport::check_state(l, state_fingerprint(p), p.coords, state, bytes, &call)) {
    return rc;
  }
  const uint8_t* in = static_cast<const uint8_t*>(state);
  p.call = call;
  p.residual_pending = p.shard_residual_pending = false;
  if (!p.residual.empty()) {
    memcpy(p.residual.data(), in + l.residual_at(), p.residual.size() * sizeof(float));
  }
  if (!p.shard_residual.empty()) {
    memcpy(p.shard_residual.data(), in + l.shard_residual_at(),
           p.shard_residual.size() * sizeof(float));
  }
  gift::transport::load_state_coords(l, state, &p.coords);
  return GIFT_OK;
}

giftResult_t giftReduceEncodeShards(giftReducePlan* plan, const void* const* tensors,
                                    uint8_t* send) {
  const gift::num::FpEnvGuard fp_env;  // residuals, sums and means in IEEE arithmetic
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  // Every call advances the counter, failed ones too, so that ranks stay on the same call
  // number after an error on one of them.
  ++p.call;
  p.residual_pending = p.shard_residual_pending = false;
  if (const giftResult_t rc = gift::transport::check_tensor_pointers(p.bucket, tensors)) return rc;
  if (!send) return fail(GIFT_ERROR_INVALID_ARGUMENT, "send buffer is NULL");
  for (size_t i = 0; i < p.bucket.dtypes.size(); ++i) {
    gift::convert_elements(tensors[i], p.bucket.dtypes[i], p.flat.data() + p.bucket.offset[i],
                           GIFT_DTYPE_F32, tensor_elements(p, i));
  }
  // The residual is added in original coordinates, before whitening, and mapped back to them
  // after encoding, so a change of basis or coordinates between calls does not strand it.
  for (size_t i = 0; i < p.residual.size(); ++i) p.flat[i] += p.residual[i];
  const bool measure_now = p.coords.measuring(p.config);
  if (measure_now) p.coords.measure(p.bucket, p.params, p.flat.data());
  if (p.coords.has_basis) ++p.coords.calls_with_basis;
  apply_coords(p, p.flat.data(), false);
  // This call's residuals replace the values they come from in the work buffer, in original
  // coordinates, until step 5 commits them.
  const bool feedback = !p.residual.empty();
  for (int r = 0; r < p.world; ++r) {
    float* values = p.flat.data() + p.layout.shard_begin[r];
    const bool carry = measure_now && r == 0;
    if (const giftResult_t rc = encode_message(
            p, kScatter, r, values, p.shard_count(r), feedback ? values : nullptr,
            send + uint64_t(r) * p.layout.message_bytes, carry ? kCarriesEstimates : 0,
            p.coords.estimates.data(), carry ? p.coords.estimates.size() * sizeof(float) : 0)) {
      return rc;
    }
  }
  if (feedback) {
    apply_coords(p, p.flat.data(), true);
    p.residual_pending = true;
  }
  return GIFT_OK;
}

giftResult_t giftReduceSumShard(giftReducePlan* plan, const uint8_t* recv, uint8_t* out_msg) {
  const gift::num::FpEnvGuard fp_env;
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  if (!recv || !out_msg) return fail(GIFT_ERROR_INVALID_ARGUMENT, "a message buffer is NULL");
  const uint64_t count = p.shard_count(p.rank);
  for (int s = 0; s < p.world; ++s) {
    if (const giftResult_t rc =
            check_message(p, kScatter, s, p.rank, recv + uint64_t(s) * p.layout.message_bytes)) {
      return rc;
    }
  }
  // Rank order, in fp32, so every owner reduces the same way whatever the arrival order.
  decode_message(p, recv, count, p.sum.data());
  for (int s = 1; s < p.world; ++s) {
    decode_message(p, recv + uint64_t(s) * p.layout.message_bytes, count, p.scratch.data());
    for (uint64_t i = 0; i < count; ++i) p.sum[i] += p.scratch[i];
  }
  if (p.config.op == GIFT_REDUCE_AVG) {
    const float w = float(p.world);
    for (uint64_t i = 0; i < count; ++i) p.sum[i] /= w;
  }
  // The new residual replaces the sum it comes from, until step 5 commits it.
  float* residual = p.shard_residual.empty() ? nullptr : p.sum.data();
  if (residual) {
    for (uint64_t i = 0; i < count; ++i) p.sum[i] += p.shard_residual[i];
  }
  // A reduced shard holds what its pieces held, whatever its own encode saw.
  uint32_t flags = holds_nonfinite(p, recv) ? kHoldsNonFinite : 0;
  // Rank 0 receives every rank's estimates on a measuring call and sends back the decision.
  MessageHeader first;
  memcpy(&first, recv, sizeof first);
  std::vector<uint8_t> d;
  if (first.flags & kCarriesEstimates) {
    d = p.coords.decide(recv, p.layout.message_bytes, p.layout.extra_at, p.world);
    flags |= kCarriesDecision;
  }
  const giftResult_t rc = encode_message(p, kGather, p.rank, p.sum.data(), count, residual, out_msg,
                                         flags, d.data(), d.size());
  p.shard_residual_pending = rc == GIFT_OK && residual;
  return rc;
}

giftResult_t giftReduceDecodeResult(giftReducePlan* plan, const uint8_t* gathered,
                                    void* const* out_tensors) {
  const gift::num::FpEnvGuard fp_env;
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  if (const giftResult_t rc = gift::transport::check_tensor_pointers(p.bucket, out_tensors))
    return rc;
  if (!gathered) return fail(GIFT_ERROR_INVALID_ARGUMENT, "gathered buffer is NULL");
  for (int s = 0; s < p.world; ++s) {
    if (const giftResult_t rc =
            check_message(p, kGather, s, s, gathered + uint64_t(s) * p.layout.message_bytes)) {
      return rc;
    }
  }
  const bool finite = !holds_nonfinite(p, gathered);
  // Commits the call's residuals; without a commit they are dropped (flat is overwritten).
  if (finite && p.residual_pending) std::swap(p.flat, p.residual);
  if (finite && p.shard_residual_pending) std::swap(p.sum, p.shard_residual);
  p.residual_pending = p.shard_residual_pending = false;
  for (int s = 0; s < p.world; ++s) {
    decode_message(p, gathered + uint64_t(s) * p.layout.message_bytes, p.shard_count(s),
                   p.flat.data() + p.layout.shard_begin[s]);
  }
  apply_coords(p, p.flat.data(), true);
  for (size_t i = 0; i < p.bucket.dtypes.size(); ++i) {
    gift::convert_elements(p.flat.data() + p.bucket.offset[i], GIFT_DTYPE_F32, out_tensors[i],
                           p.bucket.dtypes[i], tensor_elements(p, i));
  }
  // Every rank reads rank 0's decision from the same gathered bytes, so all switch together.
  // A measuring call whose result is not finite does not count: the next call measures.
  MessageHeader zero;
  memcpy(&zero, gathered, sizeof zero);
  if (zero.flags & kCarriesDecision) {
    if (finite) {
      set_coords(p, std::vector<uint8_t>(gathered + p.layout.extra_at,
                                         gathered + p.layout.extra_at + p.coords.in_gift.size()));
    } else {
      --p.coords.calls_with_basis;
    }
  }
  if (finite && p.rank == 0 && gift::transport::dump_due(p.dump, p.call)) {
    std::vector<gift::transport::DumpTensor> tensors;
    for (size_t i = 0; i < p.bucket.dtypes.size(); ++i) {
      tensors.push_back(
          {p.bucket.names[i].c_str(), p.bucket.dtypes[i], &p.bucket.shapes[i], out_tensors[i]});
    }
    return gift::transport::write_dump(p.dump, p.config, p.world, p.call, tensors);
  }
  return GIFT_OK;
}

}  // extern "C"
