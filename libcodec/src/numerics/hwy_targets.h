// The Highway targets that the dispatching kernels (numerics/simd.cc, numerics/pair_sums.cc,
// coords/low_rank_update.cc) are compiled for: every target but the scalable ones (SVE, RVV).
// The kernels keep vectors in arrays and members (four widened vectors for StoreCodes4, a
// band's accumulators, the metrics' lanes), which sizeless vector types cannot form; machines with
// scalable vectors take their fixed-width target (NEON on Arm64). Include this before any Highway
// header.
#pragma once

#ifdef HWY_DISABLED_TARGETS
#error "numerics/hwy_targets.h sets HWY_DISABLED_TARGETS"
#endif
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
