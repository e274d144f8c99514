// giftc's JSON output: its numbers and its text.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace giftc {

// JSON has no infinity or NaN, which nlohmann writes as null, the same as a value not
// measured: an infinite value is the string "inf" (or "-inf"), NaN null.
inline nlohmann::ordered_json json_number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// The document as text, a string that is not UTF-8 (a file's name) with U+FFFD in place of
// its bad bytes: nlohmann refuses to write it otherwise, and the command printed no JSON.
template <typename Json>
std::string json_text(const Json& doc) {
  return doc.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace giftc
