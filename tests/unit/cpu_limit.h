// For tests that limit the CPU codec's instruction set (giftCpuLimitTarget): lifts the limit
// as it goes out of scope, so that a failed assertion leaves none for the tests after it.
#pragma once

#include "gift/gift.h"

struct CpuLimitLifted {
  CpuLimitLifted() = default;
  CpuLimitLifted(const CpuLimitLifted&) = delete;
  CpuLimitLifted& operator=(const CpuLimitLifted&) = delete;
  ~CpuLimitLifted() { giftCpuLimitTarget(nullptr); }
};
