// Work that a library giftc links would do at every start of giftc, for nothing giftc uses.
#include <hwy/nanobenchmark.h>

#include <cstdint>

// Highway's shared library (Debian's libhwy 1.0.3) calls hwy::platform::TimerResolution as it
// is loaded, to calibrate its nanobenchmark, which giftc never runs: 3.9 ms of every start on a
// Zen 4 VM (perf stat -r 50 of an empty program: 0.8 ms alone, 4.7 ms linked with -lhwy, 1.4 ms
// with this definition too). The library makes that call through its exported symbol, which a
// definition in the executable takes the place of (the dynamic linker's interposition):
// `giftc --version` went from 10.7 to 7.4 ms (perf stat -r 30). The header's declaration keeps
// the two alike; a libhwy without the call leaves this unused.
namespace hwy::platform {
uint64_t TimerResolution() { return 1; }
}  // namespace hwy::platform
