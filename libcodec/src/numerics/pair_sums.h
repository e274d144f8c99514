// The sums behind the error metrics (FORMAT.md 1.11) in vector code, dispatched at run time
// (Google Highway) and the same doubles on every instruction set.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gift::simd {

// Over the pairs (ref[i], approx[i]) with both finite, with r = ref[i], x = approx[i] and
// e = x - r in double: the sums of e^2, r^2, x^2, r x and e, the largest |e|, and how many
// pairs hold a NaN or an Inf (left out of everything else).
struct PairSums {
  double err_sq = 0, ref_sq = 0, approx_sq = 0, dot = 0, err = 0;
  double max_abs = 0;
  uint64_t left_out = 0;
};

// Pairs per chunk: the unit of pair_sums' order.
constexpr size_t kPairChunk = 4096;

// The sums of the n pairs, in a fixed order whatever the vector width and the threads:
// chunks of kPairChunk pairs from the first (the last may be short); in each, every sum kept
// in eight lanes, pair k of the chunk added to lane k mod 8 in turn, and the lanes folded as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); the chunks' folded sums added to the
// totals in chunk order. Each product and sum is one double operation rounded to nearest
// even; the caller holds the standard floating-point environment (num::FpEnvGuard). Long
// spans are shared among the default threads (thread_count), chunk by chunk.
PairSums pair_sums(const float* ref, const float* approx, size_t n);

}  // namespace gift::simd
