// How a 128-bit id (a basis id) is written in messages and by giftc: 32 hex digits, high
// half first.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gift {

inline std::string id_hex(uint64_t lo, uint64_t hi) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, hi, lo);
  return buf;
}

}  // namespace gift
