// The compiler's own fp16 conversions: an independent reference for the library's rules
// where the compiler has _Float16 (GCC on x86, Clang from version 15). Elsewhere the tests
// that need it skip, saying why; the GCC build of CI runs them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#ifdef __FLT16_MAX__
#define GIFT_TEST_HAVE_FLOAT16 1
inline float compiler_half_value(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
inline uint16_t compiler_half_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
#else
#define GIFT_TEST_HAVE_FLOAT16 0
inline float compiler_half_value(uint16_t) { return 0.0f; }
inline uint16_t compiler_half_bits(float) { return 0; }
#endif

#define GIFT_SKIP_WITHOUT_FLOAT16() \
  if (!GIFT_TEST_HAVE_FLOAT16) GTEST_SKIP() << "this compiler has no _Float16 to compare with"
