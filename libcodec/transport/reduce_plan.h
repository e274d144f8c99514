// What the communicators (comm.cc) reach of a plan beyond gift_transport.h.
#pragma once

#include <cstdint>
#include <memory>

#include "gift/gift_transport.h"

namespace gift::transport {

// Two spans of fp32 scratch for each of a plan's threads, for one step's chunked passes:
// allocated as the step starts, before it changes anything (plans hold no memory for it).
struct StepScratch {
  int threads = 1;
  std::unique_ptr<float[]> floats;
};

// The plan's call counter (advanced by every giftReduceEncodeShards): ranks compare it before
// a call, so that a plan left behind by an error is named instead of sending messages of
// another call.
uint64_t plan_calls(const giftReducePlan* plan);

// Step 5 reached with `gathered`: the call counts towards the next measurement, unless a rank
// abandoned it or it measured and its result is not finite (PlanCoords::calls_with_basis).
// First in step 5, before anything that can fail on this rank alone.
void count_call(giftReducePlan* plan, const uint8_t* gathered);

// The rest of giftReduceDecodeResult in two parts, so that a communicator can agree over the ranks
// that every rank's checks passed before any rank commits the call's state: check_result checks
// what step 5 reads (the output pointers, every gathered message's checksum and header) and
// allocates its scratch, changing nothing of the plan; decode_checked_result then writes the
// tensors and commits, and fails only for a dump, after it committed.
giftResult_t check_result(const giftReducePlan* plan, const uint8_t* gathered,
                          void* const* out_tensors, StepScratch* scratch);
giftResult_t decode_checked_result(giftReducePlan* plan, const uint8_t* gathered,
                                   void* const* out_tensors, const StepScratch& scratch);

// A plan's move to another basis in two parts, so that a communicator moves all of its plans
// on every rank or none (giftCommSetBasis): prepare_basis makes aside what may run out of
// memory (the plan's copy of the whiteners, what they change, the work buffer) and changes
// nothing of the plan; take_basis applies it, and cannot fail.
struct BasisChange;
struct BasisChangeFree {
  void operator()(BasisChange* c) const;
};
using BasisChangePtr = std::unique_ptr<BasisChange, BasisChangeFree>;
giftResult_t prepare_basis(const giftReducePlan* plan, const giftBasis* basis, BasisChangePtr* out);
void take_basis(giftReducePlan* plan, BasisChangePtr change);

}  // namespace gift::transport
