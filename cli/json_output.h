// giftc's JSON output: its numbers and its text.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

// Prints a document whose array under top-level `key` is given element by element, as they
// come, the same bytes as json_text of the whole: a command need not hold a document of every
// tensor (200,000 tensors took 600 MB as one). The document's keys before `key` are set
// before, those after it before end(). Printed only when `on`.
class StreamedArray {
 public:
  StreamedArray(nlohmann::ordered_json& doc, const std::string& key, bool on)
      : doc_(doc), key_(key), on_(on) {
    if (!on_) return;
    doc_[key_] = kMark;
    std::fputs(part(true).c_str(), stdout);
  }
  // An element, indented as the whole document's dump indents one two levels deep.
  void add(const nlohmann::ordered_json& j) {
    if (!on_) return;
    std::string item = json_text(j);
    for (size_t nl = item.find('\n'); nl != std::string::npos; nl = item.find('\n', nl + 1))
      item.insert(nl + 1, "    ");
    std::printf("%s    %s", count_++ ? ",\n" : "[\n", item.c_str());
  }
  void end() {
    if (!on_) return;
    std::fputs(count_ ? "\n  ]" : "[]", stdout);
    std::printf("%s\n", part(false).c_str());
  }

 private:
  static constexpr const char* kMark = "elements go here";
  // The document's text before the array, or after it: around the mark, found as the value
  // of the top-level key on a line of its own (a name or value holding the mark has its line
  // breaks escaped).
  std::string part(bool before) const {
    const std::string text = json_text(doc_);
    const std::string at_key = "\n  " + nlohmann::ordered_json(key_).dump() + ": ";
    const size_t at = text.find(at_key + '"' + kMark + '"') + at_key.size();
    return before ? text.substr(0, at) : text.substr(at + std::strlen(kMark) + 2);
  }
  nlohmann::ordered_json& doc_;
  std::string key_;
  bool on_;
  uint64_t count_ = 0;
};

}  // namespace giftc
