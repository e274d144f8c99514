// The rule for every string the library reads from or writes into a file: well-formed UTF-8
// without NUL, since names and metadata reach callers as C strings and JSON.
#pragma once

#include <cstdint>
#include <string>

namespace gift {

inline bool valid_utf8_c_string(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const int len = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    if (c == 0 || len == 0 || i + size_t(len) > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const uint8_t d = uint8_t(s[i + size_t(k)]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};  // shortest form only
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(len);
  }
  return true;
}

// For messages about a string that failed the rule: printable ASCII kept, other bytes \xNN.
inline std::string ascii_escaped(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const uint8_t c = uint8_t(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += ch;
    } else {
      const char* hex = "0123456789abcdef";
      out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
    }
  }
  return out;
}

}  // namespace gift
