// The message layout and the encode parameters of the compressed all-reduce, shared by the
// CPU local steps (reduce_plan.cc) and the device ones (device_plan.cc, kernels/reduce.cu) so
// that both write the same bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gift/gift_transport.h"
#include "numerics/hd.h"

namespace gift::transport {

// Every message starts with this header (little-endian hosts only, as the rest of libgift).
// The call number, step, sender and shard let a receiver reject a stale or misrouted
// message even with integrity checks off.
struct MessageHeader {
  uint64_t checksum;  // XXH3-64 of bytes [8, message bytes); 0 with integrity off
  uint32_t magic;
  uint32_t step;  // kScatter or kGather
  uint32_t sender;
  uint32_t shard;
  uint64_t call;
  uint64_t count;        // elements of the shard
  uint8_t basis_id[16];  // the plan's basis; zero: none (every tensor Euclidean)
  uint32_t coords_hash;  // which tensors are in GIFT coordinates; zero: none of them
  uint32_t flags;        // kCarriesEstimates / kCarriesDecision / kHoldsNonFinite
};
static_assert(sizeof(MessageHeader) == 64, "header keeps the payload 64-byte aligned");

constexpr uint32_t kMessageMagic = 0x52544647u;  // "GFTR"
// In place of kMessageMagic: the sender abandoned the call (giftReduceAbandon).
constexpr uint32_t kAbandonedMagic = 0x58544647u;  // "GFTX"
constexpr uint32_t kScatter = 0;
constexpr uint32_t kGather = 1;
constexpr uint64_t kAlign = 64;
// Message 0 of a measuring call carries the sender's estimates (two floats per tensor) to
// rank 0; rank 0's reduced message then carries the decision (one byte per tensor) to all.
constexpr uint32_t kCarriesEstimates = 1;
constexpr uint32_t kCarriesDecision = 2;
// The message's codes hold NaN or Inf (GIFT_NONFINITE_KEEP): on a reduced message, the
// call's result is not finite and the call commits no state (giftReduceDecodeResult).
constexpr uint32_t kHoldsNonFinite = 4;

// Whether any of the n messages at msgs (stride message_bytes) holds a non-finite value: the
// rule by which a reduced message inherits the flag and step 5 commits, on hosts and devices.
GIFT_HD bool any_holds_nonfinite(const uint8_t* msgs, uint64_t message_bytes, int n) {
  for (int s = 0; s < n; ++s) {
    uint32_t flags;
    memcpy(&flags, msgs + uint64_t(s) * message_bytes + offsetof(MessageHeader, flags),
           sizeof flags);
    if (flags & kHoldsNonFinite) return true;
  }
  return false;
}

// GIFT_REDUCE_AVG takes an element's sum in rank order divided by world, except where that
// quotient is not finite: there the average is each rank's value divided by world, summed in
// rank order (this function; value(r) is rank r's decoded value). Values near FLT_MAX overflow
// a sum whose average is finite, and an Inf beside such values is what dividing first gives
// (their sum is Inf + -Inf: NaN); NaN stays NaN. Elsewhere the sum divided once rounds once
// fewer, and gives the bytes earlier versions gave. The same rule on hosts and devices.
template <class Value>
GIFT_HD float average_dividing_first(int world, const Value& value) {
  const float w = float(world);
  float a = value(0) / w;
  for (int r = 1; r < world; ++r) a += value(r) / w;
  return a;
}

// Whether x is neither Inf nor NaN (for both of them, x - x is NaN).
GIFT_HD bool is_finite(float x) { return x - x == 0.0f; }

inline uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// Where a bucket of `total` elements puts its shards and a message its parts.
struct Layout {
  std::vector<uint64_t> shard_begin;  // shard r is flat[shard_begin[r], shard_begin[r+1])
  uint64_t max_shard = 0;
  uint64_t scales_at = 0, codes_at = 0, extra_at = 0, message_bytes = 0;

  uint64_t shard_count(int r) const { return shard_begin[r + 1] - shard_begin[r]; }
};

// params: the plan's block-scale parameters (for the scale bytes of the largest shard).
// Measured coordinates (GIFT_COORDS_MODE_AUTO) exchange estimates for each of the bucket's
// `tensors`: their space is part of every message, so that the size is fixed at creation.
inline giftResult_t make_layout(const giftQuantParams& params, const giftAllReduceConfig& config,
                                uint64_t total, size_t tensors, int world, Layout* out) {
  Layout& l = *out;
  const uint64_t blocks = (total + params.block - 1) / params.block;
  const uint64_t w = uint64_t(world);
  l.shard_begin.resize(w + 1);
  for (uint64_t r = 0; r <= w; ++r) {
    l.shard_begin[r] = std::min(total, blocks * r / w * params.block);
  }
  for (uint64_t r = 0; r < w; ++r) l.max_shard = std::max(l.max_shard, l.shard_count(int(r)));
  uint64_t scale_bytes = 0;
  if (const giftResult_t rc = giftScaleBytes(&params, 1, l.max_shard, &scale_bytes)) return rc;
  l.scales_at = sizeof(MessageHeader);
  l.codes_at = l.scales_at + round_up(scale_bytes, kAlign);
  l.extra_at = l.codes_at + round_up(l.max_shard, kAlign);
  const uint64_t extra = config.coords == GIFT_COORDS_MODE_AUTO ? 8 * uint64_t(tensors) : 0;
  l.message_bytes = l.extra_at + round_up(extra, kAlign);
  return GIFT_OK;
}

// Stochastic rounding draws fresh bits for every call, sender and shard (and for the second
// encode of a shard), so no two encodes of a run share their random numbers. The encode's
// index among a call's 2 * world^2 takes 64 bits past 46,340 ranks: its low 32 bits are the
// codec's tensor_index, its high ones go into the seed (zero below that world, where the bytes
// are those of the 32-bit index, which wrapped beyond it: step 1 drew step 0's bits).
inline giftQuantParams encode_params(const giftQuantParams& params, const giftAllReduceConfig& c,
                                     uint64_t call, uint32_t step, int world, int sender,
                                     int shard) {
  const uint64_t w = uint64_t(world);
  const uint64_t index = (uint64_t(step) * w + uint64_t(sender)) * w + uint64_t(shard);
  giftQuantParams q = params;
  q.seed = c.seed ^ (call * 0x9E3779B97F4A7C15ull) ^ ((index >> 32) * 0xC2B2AE3D27D4EB4Full);
  q.tensor_index = uint32_t(index);
  return q;
}

}  // namespace gift::transport
