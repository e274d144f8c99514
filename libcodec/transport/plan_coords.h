// What the CPU plan (reduce_plan.cc) and the device plan (device_plan.cc) share beyond the
// message layout: the rules of GIFT coordinates (which tensors are eligible, when to measure,
// how rank 0 decides, what a message's basis fields say and how a mismatch is reported) and
// the bytes of a saved state. Each rule is written here once, so that the two plans send the
// same messages and save states that load into either.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "coords/basis.h"
#include "coords/whitener.h"
#include "gift/gift_transport.h"
#include "transport/config.h"
#include "transport/message.h"

namespace gift::transport {

inline const char* step_name(uint32_t step) {
  return step == kScatter ? "the all-to-all of shards" : "the all-gather of reduced shards";
}

// A plan's GIFT coordinates: its copy of the basis's whiteners for its tensors (null where a
// tensor is not eligible), which tensors are whitened now, and calls since the basis came.
struct PlanCoords {
  bool has_basis = false;
  coords::BasisId basis_id;
  std::vector<std::unique_ptr<coords::Whitener>> whitener;
  std::vector<uint8_t> in_gift;
  uint32_t hash = 0;
  // Calls with the present basis that count towards the next measurement: a call counts once
  // it reaches step 5 (end_call), unless a rank abandoned it or it measured and its result is
  // not finite, which every rank reads from the same gathered bytes: such a measuring call is
  // measured again by the next call on every rank, and the ranks stay in step where step 5
  // then fails on one of them alone.
  uint64_t calls_with_basis = 0;
  bool call_counts = false;      // the call in flight began with the present basis
  std::vector<float> estimates;  // 2 per tensor: this rank's, or the sum over ranks

  explicit PlanCoords(size_t tensors = 0);

  // Takes `basis` (NULL: none): copies the whiteners of the eligible tensors (2-D or more, the
  // last dimension the whitener's width, not empty) and returns in *in_gift the coordinates
  // the tensors start in (GIFT for eligible ones in GIFT mode, Euclidean until measured in
  // AUTO mode). The caller applies the choice with choose() after dropping what changes.
  void set_basis(const BucketShape& bucket, const giftAllReduceConfig& config,
                 const giftBasis* basis, std::vector<uint8_t>* in_gift);

  // Whether `basis` (NULL: none) is another than the present one: its whiteners differ.
  bool other_basis(const giftBasis* basis) const;
  // The ranges [begin, end) of this rank's reduced shard (relative to the shard's start)
  // that belong to tensors whose coordinates `in_gift` changes, or with new_whiteners that are
  // whitened now (by the old basis's whiteners): their reduced residual no longer means
  // anything and is dropped.
  std::vector<std::pair<uint64_t, uint64_t>> changed_ranges(const BucketShape& bucket,
                                                            const Layout& layout, int rank,
                                                            const std::vector<uint8_t>& in_gift,
                                                            bool new_whiteners) const;
  // Applies a choice of coordinates (after changed_ranges).
  void choose(const std::vector<uint8_t>& in_gift);
  // Whether some tensor travels in GIFT coordinates now.
  bool any_in_gift() const;
  // The coordinates of the n tensors (giftReducePlanCoords and its device form).
  giftResult_t get(giftCoords_t* coords, size_t n) const;

  // Whether this call measures (AUTO: the first call with a basis and every reselect_every).
  bool measuring(const giftAllReduceConfig& config) const;
  // Step 1 of a call, and its step 5 reached: the call counts, or not (`counts`).
  void begin_call() { call_counts = has_basis; }
  void end_call(bool counts) {
    if (call_counts && counts) ++calls_with_basis;
    call_counts = false;
  }
  // This rank's estimates of each eligible tensor's round-trip error in both coordinates, on
  // the bucket's fp32 values `flat` in original coordinates (NaN where not eligible).
  void measure(const BucketShape& bucket, const giftQuantParams& params, const float* flat);
  // Rank 0: the estimates of the `world` messages at msgs (stride message_bytes, estimates at
  // extra_at) summed in rank order, then the decision: GIFT where it lowers the sum of the
  // ranks' estimated errors by the selection margin (one byte per tensor).
  std::vector<uint8_t> decide(const uint8_t* msgs, uint64_t message_bytes, uint64_t extra_at,
                              int world);

  // The basis id and coordinates hash every message of the plan carries.
  void fill_header(MessageHeader* h) const;
  // GIFT_ERROR_BASIS_MISSING naming the sender when a received header is in another basis or
  // chose other tensors for GIFT coordinates; GIFT_OK otherwise.
  giftResult_t check_header(const MessageHeader& h, int sender, uint32_t step) const;
};

// A saved state: this header, the error-feedback residual of this rank's encode (over the
// bucket, in original coordinates), that of the reduced shard (in the flat bucket's
// coordinates), then one byte per tensor (1: in GIFT coordinates). Little-endian, fp32.
// The fingerprint covers what decides the meaning of the residuals (layout and numerics),
// so a state never loads into a plan it does not fit; the choice of coordinates follows
// the residuals, and only into a plan holding the same basis.
struct StateHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t fingerprint;
  uint64_t call;
  uint64_t residual_count;
  uint64_t shard_residual_count;
  uint64_t calls_with_basis;
  uint64_t basis_lo, basis_hi;  // zero: none
};

// Where each part of a plan's state lies in its bytes.
struct StateLayout {
  uint64_t residual_count = 0, shard_residual_count = 0, tensors = 0;
  uint64_t residual_at() const { return sizeof(StateHeader); }
  uint64_t shard_residual_at() const { return residual_at() + residual_count * sizeof(float); }
  uint64_t coords_at() const { return shard_residual_at() + shard_residual_count * sizeof(float); }
  uint64_t bytes() const { return coords_at() + tensors; }
};

// What a saved state must have been saved from, as its header's fingerprint: version 3 (the
// one written) covers the config (its coordinates mode too), world, rank and the tensors'
// offsets, dtypes and shapes. States saved before it still load: version 2 did not cover the
// coordinates mode, so that a state of a GIFT-mode plan, its reduced residual in whitened
// coordinates, loaded into a Euclidean one; version 1 did not cover the shapes either, so that
// a state loaded into a plan of other shapes with the same element counts.
struct StateKey {
  uint64_t v1, v2, v3;
};
StateKey state_key(int world, int rank, const giftAllReduceConfig& config,
                   const BucketShape& bucket);

// Checks the buffer and writes the header and the coordinates; the caller copies the
// residuals to their places.
giftResult_t save_state(const StateLayout& l, const StateKey& key, uint64_t call,
                        const PlanCoords& c, void* state, uint64_t bytes);

// Checks that `state` fits the plan (INVALID_ARGUMENT) and its basis (BASIS_MISSING); on
// success *call receives the saved call counter. Nothing of the plan changes.
giftResult_t check_state(const StateLayout& l, const StateKey& key, const PlanCoords& c,
                         const void* state, uint64_t bytes, uint64_t* call);
// Takes the saved coordinates (after check_state; the caller copies the residuals).
void load_state_coords(const StateLayout& l, const void* state, PlanCoords* c);

}  // namespace gift::transport
