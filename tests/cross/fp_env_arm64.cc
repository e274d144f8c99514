// FpEnvGuard on Arm64, run under QEMU's user mode (tests/CMakeLists.txt): a caller's
// flush-to-zero, round-toward-zero and alternative half precision hold outside the guard, IEEE
// arithmetic (subnormals, round to nearest even, fp16 Inf) inside it, and the caller's FPCR
// again after it. Built alone and statically: the Arm64 libraries of libgift's dependencies are
// not installed. QEMU 7.2's processor lacks FEAT_AFP (its FPCR bits 0-2 read as 0), so the
// clearing of FIZ, AH and NEP is not exercised here.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "numerics/fp_env.h"

namespace {

uint64_t fpcr() {
  uint64_t v;
  asm volatile("mrs %0, fpcr" : "=r"(v) : : "memory");
  return v;
}

void set_fpcr(uint64_t v) { asm volatile("msr fpcr, %0" : : "r"(v) : "memory"); }

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// volatile: the products are made at run time, under the FPCR of the moment.
volatile float g_tiny = 0x1p-140f;  // subnormal
volatile float g_one = 1.0f;
volatile float g_above = 0x1.8p-24f;    // 1 + this: past the midpoint, RN rounds up, RZ down
volatile double g_tiny_d = 0x1p-1070;   // subnormal double
volatile uint16_t g_half_inf = 0x7C00;  // fp16 +Inf; 65536 in the alternative format

struct Products {
  float tiny, sum, half_inf;
  double tiny_d;
};

// fp16 widened by the instruction set's conversion, which FPCR.AHP governs.
float widened_half(uint16_t h) {
  __fp16 x;
  std::memcpy(&x, &h, sizeof x);
  return float(x);
}

Products products() {
  return {g_tiny * g_one, g_one + g_above, widened_half(g_half_inf), g_tiny_d * double(g_one)};
}

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  const uint64_t saved = fpcr();
  // AHP (bit 26), default NaN (25), FZ (24), round toward zero (bits 22-23 = 11), FZ16 (19).
  constexpr uint64_t kSet = (1u << 26) | (1u << 25) | (1u << 24) | (3u << 22) | (1u << 19);
  const uint64_t caller = saved | kSet;
  set_fpcr(caller);
  const Products outside = products();
  Products inside;
  uint64_t during;
  {
    const gift::num::FpEnvGuard guard;
    during = fpcr();
    inside = products();
  }
  const uint64_t after = fpcr();
  const Products again = products();
  set_fpcr(saved);

  // The caller's mode does change the arithmetic here, or the rest would prove nothing.
  expect(bits(outside.tiny) == 0, "flush-to-zero flushes a subnormal product (the set-up)");
  expect(bits(outside.sum) == 0x3F800000u, "round toward zero truncates 1 + 1.5 * 2^-24");
  expect(outside.half_inf == 65536.0f, "the alternative half precision reads 0x7C00 as 65536");
  expect(bits(inside.tiny) == bits(0x1p-140f), "inside the guard, a subnormal product is kept");
  expect(inside.tiny_d == 0x1p-1070, "inside the guard, a subnormal double product is kept");
  expect(bits(inside.sum) == 0x3F800001u, "inside the guard, 1 + 1.5 * 2^-24 rounds to nearest");
  expect(bits(inside.half_inf) == 0x7F800000u, "inside the guard, fp16 0x7C00 is +Inf");
  expect((during & kSet) == 0, "the guard clears AHP, DN, FZ, RMode and FZ16");
  expect(after == caller, "the caller's FPCR is restored");
  expect(bits(again.tiny) == 0, "after the guard, the caller's flush-to-zero holds again");
  if (failures == 0) std::printf("fp_env_arm64: passed\n");
  return failures == 0 ? 0 : 1;
}
