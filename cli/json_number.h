// Numbers in giftc's JSON output. JSON has no infinity or NaN, which nlohmann writes as null,
// the same as a value not measured: an infinite value is the string "inf" (or "-inf"), NaN
// null.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>

namespace giftc {

inline nlohmann::ordered_json json_number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

}  // namespace giftc
