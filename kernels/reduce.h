// Kernels of the compressed all-reduce on CUDA devices (transport/device_plan.cc): the
// fused decode-and-sum of a shard's `world` pieces, the error-feedback residual, the bucket's
// fp32 view, message headers and the device-side record of what the data held. Each
// launcher enqueues on `stream` and returns GIFT_ERROR_DEVICE on a launch error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gift/gift.h"
#include "transport/message.h"

namespace gift::kernels {

// What the device saw, cleared by the plan's status query. The first call, step and sender
// of each kind of problem are those of the event that found its count at zero.
struct ReduceRecord {
  unsigned long long nonfinite;  // non-finite values encoded
  unsigned long long nonfinite_call;
  unsigned int nonfinite_step;
  unsigned int bad_sender;
  unsigned long long bad_messages;  // received messages that were not this call's shard
  unsigned long long bad_call;
  unsigned int bad_step;
  // Received messages of this call's shard in another basis or choice of coordinates, and
  // the first one's header (the plan reports it as the CPU plan does).
  unsigned int bad_basis_sender;
  unsigned long long bad_basis;
  unsigned long long bad_basis_call;
  unsigned int bad_basis_step;
  transport::MessageHeader bad_basis_header;
};

// The messages of one exchange: message i at msgs + i * message_bytes (16-byte aligned), its
// scales at scales_at and codes at codes_at (transport/message.h).
struct Messages {
  const uint8_t* msgs;
  uint64_t message_bytes, scales_at, codes_at;
};

struct SumShardArgs {
  Messages in;  // the `world` pieces of the shard, in rank order
  int world;
  uint64_t count;  // elements of the shard
  uint32_t block;  // power of two >= 16
  bool e8m0;       // scale dtype
  giftFp8Kind_t kind;
  bool average;           // divide the sum by world (GIFT_REDUCE_AVG)
  const float* residual;  // added after the division (error feedback), or NULL
  float* sum;             // count elements out
};

// sum[i] = (piece_0[i] + piece_1[i] + ... + piece_{world-1}[i]) [/ world] [+ residual[i]] in
// fp32, left to right, each piece decoded as giftDecode does: the CPU plan's arithmetic.
giftResult_t sum_shard(const SumShardArgs& a, cudaStream_t stream);

// residual[i] = values[i] - decoded[i] for the count codes and block scales at `codes` and
// `scales`: what an encode lost, carried into the next call.
giftResult_t encode_residual(const uint8_t* codes, const void* scales, bool e8m0,
                             giftFp8Kind_t kind, uint32_t block, const float* values,
                             float* residual, uint64_t count, cudaStream_t stream);

// dst[i] = fp32(src[i]) [+ residual[i]] (dst may not overlap src).
giftResult_t to_fp32(const void* src, giftDType_t dtype, uint64_t count, const float* residual,
                     float* dst, cudaStream_t stream);

// dst[i] = src[i] rounded to dtype (bf16 or fp16; fp32 is a copy).
giftResult_t from_fp32(const float* src, uint64_t count, giftDType_t dtype, void* dst,
                       cudaStream_t stream);

// Writes the header of n messages at msgs (stride message_bytes): `h` with, for message i,
// shard = shard0 + i * shard_step and count the size of that shard in shard_begin (device
// array of world + 1 offsets).
giftResult_t write_headers(uint8_t* msgs, uint64_t message_bytes, int n,
                           const transport::MessageHeader& h, int shard0, int shard_step,
                           const uint64_t* shard_begin, cudaStream_t stream);

// Checks the headers of the `world` messages received at `step` of call `call` by `rank`:
// message s must come from s and hold shard `rank` (all-to-all) or s (all-gather) of this
// call (else counted in bad_messages), in the basis and coordinates of `mine` (its basis_id
// and coords_hash; else counted in bad_basis).
giftResult_t check_headers(const uint8_t* msgs, uint64_t message_bytes, int world, int rank,
                           uint32_t step, uint64_t call, const uint64_t* shard_begin,
                           const transport::MessageHeader& mine, ReduceRecord* record,
                           cudaStream_t stream);

// Adds the non-finite counts of n encodes' statistics to the record.
giftResult_t record_nonfinite(const giftEncodeStats* stats, int n, uint64_t call, uint32_t step,
                              ReduceRecord* record, cudaStream_t stream);

// Sets transport::kHoldsNonFinite in the header of message i of the n at msgs whose encode's
// statistics stats[i] counted a non-finite value, or in all n when one of the `world` pieces
// (NULL: none) they were summed from carries it: the CPU plan's header flags.
giftResult_t mark_nonfinite(const giftEncodeStats* stats, int n, uint8_t* msgs,
                            uint64_t message_bytes, const uint8_t* pieces, int world,
                            cudaStream_t stream);

// dst[i] = src[i] for count elements unless one of the `world` messages at msgs carries
// transport::kHoldsNonFinite or the record holds a received message that was not this
// call's shard or was in another basis since the last status: a call's residual becomes the
// plan's only when its result is finite and its messages were in order (dst may not overlap
// src).
giftResult_t commit_if_finite(const uint8_t* msgs, uint64_t message_bytes, int world,
                              const ReduceRecord* record, const float* src, float* dst,
                              uint64_t count, cudaStream_t stream);

}  // namespace gift::kernels
