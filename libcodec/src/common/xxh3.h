// XXH3 (libxxhash) for every hash the library takes: through libxxhash's run-time dispatch
// where the library has one (x86: its AVX2 or AVX-512 code on CPUs that have them, 45 GB/s
// on one core of the development machine, where the plain functions, its SSE2 baseline, gave
// 5 to 18 GB/s). The hashes are the same either way.
#pragma once

#include <xxhash.h>

#ifdef GIFT_XXH3_DISPATCH
#include <xxh_x86dispatch.h>
#endif
