// For the Arm64 run of the vector kernels' tests (aarch64_simd_tests.py), built for Highway's
// static target alone: the functions of libhwy's run time that the tests and the kernels call
// (no Arm64 libhwy is installed), and the library's thread count, whose own definition
// (api/codec.cc) would bring the rest of libgift with it.
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>

#include "common/ctx.h"

namespace hwy {

// The one target compiled; forcing a target in a test (SetSupportedTargetsForTest) or limiting
// the targets (DisableTargets, from simd::limit_targets) is then a no-op: the tests run on that
// target every time.
int64_t SupportedTargets() { return HWY_STATIC_TARGET; }
void SetSupportedTargetsForTest(int64_t) {}
void DisableTargets(int64_t) {}

}  // namespace hwy

// OpenMP's default team, at most the processors: gift::thread_count without a context, less
// its cgroup quota, nesting and thread-limit rules, which these tests do not reach.
int gift::thread_count(const giftCtx*) {
  return std::min(omp_get_max_threads(), omp_get_num_procs());
}
