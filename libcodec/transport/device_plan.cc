// The local steps of the compressed all-reduce on a CUDA device (gift_transport_cuda.h): the
// CPU plan's steps (reduce_plan.cc) over the same layout (transport/message.h), with the
// device codec (gift_cuda.h) for every encode and decode and kernels/reduce.h for the rest,
// all enqueued on the caller's stream. GIFT coordinates and saved states follow the CPU
// plan's rules (transport/plan_coords.h); the whitener runs on the device in the CPU's
// per-element order (kernels/whitener.h, whiten_exact), so the messages stay the CPU plan's.
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common/error.h"
#include "gift/gift_cuda.h"
#include "gift/gift_transport_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/reduce.h"
#include "kernels/whitener.h"
#include "transport/config.h"
#include "transport/message.h"
#include "transport/plan_coords.h"

using gift::fail;
namespace tr = gift::transport;
namespace kn = gift::kernels;

struct giftReduceDevicePlan {
  giftAllReduceConfig config;
  giftQuantParams params;
  int world = 1;
  int rank = 0;
  uint64_t call = 0;
  tr::BucketShape bucket;
  tr::Layout layout;

  // GIFT coordinates: the rules and the host's record of the choice (plan_coords.h), the
  // device copies of the whiteners, and whether the current call measures (AUTO).
  tr::PlanCoords coords;
  std::vector<std::unique_ptr<kn::DeviceWhitener>> whitener;
  bool measuring = false;
  std::vector<float> host_flat;     // a measuring call's input, for the estimates
  std::vector<uint8_t> host_extra;  // the estimates or the decision read back from messages

  std::vector<void*> allocations;
  // A call's residuals wait in the work buffers until step 5 copies them over the plan's, if
  // the result is finite (as on the CPU, which swaps instead: the device decides without the
  // host): flat holds this call's encode residual from step 1, sum the reduced shard's from
  // step 3, each while its flag is set.
  float* flat = nullptr;            // the bucket in fp32 plus the residual
  float* residual = nullptr;        // error feedback of this rank's encode, over the bucket
  float* sum = nullptr;             // this rank's shard: the sum being reduced
  float* shard_residual = nullptr;  // error feedback of the reduced shard's encode
  bool residual_pending = false;
  bool shard_residual_pending = false;
  uint64_t* shard_begin = nullptr;   // layout.shard_begin, for the header kernels
  giftEncodeStats* stats = nullptr;  // world scatter encodes, then the gather encode
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
  kn::ReduceRecord* record = nullptr;
  cudaEvent_t done = nullptr;  // the end of the last step enqueued

  giftReduceDevicePlan() = default;
  giftReduceDevicePlan(const giftReduceDevicePlan&) = delete;
  giftReduceDevicePlan& operator=(const giftReduceDevicePlan&) = delete;
  ~giftReduceDevicePlan() {
    for (void* a : allocations) cudaFree(a);
    if (done) cudaEventDestroy(done);
  }

  // Zeroed device memory for n elements of T (zero residuals; never-written message padding
  // and empty shards' statistics stay zero).
  template <typename T>
  giftResult_t alloc(uint64_t n, T** out) {
    void* p = nullptr;
    const uint64_t bytes = n ? n * sizeof(T) : 1;
    GIFT_CUDA_TRY(cudaMalloc(&p, bytes));
    allocations.push_back(p);
    GIFT_CUDA_TRY(cudaMemset(p, 0, bytes));
    *out = static_cast<T*>(p);
    return GIFT_OK;
  }

  uint64_t count(int shard) const { return layout.shard_count(shard); }
  uint64_t scale_capacity() const { return layout.codes_at - layout.scales_at; }
  bool e8m0() const { return params.scale_dtype == GIFT_SCALE_DTYPE_E8M0; }
  uint64_t extra_bytes() const { return layout.message_bytes - layout.extra_at; }
  uint64_t elements(size_t i) const { return bucket.offset[i + 1] - bucket.offset[i]; }
  // One tensor without error feedback or basis is encoded straight from the caller's buffer:
  // the encoder widens bf16 and fp16 exactly as the fp32 copy would.
  bool direct() const {
    return bucket.dtypes.size() == 1 && !config.error_feedback && !coords.has_basis;
  }
};

namespace {

size_t dtype_size(giftDType_t t) { return t == GIFT_DTYPE_F32 ? 4 : 2; }

giftResult_t check_plan(const giftReduceDevicePlan* p) {
  gift::clear_error();
  return p ? GIFT_OK : fail(GIFT_ERROR_INVALID_ARGUMENT, "plan is NULL");
}

// Message buffers hold 8-byte header fields and fp32 scales, and are read 16 bytes at a time.
giftResult_t check_messages(const void* msgs, const char* what) {
  if (!msgs) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s buffer is NULL", what);
  if (reinterpret_cast<uintptr_t>(msgs) % 16 != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s buffer is not 16-byte aligned", what);
  }
  return GIFT_OK;
}

tr::MessageHeader header(const giftReduceDevicePlan& p, uint32_t step, uint32_t flags = 0) {
  tr::MessageHeader h{};
  h.magic = tr::kMessageMagic;
  h.step = step;
  h.sender = uint32_t(p.rank);
  h.call = p.call;
  p.coords.fill_header(&h);
  h.flags = flags;
  return h;
}

// Whitens (or unwhitens) the tensors in GIFT coordinates in the fp32 bucket `flat`.
giftResult_t apply_coords(const giftReduceDevicePlan& p, float* flat, bool inverse,
                          cudaStream_t stream) {
  for (size_t i = 0; i < p.coords.in_gift.size(); ++i) {
    if (!p.coords.in_gift[i]) continue;
    const kn::DeviceWhitener& t = *p.whitener[i];
    float* w = flat + p.bucket.offset[i];
    const uint64_t rows = p.elements(i) / t.dim();
    if (const giftResult_t rc =
            inverse ? t.unwhiten_exact(w, rows, stream) : t.whiten_exact(w, rows, stream)) {
      return rc;
    }
  }
  return GIFT_OK;
}

// Zeroes the extra space (estimates, decision) of n messages, which the CPU plan writes as
// zeros on every call that does not carry them.
giftResult_t clear_extra(const giftReduceDevicePlan& p, uint8_t* msgs, int n, cudaStream_t stream) {
  if (p.extra_bytes() == 0 || n == 0) return GIFT_OK;
  GIFT_CUDA_TRY(cudaMemset2DAsync(msgs + p.layout.extra_at, p.layout.message_bytes, 0,
                                  p.extra_bytes(), size_t(n), stream));
  return GIFT_OK;
}

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

// The ranges set_coords drops for a new choice of coordinates (which may run out of memory:
// taken before the plan changes).
Ranges changed_ranges(const giftReduceDevicePlan& p, const tr::PlanCoords& coords,
                      const std::vector<uint8_t>& in_gift, bool new_whiteners) {
  if (!p.shard_residual) return {};
  return coords.changed_ranges(p.bucket, p.layout, p.rank, in_gift, new_whiteners);
}

// Applies a new choice of coordinates, dropping the reduced residual in the `changed` ranges
// (a tensor that changes coordinates or whiteners; enqueued on `stream`).
giftResult_t set_coords(giftReduceDevicePlan& p, const std::vector<uint8_t>& in_gift,
                        const Ranges& changed, cudaStream_t stream) {
  // Chosen first, so that the choice matches the whiteners even if a reset below fails.
  p.coords.choose(in_gift);
  for (const auto& [b, e] : changed) {
    GIFT_CUDA_TRY(cudaMemsetAsync(p.shard_residual + b, 0, (e - b) * sizeof(float), stream));
    // A call's uncommitted one too.
    if (p.shard_residual_pending) {
      GIFT_CUDA_TRY(cudaMemsetAsync(p.sum + b, 0, (e - b) * sizeof(float), stream));
    }
  }
  return GIFT_OK;
}

// Waits for the plan's enqueued steps (before host calls that change or read its state).
giftResult_t wait(const giftReduceDevicePlan& p) {
  GIFT_CUDA_TRY(cudaEventSynchronize(p.done));
  return GIFT_OK;
}

tr::StateLayout state_layout(const giftReduceDevicePlan& p) {
  const uint64_t ef = p.config.error_feedback ? 1 : 0;
  return {ef * p.bucket.offset.back(), ef * p.layout.max_shard, p.bucket.dtypes.size()};
}

// Encodes `count` values at `values` (dtype) as shard `shard` into the message at `msg` and,
// with `residual`, leaves there what the encode lost (values are then the fp32 buffer).
giftResult_t encode_message(giftReduceDevicePlan& p, uint32_t step, int shard, const void* values,
                            giftDType_t dtype, uint64_t count, float* residual,
                            giftEncodeStats* stats, uint8_t* msg, cudaStream_t stream) {
  if (count == 0) return GIFT_OK;
  const giftQuantParams q =
      tr::encode_params(p.params, p.config, p.call, step, p.world, p.rank, shard);
  uint8_t* codes = msg + p.layout.codes_at;
  uint8_t* scales = msg + p.layout.scales_at;
  if (const giftResult_t rc =
          giftEncodeDevice(&q, values, dtype, 1, count, codes, scales, p.scale_capacity(), stats,
                           p.workspace, p.workspace_bytes, stream)) {
    return rc;
  }
  if (!residual) return GIFT_OK;
  return kn::encode_residual(codes, scales, p.e8m0(), p.params.kind, p.params.block,
                             static_cast<const float*>(values), residual, count, stream);
}

// After a step's encodes (n statistics, for the n messages at msgs, summed from `pieces` or
// NULL): the messages that hold a non-finite value say so, and under GIFT_NONFINITE_ERROR the
// record counts them for the status query.
giftResult_t note_nonfinite(giftReduceDevicePlan& p, uint32_t step, const giftEncodeStats* stats,
                            int n, uint8_t* msgs, const uint8_t* pieces, cudaStream_t stream) {
  if (const giftResult_t rc =
          kn::mark_nonfinite(stats, n, msgs, p.layout.message_bytes, pieces, p.world, stream)) {
    return rc;
  }
  if (p.params.nonfinite == GIFT_NONFINITE_KEEP) return GIFT_OK;
  return kn::record_nonfinite(stats, n, p.call, step, p.record, stream);
}

// A step's end on its stream: the plan's `done` event is recorded there however the step
// returns, so that waits (status, SetBasis, SaveState, LoadState) also cover the work a
// failed step enqueued before it failed.
class StepEnd {
 public:
  StepEnd(giftReduceDevicePlan& p, cudaStream_t stream) : p_(p), stream_(stream) {}
  StepEnd(const StepEnd&) = delete;
  StepEnd& operator=(const StepEnd&) = delete;
  ~StepEnd() {
    if (!recorded_) (void)cudaEventRecord(p_.done, stream_);  // the step's own error wins
  }
  giftResult_t finish() {
    recorded_ = true;
    GIFT_CUDA_TRY(cudaEventRecord(p_.done, stream_));
    return GIFT_OK;
  }

 private:
  giftReduceDevicePlan& p_;
  cudaStream_t stream_;
  bool recorded_ = false;
};

giftResult_t create(const giftAllReduceConfig* config, int world, int rank,
                    const giftBucketTensor* tensors, size_t n, giftReduceDevicePlan& p) {
  if (const giftResult_t rc = tr::read_device_config(config, &p.config)) return rc;
  p.params = tr::quant_params(p.config);
  if (const giftResult_t rc = giftQuantParamsValidate(&p.params)) return rc;
  p.world = world;
  p.rank = rank;
  if (const giftResult_t rc = tr::read_bucket(tensors, n, &p.bucket)) return rc;
  const uint64_t total = p.bucket.offset.back();
  if (const giftResult_t rc = tr::make_layout(p.params, p.config, total, n, world, &p.layout))
    return rc;
  if (const giftResult_t rc =
          giftEncodeDeviceWorkspaceSize(&p.params, 1, p.layout.max_shard, &p.workspace_bytes)) {
    return rc;
  }
  const uint64_t max_shard = p.layout.max_shard;
  giftResult_t rc = GIFT_OK;
  if (!p.direct()) rc = p.alloc(total, &p.flat);
  if (!rc && p.config.error_feedback) rc = p.alloc(total, &p.residual);
  if (!rc && p.config.error_feedback) rc = p.alloc(max_shard, &p.shard_residual);
  if (!rc) rc = p.alloc(max_shard, &p.sum);
  if (!rc) rc = p.alloc(uint64_t(world) + 1, &p.shard_begin);
  if (!rc) rc = p.alloc(uint64_t(world) + 1, &p.stats);
  if (!rc)
    rc = p.alloc(p.workspace_bytes, static_cast<uint8_t**>(static_cast<void*>(&p.workspace)));
  if (!rc) rc = p.alloc(1, &p.record);
  if (rc) return rc;
  GIFT_CUDA_TRY(cudaMemcpy(p.shard_begin, p.layout.shard_begin.data(),
                           p.layout.shard_begin.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
  GIFT_CUDA_TRY(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
  GIFT_CUDA_TRY(cudaEventRecord(p.done, nullptr));
  p.coords = tr::PlanCoords(n);
  p.whitener.resize(n);
  return GIFT_OK;
}

giftResult_t encode_shards(giftReduceDevicePlan* plan, const void* const* tensors, uint8_t* send,
                           cudaStream_t stream) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  StepEnd end(p, stream);
  // Every call advances the counter, failed ones too, as on the CPU.
  ++p.call;
  p.residual_pending = p.shard_residual_pending = false;
  if (const giftResult_t rc = tr::check_tensor_pointers(p.bucket, tensors)) return rc;
  if (const giftResult_t rc = check_messages(send, "send")) return rc;
  const void* src = p.flat;
  giftDType_t dtype = GIFT_DTYPE_F32;
  if (p.direct()) {
    src = tensors[0];
    dtype = p.bucket.dtypes[0];
  } else {
    for (size_t i = 0; i < p.bucket.dtypes.size(); ++i) {
      const uint64_t at = p.bucket.offset[i];
      if (const giftResult_t rc =
              kn::to_fp32(tensors[i], p.bucket.dtypes[i], p.bucket.offset[i + 1] - at,
                          p.residual ? p.residual + at : nullptr, p.flat + at, stream)) {
        return rc;
      }
    }
  }
  // As on the CPU: a measuring call estimates on the input in original coordinates (read
  // back to the host, where the CPU plan's estimator runs), then whitens.
  p.measuring = p.coords.measuring(p.config);
  if (p.measuring) {
    p.host_flat.resize(p.bucket.offset.back());
    GIFT_CUDA_TRY(cudaMemcpyAsync(p.host_flat.data(), p.flat, p.host_flat.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
    GIFT_CUDA_TRY(cudaStreamSynchronize(stream));
    p.coords.measure(p.bucket, p.params, p.host_flat.data());
  }
  p.coords.begin_call();
  if (!p.direct()) {
    if (const giftResult_t rc = apply_coords(p, p.flat, false, stream)) return rc;
  }
  const uint64_t m = p.layout.message_bytes;
  // Message 0 (to rank 0) carries this rank's estimates on a measuring call.
  const uint32_t flags0 = p.measuring ? tr::kCarriesEstimates : 0;
  if (const giftResult_t rc = kn::write_headers(send, m, 1, header(p, tr::kScatter, flags0), 0, 1,
                                                p.shard_begin, stream)) {
    return rc;
  }
  if (p.world > 1) {
    if (const giftResult_t rc = kn::write_headers(send + m, m, p.world - 1, header(p, tr::kScatter),
                                                  1, 1, p.shard_begin, stream)) {
      return rc;
    }
  }
  if (const giftResult_t rc = clear_extra(p, send, p.world, stream)) return rc;
  if (p.measuring) {
    GIFT_CUDA_TRY(cudaMemcpyAsync(send + p.layout.extra_at, p.coords.estimates.data(),
                                  p.coords.estimates.size() * sizeof(float), cudaMemcpyHostToDevice,
                                  stream));
  }
  for (int r = 0; r < p.world; ++r) {
    const uint64_t begin = p.layout.shard_begin[r];
    const void* values = static_cast<const char*>(src) + begin * dtype_size(dtype);
    // The residual replaces the values in flat (with error feedback, src is flat).
    if (const giftResult_t rc = encode_message(p, tr::kScatter, r, values, dtype, p.count(r),
                                               p.residual ? p.flat + begin : nullptr, p.stats + r,
                                               send + uint64_t(r) * m, stream)) {
      return rc;
    }
  }
  // The residual goes back to original coordinates, as on the CPU.
  if (p.residual) {
    if (const giftResult_t rc = apply_coords(p, p.flat, true, stream)) return rc;
  }
  if (const giftResult_t rc =
          note_nonfinite(p, tr::kScatter, p.stats, p.world, send, nullptr, stream)) {
    return rc;
  }
  p.residual_pending = p.residual != nullptr;
  return end.finish();
}

giftResult_t sum_shard(giftReduceDevicePlan* plan, const uint8_t* recv, uint8_t* out_msg,
                       cudaStream_t stream) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  StepEnd end(p, stream);
  if (const giftResult_t rc = check_messages(recv, "recv")) return rc;
  if (const giftResult_t rc = check_messages(out_msg, "out_msg")) return rc;
  const uint64_t m = p.layout.message_bytes;
  if (const giftResult_t rc =
          kn::check_headers(recv, m, p.world, p.rank, tr::kScatter, p.call, p.shard_begin,
                            header(p, tr::kScatter), p.record, stream)) {
    return rc;
  }
  const uint64_t count = p.count(p.rank);
  kn::SumShardArgs a;
  a.in = {recv, m, p.layout.scales_at, p.layout.codes_at};
  a.world = p.world;
  a.count = count;
  a.block = p.params.block;
  a.e8m0 = p.e8m0();
  a.kind = p.params.kind;
  a.average = p.config.op == GIFT_REDUCE_AVG;
  a.residual = p.shard_residual;
  a.sum = p.sum;
  if (const giftResult_t rc = kn::sum_shard(a, stream)) return rc;
  // Rank 0 of a measuring call reads every rank's estimates back (message 0, its own, says
  // whether they came), decides as the CPU plan does, and sends the decision to all.
  uint32_t flags = 0;
  std::vector<uint8_t> decision;
  if (p.measuring && p.rank == 0) {
    tr::MessageHeader first;
    p.host_extra.resize(p.extra_bytes() * uint64_t(p.world));
    GIFT_CUDA_TRY(cudaMemcpyAsync(&first, recv, sizeof first, cudaMemcpyDeviceToHost, stream));
    GIFT_CUDA_TRY(cudaMemcpy2DAsync(p.host_extra.data(), p.extra_bytes(), recv + p.layout.extra_at,
                                    m, p.extra_bytes(), size_t(p.world), cudaMemcpyDeviceToHost,
                                    stream));
    GIFT_CUDA_TRY(cudaStreamSynchronize(stream));
    if (first.flags & tr::kCarriesEstimates) {
      decision = p.coords.decide(p.host_extra.data(), p.extra_bytes(), 0, p.world);
      flags = tr::kCarriesDecision;
    }
  }
  if (const giftResult_t rc = kn::write_headers(out_msg, m, 1, header(p, tr::kGather, flags),
                                                p.rank, 0, p.shard_begin, stream)) {
    return rc;
  }
  if (const giftResult_t rc = clear_extra(p, out_msg, 1, stream)) return rc;
  if (!decision.empty()) {
    // Pageable memory: the copy is staged before cudaMemcpyAsync returns.
    GIFT_CUDA_TRY(cudaMemcpyAsync(out_msg + p.layout.extra_at, decision.data(), decision.size(),
                                  cudaMemcpyHostToDevice, stream));
  }
  // The new residual replaces the sum it comes from.
  float* residual = p.shard_residual ? p.sum : nullptr;
  if (const giftResult_t rc = encode_message(p, tr::kGather, p.rank, p.sum, GIFT_DTYPE_F32, count,
                                             residual, p.stats + p.world, out_msg, stream)) {
    return rc;
  }
  if (const giftResult_t rc =
          note_nonfinite(p, tr::kGather, p.stats + p.world, 1, out_msg, recv, stream)) {
    return rc;
  }
  p.shard_residual_pending = residual != nullptr;
  return end.finish();
}

giftResult_t decode_result(giftReduceDevicePlan* plan, const uint8_t* gathered,
                           void* const* out_tensors, cudaStream_t stream) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  StepEnd end(p, stream);
  if (const giftResult_t rc = tr::check_tensor_pointers(p.bucket, out_tensors)) return rc;
  if (const giftResult_t rc = check_messages(gathered, "gathered")) return rc;
  const uint64_t m = p.layout.message_bytes;
  if (const giftResult_t rc =
          kn::check_headers(gathered, m, p.world, p.rank, tr::kGather, p.call, p.shard_begin,
                            header(p, tr::kGather), p.record, stream)) {
    return rc;
  }
  // The residuals are committed before flat receives the result (not after a message that
  // the record holds against this step: the host plan would have refused the call).
  if (p.residual_pending) {
    if (const giftResult_t rc = kn::commit_if_finite(gathered, m, p.world, p.record, p.flat,
                                                     p.residual, p.bucket.offset.back(), stream)) {
      return rc;
    }
  }
  if (p.shard_residual_pending) {
    if (const giftResult_t rc = kn::commit_if_finite(gathered, m, p.world, p.record, p.sum,
                                                     p.shard_residual, p.count(p.rank), stream)) {
      return rc;
    }
  }
  p.residual_pending = p.shard_residual_pending = false;
  // One tensor in original coordinates is decoded straight into its dtype: the decoder rounds
  // each fp32 value as the conversion from the fp32 buffer would.
  const bool direct = p.bucket.dtypes.size() == 1 && !p.coords.in_gift[0];
  void* dst = direct ? out_tensors[0] : p.flat;
  const giftDType_t dtype = direct ? p.bucket.dtypes[0] : GIFT_DTYPE_F32;
  for (int s = 0; s < p.world; ++s) {
    if (p.count(s) == 0) continue;
    const uint8_t* msg = gathered + uint64_t(s) * m;
    char* at = static_cast<char*>(dst) + p.layout.shard_begin[s] * dtype_size(dtype);
    if (const giftResult_t rc =
            giftDecodeDevice(&p.params, msg + p.layout.codes_at, msg + p.layout.scales_at,
                             p.scale_capacity(), 1, p.count(s), at, dtype, stream)) {
      return rc;
    }
  }
  if (!direct) {
    if (const giftResult_t rc = apply_coords(p, p.flat, true, stream)) return rc;
    for (size_t i = 0; i < p.bucket.dtypes.size(); ++i) {
      const uint64_t at = p.bucket.offset[i];
      if (const giftResult_t rc = kn::from_fp32(p.flat + at, p.bucket.offset[i + 1] - at,
                                                p.bucket.dtypes[i], out_tensors[i], stream)) {
        return rc;
      }
    }
  }
  // Every rank reads rank 0's decision from the same gathered bytes, so all switch together
  // (read back only on measuring calls: only those carry one), unless the result is not
  // finite, as on the CPU.
  if (p.measuring) {
    p.measuring = false;
    const size_t n = p.coords.in_gift.size();
    p.host_extra.resize(n);
    std::vector<uint32_t> flags(size_t(p.world));
    GIFT_CUDA_TRY(cudaMemcpy2DAsync(
        flags.data(), sizeof(uint32_t), gathered + offsetof(tr::MessageHeader, flags), m,
        sizeof(uint32_t), size_t(p.world), cudaMemcpyDeviceToHost, stream));
    GIFT_CUDA_TRY(cudaMemcpyAsync(p.host_extra.data(), gathered + p.layout.extra_at, n,
                                  cudaMemcpyDeviceToHost, stream));
    GIFT_CUDA_TRY(cudaStreamSynchronize(stream));
    bool finite = true;
    for (const uint32_t f : flags) finite = finite && !(f & tr::kHoldsNonFinite);
    // A measuring call whose result is not finite does not count: the next call measures.
    const bool decision = flags[0] & tr::kCarriesDecision;
    if (decision && finite) {
      const Ranges changed = changed_ranges(p, p.coords, p.host_extra, false);
      if (const giftResult_t rc = set_coords(p, p.host_extra, changed, stream)) return rc;
    }
    p.coords.end_call(!(decision && !finite));
  } else {
    p.coords.end_call(true);
  }
  return end.finish();
}

}  // namespace

extern "C" {

giftResult_t giftReduceDevicePlanCreate(const giftAllReduceConfig* config, int world, int rank,
                                        const giftBucketTensor* tensors, size_t n,
                                        giftReduceDevicePlan** plan) {
  gift::clear_error();
  if (!plan) return fail(GIFT_ERROR_INVALID_ARGUMENT, "plan is NULL");
  *plan = nullptr;
  if (world < 1 || rank < 0 || rank >= world) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "rank %d of world %d", rank, world);
  }
  try {
    auto p = std::make_unique<giftReduceDevicePlan>();
    if (const giftResult_t rc = create(config, world, rank, tensors, n, *p)) return rc;
    *plan = p.release();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a device reduce plan");
  }
}

void giftReduceDevicePlanDestroy(giftReduceDevicePlan* plan) { delete plan; }

uint64_t giftReduceDevicePlanMessageBytes(const giftReduceDevicePlan* plan) {
  return plan ? plan->layout.message_bytes : 0;
}

giftResult_t giftReduceDevicePlanSetBasis(giftReduceDevicePlan* plan, const giftBasis* basis) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  try {
    if (const giftResult_t rc = wait(p)) return rc;
    tr::PlanCoords next(p.coords.in_gift.size());
    next.in_gift = p.coords.in_gift;
    next.hash = p.coords.hash;
    const bool new_whiteners = p.coords.other_basis(basis);
    std::vector<uint8_t> in_gift;
    next.set_basis(p.bucket, p.config, basis, &in_gift);
    const Ranges changed = changed_ranges(p, next, in_gift, new_whiteners);
    std::vector<std::unique_ptr<kn::DeviceWhitener>> w(next.whitener.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (!next.whitener[i]) continue;
      w[i] = std::make_unique<kn::DeviceWhitener>();
      if (const giftResult_t rc = w[i]->upload(*next.whitener[i])) return rc;
    }
    if (basis && !p.flat) {
      if (const giftResult_t rc = p.alloc(p.bucket.offset.back(), &p.flat)) return rc;
    }
    // Nothing of the plan changed before this point: a failure leaves the old basis in place.
    p.coords = std::move(next);
    p.whitener = std::move(w);
    p.measuring = false;
    if (const giftResult_t rc = set_coords(p, in_gift, changed, nullptr)) return rc;
    // The uploads and the residual's reset complete before any stream's next step.
    GIFT_CUDA_TRY(cudaDeviceSynchronize());
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for the plan's copy of the basis");
  }
}

giftResult_t giftReduceDevicePlanCoords(const giftReduceDevicePlan* plan, giftCoords_t* coords,
                                        size_t n) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  return plan->coords.get(coords, n);
}

uint64_t giftReduceDevicePlanStateBytes(const giftReduceDevicePlan* plan) {
  return plan ? state_layout(*plan).bytes() : 0;
}

giftResult_t giftReduceDevicePlanSaveState(const giftReduceDevicePlan* plan, void* state,
                                           uint64_t bytes) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  const giftReduceDevicePlan& p = *plan;
  const tr::StateLayout l = state_layout(p);
  const tr::StateKey key = tr::state_key(p.world, p.rank, p.config, p.bucket);
  if (const giftResult_t rc = tr::save_state(l, key, p.call, p.coords, state, bytes)) {
    return rc;
  }
  if (const giftResult_t rc = wait(p)) return rc;
  uint8_t* out = static_cast<uint8_t*>(state);
  if (l.residual_count) {
    GIFT_CUDA_TRY(cudaMemcpy(out + l.residual_at(), p.residual, l.residual_count * sizeof(float),
                             cudaMemcpyDeviceToHost));
  }
  if (l.shard_residual_count) {
    GIFT_CUDA_TRY(cudaMemcpy(out + l.shard_residual_at(), p.shard_residual,
                             l.shard_residual_count * sizeof(float), cudaMemcpyDeviceToHost));
  }
  return GIFT_OK;
}

giftResult_t giftReduceDevicePlanLoadState(giftReduceDevicePlan* plan, const void* state,
                                           uint64_t bytes) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  const tr::StateLayout l = state_layout(p);
  const tr::StateKey key = tr::state_key(p.world, p.rank, p.config, p.bucket);
  uint64_t call = 0;
  if (const giftResult_t rc = tr::check_state(l, key, p.coords, state, bytes, &call)) {
    return rc;
  }
  if (const giftResult_t rc = wait(p)) return rc;
  const uint8_t* in = static_cast<const uint8_t*>(state);
  if (l.residual_count) {
    GIFT_CUDA_TRY(cudaMemcpy(p.residual, in + l.residual_at(), l.residual_count * sizeof(float),
                             cudaMemcpyHostToDevice));
  }
  if (l.shard_residual_count) {
    GIFT_CUDA_TRY(cudaMemcpy(p.shard_residual, in + l.shard_residual_at(),
                             l.shard_residual_count * sizeof(float), cudaMemcpyHostToDevice));
  }
  // A pageable upload may still be in flight when cudaMemcpy returns.
  GIFT_CUDA_TRY(cudaDeviceSynchronize());
  p.call = call;
  p.measuring = false;
  p.residual_pending = p.shard_residual_pending = false;
  tr::load_state_coords(l, state, &p.coords);
  return GIFT_OK;
}

giftResult_t giftReduceEncodeShardsDevice(giftReduceDevicePlan* plan, const void* const* tensors,
                                          uint8_t* send, cudaStream_t stream) {
  return gift::without_exceptions("step 1 (encoding the shards)",
                                  [&] { return encode_shards(plan, tensors, send, stream); });
}

giftResult_t giftReduceSumShardDevice(giftReduceDevicePlan* plan, const uint8_t* recv,
                                      uint8_t* out_msg, cudaStream_t stream) {
  return gift::without_exceptions("step 3 (summing the shard)",
                                  [&] { return sum_shard(plan, recv, out_msg, stream); });
}

giftResult_t giftReduceDecodeResultDevice(giftReduceDevicePlan* plan, const uint8_t* gathered,
                                          void* const* out_tensors, cudaStream_t stream) {
  return gift::without_exceptions("step 5 (decoding the result)", [&] {
    return decode_result(plan, gathered, out_tensors, stream);
  });
}

giftResult_t giftReduceDevicePlanStatus(giftReduceDevicePlan* plan) {
  if (const giftResult_t rc = check_plan(plan)) return rc;
  giftReduceDevicePlan& p = *plan;
  if (const giftResult_t rc = wait(p)) return rc;
  kn::ReduceRecord r;
  GIFT_CUDA_TRY(cudaMemcpy(&r, p.record, sizeof r, cudaMemcpyDeviceToHost));
  GIFT_CUDA_TRY(cudaMemset(p.record, 0, sizeof r));
  if (r.bad_messages) {
    return fail(GIFT_ERROR_CORRUPT_INPUT,
                "%llu received message(s) were not this rank's shard of their call; the first "
                "came from rank %u in %s of call %llu",
                r.bad_messages, r.bad_sender,
                r.bad_step == tr::kScatter ? "the all-to-all of shards"
                                           : "the all-gather of reduced shards",
                r.bad_call);
  }
  if (r.bad_basis) {
    if (const giftResult_t rc =
            p.coords.check_header(r.bad_basis_header, int(r.bad_basis_sender), r.bad_basis_step)) {
      return rc;
    }
    return fail(GIFT_ERROR_BASIS_MISSING,
                "%llu received message(s) were in another basis or coordinates than this rank's "
                "at the time; the first came from rank %u in %s of call %llu",
                r.bad_basis, r.bad_basis_sender, tr::step_name(r.bad_basis_step), r.bad_basis_call);
  }
  if (r.nonfinite) {
    return fail(GIFT_ERROR_NONFINITE_INPUT,
                "%llu non-finite value(s) encoded on the device, the first in call %llu %s",
                r.nonfinite, r.nonfinite_call,
                r.nonfinite_step == tr::kScatter ? "in the input" : "in the reduced sum");
  }
  return GIFT_OK;
}

}  // extern "C"
