// The local steps of the compressed all-reduce (gift_transport.h): one implementation that
// every backend drives, so every consumer of libgift gets the same bytes. The numerics are
// the codec's, run chunk by chunk with each chunk's other passes (conversion, sums,
// residuals) while it is in cache: every message holds the bytes giftEncode gives for its
// whole shard (tests/mpi/local_steps_test.cc checks them against it).

#include "transport/reduce_plan.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
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
#include "common/line_aligned.h"
#include "common/xxh3.h"
#include "coords/whitener.h"
#include "gift/gift_transport.h"
#include "numerics/codec.h"
#include "numerics/convert.h"
#include "numerics/elementwise.h"
#include "numerics/fp_env.h"
#include "numerics/shapes.h"
#include "numerics/simd.h"
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

  // The work buffers. flat: the whole bucket in fp32 where a basis needs it (whitening, AUTO's
  // measurement), and with error feedback this call's encode residual from step 1; sum: the
  // reduced shard's new residual from step 3. Each residual waits there, while its flag is
  // set, until step 5 commits it by a swap (giftReduceDecodeResult). Without error feedback
  // sum is empty, and so is flat unless a basis is set in GIFT or AUTO mode.
  gift::LineAlignedVector<float> flat;
  gift::LineAlignedVector<float> residual;        // this rank's encode's error feedback
  gift::LineAlignedVector<float> sum;             // the reduced shard's new residual
  gift::LineAlignedVector<float> shard_residual;  // the reduced shard's encode's feedback
  bool residual_pending = false;
  bool shard_residual_pending = false;
  std::vector<giftEncodeStats> chunk_stats;  // of a message's encode, chunk by chunk

  uint64_t shard_count(int r) const { return layout.shard_count(r); }
};

namespace {

giftQuantParams encode_params(const giftReducePlan& p, uint32_t step, int sender, int shard) {
  return gift::transport::encode_params(p.params, p.config, p.call, step, p.world, sender, shard);
}

uint64_t tensor_elements(const giftReducePlan& p, size_t i) {
  return p.bucket.offset[i + 1] - p.bucket.offset[i];
}

// The elementwise passes of a step (conversions, sums, residuals) run chunk by chunk, all of
// a chunk's passes while it is in the core's cache, instead of each pass over the whole
// bucket. A chunk holds whole blocks of every size (GIFT_BLOCK_MAX).
constexpr uint64_t kChunk = 16384;
static_assert(kChunk % GIFT_BLOCK_MAX == 0, "a chunk holds whole blocks");

// kChunk floats each (transport/reduce_plan.h).
using ChunkScratch = gift::transport::StepScratch;

giftResult_t make_scratch(const giftReducePlan& p, ChunkScratch* s) {
  s->threads = std::max(1, gift::thread_count(&p.ctx));
  s->floats.reset(new (std::nothrow) float[uint64_t(s->threads) * 2 * kChunk]);
  return s->floats ? GIFT_OK : fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a step's scratch");
}

// f(begin, count, a, b) for the chunks of [0, n), on the plan's threads, with two spans of
// kChunk floats of scratch each (a, b). Every element's arithmetic is the same wherever the chunks
// fall.
template <typename F>
void for_each_chunk(const ChunkScratch& s, uint64_t n, F&& f) {
  const int64_t chunks = int64_t((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) num_threads(gift::team_size(s.threads, chunks))
  for (int64_t c = 0; c < chunks; ++c) {
    const gift::num::FpEnvGuard fp_env;
    const uint64_t b = uint64_t(c) * kChunk;
    float* scratch = s.floats.get() + uint64_t(omp_get_thread_num()) * 2 * kChunk;
    f(b, std::min(kChunk, n - b), scratch, scratch + kChunk);
  }
}

// Where the scales of elements from `begin` (a multiple of the block: plans encode in blocks)
// start in a message.
uint64_t scales_of(const giftReducePlan& p, uint64_t begin) {
  return p.layout.scales_at + begin / p.params.block * gift::scale_size(p.params.scale_dtype);
}

// The codec on the calling thread: a chunk is one thread's work.
constexpr giftCtx kOneThread{1};

// Elements [begin, begin + n) of the message at msg (begin a multiple of the block) in fp32,
// decoded on the calling thread (message buffers are checked once per step).
void decode_range(const giftReducePlan& p, const uint8_t* msg, uint64_t begin, uint64_t n,
                  float* dst) {
  gift::decode_tensor(&kOneThread, p.params, msg + p.layout.codes_at + begin,
                      msg + scales_of(p, begin), 1, n, dst, GIFT_DTYPE_F32);
}

// Message buffers hold fp32 scales (when the plan has them) at a multiple of 64 bytes from
// their start.
giftResult_t check_messages(const giftReducePlan& p, const uint8_t* msgs, const char* what) {
  if (!msgs) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s buffer is NULL", what);
  if (p.params.scale_dtype == GIFT_SCALE_DTYPE_F32 && reinterpret_cast<uintptr_t>(msgs) % 4) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s buffer is not 4-byte aligned (its messages hold fp32 scales)", what);
  }
  return GIFT_OK;
}

// A tensor's slice of the flat bucket as the whitener sees it: rows x (last dimension).
void apply_whitener(const giftReducePlan& p, size_t i, float* flat, bool inverse) {
  const gift::coords::Whitener& t = *p.coords.whitener[i];
  const uint64_t rows = tensor_elements(p, i) / t.dim;
  float* w = flat + p.bucket.offset[i];
  const int threads = gift::thread_count(&p.ctx);
  inverse ? gift::coords::unwhiten(t, w, rows, threads) : gift::coords::whiten(t, w, rows, threads);
}

void apply_coords(const giftReducePlan& p, float* flat, bool inverse) {
  for (size_t i = 0; i < p.coords.in_gift.size(); ++i) {
    if (p.coords.in_gift[i]) apply_whitener(p, i, flat, inverse);
  }
}

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

// The ranges set_coords drops for a new choice of coordinates (which may run out of memory:
// taken before the plan changes).
Ranges changed_ranges(const giftReducePlan& p, const gift::transport::PlanCoords& coords,
                      const std::vector<uint8_t>& in_gift, bool new_whiteners) {
  if (p.shard_residual.empty()) return {};
  return coords.changed_ranges(p.bucket, p.layout, p.rank, in_gift, new_whiteners);
}

// Applies a new choice of coordinates, which cannot fail: the reduced shard's residual in the
// `changed` ranges (a tensor that changes coordinates or whiteners) no longer means anything
// and is dropped (a call's uncommitted one too).
void set_coords(giftReducePlan& p, const std::vector<uint8_t>& in_gift, const Ranges& changed) {
  for (const auto& [b, e] : changed) {
    std::fill(p.shard_residual.begin() + b, p.shard_residual.begin() + e, 0.0f);
    if (p.shard_residual_pending) std::fill(p.sum.begin() + b, p.sum.begin() + e, 0.0f);
  }
  p.coords.choose(in_gift);
}

// The tensor holding flat element `index`, for messages about non-finite inputs.
size_t tensor_of(const giftReducePlan& p, uint64_t index) {
  return size_t(std::upper_bound(p.bucket.offset.begin(), p.bucket.offset.end(), index) -
                p.bucket.offset.begin() - 1);
}

// Zeroes what an encode of `count` elements with `extra_bytes` of extra data leaves unwritten in
// a message: the padding after its scales and after its codes (shorter shards leave more), and
// after the extra data. The rest is written whole, so messages hold no stale bytes without a
// pass over all of them first (a message is larger than the cache: that pass cost a write of
// every line and a read of it back as the encode wrote it again).
void zero_unwritten(const gift::transport::Layout& l, const giftQuantParams& params, uint64_t count,
                    uint64_t extra_bytes, uint8_t* msg) {
  const uint64_t scale_bytes =
      (count + params.block - 1) / params.block * gift::scale_size(params.scale_dtype);
  memset(msg + l.scales_at + scale_bytes, 0, l.codes_at - l.scales_at - scale_bytes);
  memset(msg + l.codes_at + count, 0, l.extra_at - l.codes_at - count);
  memset(msg + l.extra_at + extra_bytes, 0, l.message_bytes - l.extra_at - extra_bytes);
}

// The non-finite values a step refuses (GIFT_NONFINITE_ERROR), over all the messages it
// encodes: how many, and the first's place in the bucket.
struct NonFinite {
  uint64_t count = 0, first = UINT64_MAX;
  void add(uint64_t n, uint64_t at) {
    count += n;
    first = std::min(first, at);
  }
};

giftResult_t refuse(const giftReducePlan& p, uint32_t step, const NonFinite& seen) {
  const size_t t = tensor_of(p, seen.first);
  return fail(GIFT_ERROR_NONFINITE_INPUT,
              "%" PRIu64 " non-finite value(s) %s, the first at element %" PRIu64 " of tensor '%s'",
              seen.count, step == kScatter ? "in the input" : "in the reduced sum",
              seen.first - p.bucket.offset[t], p.bucket.names[t].c_str());
}

// Encodes `count` values into `msg` chunk by chunk. fill(begin, n, x, spare) gives each
// chunk's values, formed by the step's own passes while they are in cache: in x (kChunk
// floats of scratch; spare is kChunk more for its own use), or already in place at
// values + begin; it returns where they are. With `feedback`, the chunk's residual (its values
// minus their decode: what the next call adds back so that rounding errors do not accumulate)
// then goes to values + begin: in place, or from scratch through non-temporal stores (where
// values is 16-byte aligned, as the plan's buffers are), since only the next call reads it
// (plain stores would first read every line of the work buffer from memory). Kept NaN or Inf
// (GIFT_NONFINITE_KEEP) mark the message; under GIFT_NONFINITE_ERROR they are added to
// *refused, and the message is left as it is (the call fails once its caller has counted them
// all).
template <typename Fill>
giftResult_t encode_message(giftReducePlan& p, const ChunkScratch& scratch, uint32_t step,
                            int shard, float* values, uint64_t count, bool feedback, uint8_t* msg,
                            NonFinite* refused, Fill&& fill, uint32_t flags = 0,
                            const void* extra = nullptr, uint64_t extra_bytes = 0) {
  zero_unwritten(p.layout, p.params, count, extra_bytes, msg);
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
  const giftQuantParams q = encode_params(p, step, p.rank, shard);
  std::vector<giftEncodeStats>& seen = p.chunk_stats;  // one per chunk of the shard
  std::atomic<bool> out_of_memory{false};
  for_each_chunk(scratch, count, [&](uint64_t b, uint64_t n, float* x, float* spare) {
    const float* in = fill(b, n, x, spare);
    try {
      // The chunk's codes are those of an encode of the whole shard: its stochastic rounding
      // counts elements from b.
      (void)gift::encode_tensor(&kOneThread, q, in, GIFT_DTYPE_F32, 1, n,
                                msg + p.layout.codes_at + b, msg + scales_of(p, b),
                                &seen[b / kChunk], gift::BandOrigin{b, nullptr});
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
      return;
    }
    if (!feedback) return;
    float* residual = values + b;
    decode_range(p, msg, b, n, spare);
    const bool stream = in != residual && reinterpret_cast<uintptr_t>(residual) % 16 == 0;
    gift::simd::subtract(in, spare, residual, n, stream);
    if (stream) gift::simd::stream_fence();
  });
  if (out_of_memory) return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while encoding");
  uint64_t nonfinite = 0, first = UINT64_MAX;
  for (size_t c = 0; c < (count + kChunk - 1) / kChunk; ++c) {
    nonfinite += seen[c].nonfinite_count;
    if (seen[c].nonfinite_count) first = std::min(first, c * kChunk + seen[c].first_nonfinite);
  }
  if (nonfinite && p.params.nonfinite == GIFT_NONFINITE_ERROR) {
    refused->add(nonfinite, p.layout.shard_begin[shard] + first);
    return GIFT_OK;
  }
  if (nonfinite) h.flags |= kHoldsNonFinite;
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
  if (h.magic == gift::transport::kAbandonedMagic) {
    return fail(GIFT_ERROR_REMOTE,
                "rank %d abandoned call %" PRIu64 " before %s (its own error says why)", sender,
                h.call, step_name(step));
  }
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
  // Estimates go to rank 0 in step 1 and its decision comes back in step 3, in the space that
  // AUTO plans keep for them in every message: a flag anywhere else would have them read or
  // written past what the message holds.
  const bool auto_coords = p.config.coords == GIFT_COORDS_MODE_AUTO;
  const bool bad_estimates =
      (h.flags & kCarriesEstimates) && !(auto_coords && step == kScatter && shard == 0);
  const bool bad_decision =
      (h.flags & kCarriesDecision) && !(auto_coords && step == kGather && sender == 0);
  if (bad_estimates || bad_decision) {
    return fail(GIFT_ERROR_CORRUPT_INPUT,
                "the message from rank %d in %s carries %s this plan has no room for (do the "
                "ranks' configs differ in their coordinates?)",
                sender, step_name(step),
                bad_estimates ? "error estimates" : "a choice of coordinates");
  }
  return p.coords.check_header(h, sender, step);
}

// Whether any of the `world` messages at `msgs` holds a non-finite value.
bool holds_nonfinite(const giftReducePlan& p, const uint8_t* msgs) {
  return gift::transport::any_holds_nonfinite(msgs, p.layout.message_bytes, p.world);
}

// f(tensor, element of the tensor, element of the span, count) for the pieces of the tensors
// that hold elements [begin, begin + n) of the bucket.
template <typename F>
void for_each_piece(const giftReducePlan& p, uint64_t begin, uint64_t n, F&& f) {
  if (n == 0) return;
  const uint64_t end = begin + n;
  for (size_t i = tensor_of(p, begin), at = begin; at < end; ++i) {
    const uint64_t stop = std::min(end, p.bucket.offset[i + 1]);
    if (stop > at) f(i, at - p.bucket.offset[i], at - begin, stop - at);
    at = std::max(at, stop);
  }
}

// Elements [begin, begin + n) of the bucket from the tensors, in fp32 at dst; with `plus`,
// plus[0, n) added in the same pass (one read of both from memory, where a copy and then a sum
// took two).
void gather_span(const giftReducePlan& p, const void* const* tensors, uint64_t begin, uint64_t n,
                 float* dst, const float* plus = nullptr) {
  for_each_piece(p, begin, n, [&](size_t i, uint64_t from, uint64_t to, uint64_t count) {
    const giftDType_t t = p.bucket.dtypes[i];
    const uint8_t* src = static_cast<const uint8_t*>(tensors[i]) + from * giftDTypeSize(t);
    if (plus) return gift::simd::widen_add(src, t, plus + to, dst + to, count);
    gift::convert_elements(src, t, dst + to, GIFT_DTYPE_F32, count);
  });
}

// fp32 values of elements [begin, begin + n) of the bucket at src, out to the tensors.
void scatter_span(const giftReducePlan& p, const float* src, uint64_t begin, uint64_t n,
                  void* const* tensors) {
  for_each_piece(p, begin, n, [&](size_t i, uint64_t to, uint64_t from, uint64_t count) {
    const giftDType_t t = p.bucket.dtypes[i];
    gift::convert_elements(src + from, GIFT_DTYPE_F32,
                           static_cast<uint8_t*>(tensors[i]) + to * giftDTypeSize(t), t, count);
  });
}

giftResult_t check_plan(const giftReducePlan* p) {
  gift::clear_error();
  return p ? GIFT_OK : fail(GIFT_ERROR_INVALID_ARGUMENT, "plan is NULL");
}

gift::transport::StateLayout state_layout(const giftReducePlan& p) {
  return {p.residual.size(), p.shard_residual.size(), p.coords.in_gift.size()};
}

gift::transport::StateKey state_key(const giftReducePlan& p) {
  return gift::transport::state_key(p.world, p.rank, p.config, p.bucket);
}

}  // namespace

namespace gift::transport {

struct BasisChange {
  PlanCoords next;
  std::vector<uint8_t> in_gift;
  Ranges changed;
  bool whole = false;                   // whitening or error feedback: flat is kept
  gift::LineAlignedVector<float> flat;  // flat's buffer, where the plan has none yet

  explicit BasisChange(size_t tensors) : next(tensors) {}
};

void BasisChangeFree::operator()(BasisChange* c) const { delete c; }

giftResult_t prepare_basis(const giftReducePlan* plan, const giftBasis* basis,
                           BasisChangePtr* out) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  const giftReducePlan& p = *plan;
  try {
    BasisChangePtr c(new BasisChange(p.coords.in_gift.size()));
    // Whitening and AUTO's measurement need the whole bucket: flat, which error feedback
    // keeps anyway.
    c->whole = (basis && p.config.coords != GIFT_COORDS_MODE_EUCLIDEAN) || !p.residual.empty();
    if (c->whole && p.flat.empty()) c->flat.resize(p.bucket.offset.back());
    c->next.in_gift = p.coords.in_gift;
    c->next.hash = p.coords.hash;
    c->next.set_basis(p.bucket, p.config, basis, &c->in_gift);
    c->changed = changed_ranges(p, c->next, c->in_gift, p.coords.other_basis(basis));
    *out = std::move(c);
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY,
                "no memory for the plan's copy of the basis or its work buffer");
  }
}

void take_basis(giftReducePlan* plan, BasisChangePtr change) {
  giftReducePlan& p = *plan;
  BasisChange& c = *change;
  if (c.whole && p.flat.empty()) p.flat.swap(c.flat);
  p.coords = std::move(c.next);
  set_coords(p, c.in_gift, c.changed);
  if (!c.whole) gift::LineAlignedVector<float>().swap(p.flat);
}

}  // namespace gift::transport

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
    if (rank == 0) {  // the rank that writes them
      if (const giftResult_t rc = gift::transport::check_dump_dir(p->dump)) return rc;
    }
    p->world = world;
    p->rank = rank;
    if (const giftResult_t rc = gift::transport::read_bucket(tensors, n, &p->bucket)) return rc;
    if (rank == 0) {
      if (const giftResult_t rc = gift::transport::check_dump_names(p->dump, p->bucket)) return rc;
    }
    const uint64_t total = p->bucket.offset.back();
    if (const giftResult_t rc =
            gift::transport::make_layout(p->params, p->config, total, n, world, &p->layout))
      return rc;
    p->chunk_stats.resize((p->layout.max_shard + kChunk - 1) / kChunk);
    // The work buffers hold a call's residuals until they are committed, and the whole bucket
    // where a basis needs it (giftReducePlanSetBasis): without either, chunks are formed in
    // scratch and no buffer of the bucket's size is needed.
    if (p->config.error_feedback) {
      p->flat.resize(total);
      p->sum.resize(p->layout.max_shard);
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

// The new whiteners and what they change, made aside: a failure until the plan takes them
// leaves it in the old basis (a half-made choice could send a tensor whose whitener went to be
// whitened).
giftResult_t giftReducePlanSetBasis(giftReducePlan* plan, const giftBasis* basis) {
  gift::transport::BasisChangePtr change;
  if (const giftResult_t rc = gift::transport::prepare_basis(plan, basis, &change)) return rc;
  gift::transport::take_basis(plan, std::move(change));
  return GIFT_OK;
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
          gift::transport::save_state(l, state_key(p), p.call, p.coords, state, bytes)) {
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
          gift::transport::check_state(l, state_key(p), p.coords, state, bytes, &call)) {
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

}  // extern "C"

namespace {

giftResult_t encode_shards(giftReducePlan* plan, const void* const* tensors, uint8_t* send) {
  const gift::num::FpEnvGuard fp_env;  // residuals, sums and means in IEEE arithmetic
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  // Every call advances the call counter, failed ones too, so that ranks stay on the same
  // call number after an error on one of them (the count of calls towards the next
  // measurement moves in step 5: count_call).
  ++p.call;
  const bool measure_now = p.coords.measuring(p.config);
  p.coords.begin_call();
  p.residual_pending = p.shard_residual_pending = false;
  if (const giftResult_t rc = gift::transport::check_tensor_pointers(p.bucket, tensors)) return rc;
  if (const giftResult_t rc = check_messages(p, send, "send")) return rc;
  ChunkScratch scratch;
  if (const giftResult_t rc = make_scratch(p, &scratch)) return rc;
  // The bucket in fp32 plus the residual, which is added in original coordinates, before
  // whitening, and mapped back to them after encoding, so a change of basis or coordinates
  // between calls does not strand it.
  const bool feedback = !p.residual.empty();
  const auto gather = [&](uint64_t b, uint64_t n, float* x) {
    gather_span(p, tensors, b, n, x, feedback ? p.residual.data() + b : nullptr);
  };
  const bool whitened = p.coords.any_in_gift();
  // A measurement or whitening needs the whole bucket first; otherwise each chunk is
  // gathered just before it is encoded.
  if (measure_now || whitened) {
    for_each_chunk(scratch, p.bucket.offset.back(), [&](uint64_t b, uint64_t n, float*, float*) {
      gather(b, n, p.flat.data() + b);
    });
    // Refused values are counted here, as they are given: once whitened, one NaN is its whole
    // row's (256 counted for one, the first said to be the row's first).
    const float* v = p.flat.data();
    const uint64_t all = p.bucket.offset.back();
    if (p.params.nonfinite == GIFT_NONFINITE_ERROR &&
        gift::simd::abs_max_bits(v, GIFT_DTYPE_F32, all) >= 0x7F800000u) {
      NonFinite given;
      for (uint64_t i = 0; i < all; ++i) {
        if (!gift::transport::is_finite(v[i])) given.add(1, i);
      }
      return refuse(p, kScatter, given);
    }
  }
  if (measure_now) p.coords.measure(p.bucket, p.params, p.flat.data());
  apply_coords(p, p.flat.data(), false);
  // This call's residuals go to the work buffer (over the values they come from, where the
  // whole bucket is there), in original coordinates, until step 5 commits them.
  NonFinite refused;
  for (int r = 0; r < p.world; ++r) {
    const uint64_t begin = p.layout.shard_begin[r];
    const bool carry = measure_now && r == 0;
    const auto fill = [&](uint64_t b, uint64_t n, float* x, float*) -> const float* {
      if (measure_now || whitened) return p.flat.data() + begin + b;
      gather(begin + b, n, x);
      return x;
    };
    float* work = p.flat.empty() ? nullptr : p.flat.data() + begin;  // empty: no use for it
    if (const giftResult_t rc =
            encode_message(p, scratch, kScatter, r, work, p.shard_count(r), feedback,
                           send + uint64_t(r) * p.layout.message_bytes, &refused, fill,
                           carry ? kCarriesEstimates : 0, p.coords.estimates.data(),
                           carry ? p.coords.estimates.size() * sizeof(float) : 0)) {
      return rc;
    }
  }
  // Every shard is encoded first, so that the count is the input's.
  if (refused.count) return refuse(p, kScatter, refused);
  if (feedback) {
    apply_coords(p, p.flat.data(), true);
    p.residual_pending = true;
  }
  return GIFT_OK;
}

giftResult_t sum_shard(giftReducePlan* plan, const uint8_t* recv, uint8_t* out_msg) {
  const gift::num::FpEnvGuard fp_env;
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReducePlan& p = *plan;
  if (const giftResult_t rc = check_messages(p, recv, "recv")) return rc;
  if (const giftResult_t rc = check_messages(p, out_msg, "out_msg")) return rc;
  ChunkScratch scratch;
  if (const giftResult_t rc = make_scratch(p, &scratch)) return rc;
  const uint64_t count = p.shard_count(p.rank);
  // Rank 0 receives every rank's estimates on a measuring call (or none) and sends back the
  // decision.
  MessageHeader first;
  memcpy(&first, recv, sizeof first);
  for (int s = 0; s < p.world; ++s) {
    const uint8_t* msg = recv + uint64_t(s) * p.layout.message_bytes;
    if (const giftResult_t rc = check_message(p, kScatter, s, p.rank, msg)) return rc;
    MessageHeader h;
    memcpy(&h, msg, sizeof h);
    if ((h.flags ^ first.flags) & kCarriesEstimates) {
      return fail(GIFT_ERROR_CORRUPT_INPUT,
                  "rank %d's message in %s %s error estimates and rank 0's %s: the ranks "
                  "disagree on whether this call measures",
                  s, step_name(kScatter), h.flags & kCarriesEstimates ? "carries" : "has no",
                  first.flags & kCarriesEstimates ? "does" : "does not");
    }
  }
  // A reduced shard holds what its pieces held, whatever its own encode saw.
  uint32_t flags = holds_nonfinite(p, recv) ? kHoldsNonFinite : 0;
  std::vector<uint8_t> d;
  if (first.flags & kCarriesEstimates) {
    d = p.coords.decide(recv, p.layout.message_bytes, p.layout.extra_at, p.world);
    flags |= kCarriesDecision;
  }
  // Each chunk of the sum is formed in scratch just before it is encoded: the pieces in rank
  // order, in fp32, so every owner reduces the same way whatever the arrival order; then the
  // average and the residual. The new residual goes to the work buffer until step 5 commits
  // it.
  const bool average = p.config.op == GIFT_REDUCE_AVG, feedback = !p.shard_residual.empty();
  const float w = float(p.world);
  const auto fill = [&](uint64_t b, uint64_t n, float* sum, float* piece) -> const float* {
    decode_range(p, recv, b, n, sum);
    for (int s = 1; s < p.world; ++s) {
      decode_range(p, recv + uint64_t(s) * p.layout.message_bytes, b, n, piece);
      for (uint64_t i = 0; i < n; ++i) sum[i] += piece[i];
    }
    if (average) {
      uint32_t widest = 0;  // the largest sign-cleared quotient: Inf or NaN from 0x7F800000
      for (uint64_t i = 0; i < n; ++i) {
        sum[i] /= w;
        widest = std::max(widest, gift::num::bits_of(sum[i]) & 0x7FFFFFFFu);
      }
      if (widest >= 0x7F800000u) {
        for (uint64_t i = 0; i < n; ++i) {
          if (gift::transport::is_finite(sum[i])) continue;
          sum[i] = gift::transport::average_dividing_first(p.world, [&](int s) {
            float v;
            decode_range(p, recv + uint64_t(s) * p.layout.message_bytes, b + i, 1, &v);
            return v;
          });
        }
      }
    }
    if (feedback) {
      for (uint64_t i = 0; i < n; ++i) sum[i] += p.shard_residual[b + i];
    }
    return sum;
  };
  NonFinite refused;
  giftResult_t rc = encode_message(p, scratch, kGather, p.rank, p.sum.data(), count, feedback,
                                   out_msg, &refused, fill, flags, d.data(), d.size());
  if (rc == GIFT_OK && refused.count) rc = refuse(p, kGather, refused);
  p.shard_residual_pending = rc == GIFT_OK && feedback;
  return rc;
}

}  // namespace

extern "C" {

giftResult_t giftReduceEncodeShards(giftReducePlan* plan, const void* const* tensors,
                                    uint8_t* send) {
  return gift::without_exceptions("step 1 (encoding the shards)",
                                  [&] { return encode_shards(plan, tensors, send); });
}

giftResult_t giftReduceSumShard(giftReducePlan* plan, const uint8_t* recv, uint8_t* out_msg) {
  return gift::without_exceptions("step 3 (summing the shard)",
                                  [&] { return sum_shard(plan, recv, out_msg); });
}

giftResult_t giftReduceAbandon(const giftReducePlan* plan, uint8_t* msgs, int n) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  const giftReducePlan& p = *plan;
  if (n < 0 || n > p.world) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%d messages for a world of %d", n, p.world);
  }
  if (!msgs) return fail(GIFT_ERROR_INVALID_ARGUMENT, "msgs is NULL");
  for (int i = 0; i < n; ++i) {
    uint8_t* msg = msgs + uint64_t(i) * p.layout.message_bytes;
    memset(msg, 0, p.layout.message_bytes);
    MessageHeader h = {};
    h.magic = gift::transport::kAbandonedMagic;
    h.sender = uint32_t(p.rank);
    h.call = p.call;
    memcpy(msg, &h, sizeof h);
  }
  return GIFT_OK;
}

giftResult_t giftReduceDecodeResult(giftReducePlan* plan, const uint8_t* gathered,
                                    void* const* out_tensors) {
  return gift::without_exceptions("step 5 (decoding the result)", [&] {
    gift::transport::count_call(plan, gathered);
    ChunkScratch scratch;
    if (const giftResult_t rc =
            gift::transport::check_result(plan, gathered, out_tensors, &scratch))
      return rc;
    return gift::transport::decode_checked_result(plan, gathered, out_tensors, scratch);
  });
}

}  // extern "C"

namespace gift::transport {

uint64_t plan_calls(const giftReducePlan* plan) { return plan->call; }

void count_call(giftReducePlan* plan, const uint8_t* gathered) {
  if (check_plan(plan) != GIFT_OK) return;
  giftReducePlan& p = *plan;
  bool counts = true;  // where gathered is missing too: an error of this rank alone
  if (gathered) {
    MessageHeader h;
    for (int s = 0; s < p.world; ++s) {
      memcpy(&h, gathered + uint64_t(s) * p.layout.message_bytes, sizeof h);
      counts = counts && h.magic != gift::transport::kAbandonedMagic;
    }
    memcpy(&h, gathered, sizeof h);
    counts = counts && !((h.flags & kCarriesDecision) && holds_nonfinite(p, gathered));
  }
  p.coords.end_call(counts);
}

giftResult_t check_result(const giftReducePlan* plan, const uint8_t* gathered,
                          void* const* out_tensors, StepScratch* scratch) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  const giftReducePlan& p = *plan;
  if (const giftResult_t rc = check_tensor_pointers(p.bucket, out_tensors)) return rc;
  if (const giftResult_t rc = check_messages(p, gathered, "gathered")) return rc;
  for (int s = 0; s < p.world; ++s) {
    if (const giftResult_t rc =
            check_message(p, kGather, s, s, gathered + uint64_t(s) * p.layout.message_bytes)) {
      return rc;
    }
  }
  return make_scratch(p, scratch);
}

giftResult_t decode_checked_result(giftReducePlan* plan, const uint8_t* gathered,
                                   void* const* out_tensors, const StepScratch& scratch) {
  const gift::num::FpEnvGuard fp_env;
  giftReducePlan& p = *plan;
  const bool finite = !holds_nonfinite(p, gathered);
  // Commits the call's residuals; without a commit they are dropped (the next call writes
  // over them).
  if (finite && p.residual_pending) std::swap(p.flat, p.residual);
  if (finite && p.shard_residual_pending) std::swap(p.sum, p.shard_residual);
  p.residual_pending = p.shard_residual_pending = false;
  // Whitened tensors come back to original coordinates in the fp32 bucket; without them
  // each chunk goes straight from its message to the tensors.
  const bool whitened = p.coords.any_in_gift();
  for (int s = 0; s < p.world; ++s) {
    const uint8_t* msg = gathered + uint64_t(s) * p.layout.message_bytes;
    const uint64_t at = p.layout.shard_begin[s];
    for_each_chunk(scratch, p.shard_count(s), [&](uint64_t b, uint64_t n, float* values, float*) {
      if (whitened) return decode_range(p, msg, b, n, p.flat.data() + at + b);
      decode_range(p, msg, b, n, values);
      scatter_span(p, values, at + b, n, out_tensors);
    });
  }
  if (whitened) {
    apply_coords(p, p.flat.data(), true);
    for_each_chunk(scratch, p.bucket.offset.back(), [&](uint64_t b, uint64_t n, float*, float*) {
      scatter_span(p, p.flat.data() + b, b, n, out_tensors);
    });
  }
  // Every rank reads rank 0's decision from the same gathered bytes, so all switch together;
  // a measuring call whose result is not finite decides nothing (count_call does not count it:
  // the next call measures).
  MessageHeader zero;
  memcpy(&zero, gathered, sizeof zero);
  const bool decision = zero.flags & kCarriesDecision;
  if (decision && finite) {
    // GIFT only where this plan has a whitener: a corrupt byte (without integrity) must not
    // send a tensor without one to be whitened.
    std::vector<uint8_t> choice(gathered + p.layout.extra_at,
                                gathered + p.layout.extra_at + p.coords.in_gift.size());
    for (size_t i = 0; i < choice.size(); ++i)
      choice[i] = choice[i] && p.coords.whitener[i] ? 1 : 0;
    set_coords(p, choice, changed_ranges(p, p.coords, choice, false));
  }
  if (finite && p.rank == 0 && gift::transport::dump_due(p.dump, p.call)) {
    if (const giftResult_t rc =
            write_dump(p.dump, p.config, p.world, p.call, p.bucket, out_tensors)) {
      const std::string why = giftGetLastErrorMessage();
      return fail(rc,
                  "the call completed (its result is written and its error feedback kept) but "
                  "its dump failed: %s",
                  why.c_str());
    }
  }
  return GIFT_OK;
}

}  // namespace gift::transport
