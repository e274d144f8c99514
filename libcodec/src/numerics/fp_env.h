// The numerics assume IEEE arithmetic as FORMAT.md states it: round to nearest even, with
// subnormals. A caller may run with flush-to-zero, denormals-are-zero or another rounding
// mode (fast-math startup code, torch.set_flush_denormal), which would change FP8 codes.
// Every thread that computes codes or decoded values holds one of these guards: it sets the
// standard environment and restores the caller's on exit.
#pragma once

#if defined(__SSE2__)
#include <xmmintrin.h>
#else
#include <cfenv>
#endif

namespace gift::num {

class FpEnvGuard {
 public:
#if defined(__SSE2__)
  // MXCSR: FTZ is bit 15, DAZ bit 6, the rounding control bits 13-14 (00 = nearest).
  FpEnvGuard() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(0x8000u | 0x0040u | 0x6000u)); }
  ~FpEnvGuard() { _mm_setcsr(saved_); }
#else
  FpEnvGuard() : saved_(unsigned(std::fegetround())) { std::fesetround(FE_TONEAREST); }
  ~FpEnvGuard() { std::fesetround(int(saved_)); }
#endif
  FpEnvGuard(const FpEnvGuard&) = delete;
  FpEnvGuard& operator=(const FpEnvGuard&) = delete;

 private:
  unsigned saved_;
};

}  // namespace gift::num
