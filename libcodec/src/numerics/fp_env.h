// The numerics assume IEEE arithmetic as FORMAT.md states it: round to nearest even, with
// subnormals. A caller may run with flush-to-zero, denormals-are-zero or another rounding
// mode (fast-math startup code, torch.set_flush_denormal), which would change FP8 codes.
// Every thread that computes codes or decoded values holds one of these guards: it sets the
// standard environment and restores the caller's on exit. The compiler orders the mode's writes
// with memory accesses only, not with arithmetic on values held in registers (for _mm_setcsr as
// for the Arm64 asm below): what a guard covers reads its inputs from memory and writes its
// results there, as every kernel and loop that holds one does.
#pragma once

#if defined(__SSE2__)
#include <xmmintrin.h>
#elif defined(__aarch64__)
#include <cstdint>
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
#elif defined(__aarch64__)
  // FPCR: FZ is bit 24 and FZ16 bit 19 (flush-to-zero of single and double, and of half
  // precision), the rounding mode bits 22-23 (00 = nearest), DN bit 25 (default NaN), AHP bit 26
  // (the alternative half-precision format, without Inf or NaN, in which the fp16 conversions
  // would read and write); FEAT_AFP's FIZ (bit 0: flush inputs), AH (1: alternate handling) and
  // NEP (2), where they are RES0 otherwise (writing 0 there is allowed). <cfenv> reaches only
  // the rounding mode.
  FpEnvGuard() : saved_(fpcr()) {
    constexpr uint64_t kCleared =
        (1u << 26) | (1u << 25) | (1u << 24) | (3u << 22) | (1u << 19) | 7u;
    set_fpcr(saved_ & ~kCleared);
  }
  ~FpEnvGuard() { set_fpcr(saved_); }
#else
  FpEnvGuard() : saved_(unsigned(std::fegetround())) { std::fesetround(FE_TONEAREST); }
  ~FpEnvGuard() { std::fesetround(int(saved_)); }
#endif
  FpEnvGuard(const FpEnvGuard&) = delete;
  FpEnvGuard& operator=(const FpEnvGuard&) = delete;

 private:
#if defined(__aarch64__) && !defined(__SSE2__)
  static uint64_t fpcr() {
    uint64_t v;
    asm volatile("mrs %0, fpcr" : "=r"(v) : : "memory");
    return v;
  }
  static void set_fpcr(uint64_t v) { asm volatile("msr fpcr, %0" : : "r"(v) : "memory"); }
  uint64_t saved_;
#else
  unsigned saved_;
#endif
};

}  // namespace gift::num
