// How a 128-bit id (a basis id) is written in messages and by giftc: 32 hex digits, high
// half first; where the id may be none (all zero), "none".
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

inline std::string id_or_none(uint64_t lo, uint64_t hi) {
  return lo || hi ? id_hex(lo, hi) : "none";
}

}  // namespace gift
