// For the Arm64 run of the vector kernels' tests (aarch64_simd_tests.py), built for Highway's
// static target alone: the two functions of libhwy's run time that the tests call (no Arm64
// libhwy is installed), and the library's thread count, whose own definition (api/codec.cc)
// would bring the rest of libgift with it.
#include <hwy/targets.h>
#include <omp.h>

#include "common/ctx.h"

namespace hwy {

// The one target compiled; forcing a target in a test (SetSupportedTargetsForTest) is then
// a no-op: the tests run on that target every time.
int64_t SupportedTargets() { return HWY_STATIC_TARGET; }
void SetSupportedTargetsForTest(int64_t) {}

}  // namespace hwy

// OpenMP's default team, as gift::thread_count gives it without a context.
int gift::thread_count(const giftCtx*) { return omp_get_max_threads(); }
