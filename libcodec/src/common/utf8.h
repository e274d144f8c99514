// The rule for every string the library reads from or writes into a file: well-formed UTF-8
// without NUL, since names and metadata reach callers as C strings and JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gift {

// Bytes of the well-formed UTF-8 sequence that starts at s[i] (shortest form, no surrogate,
// at most U+10FFFF), or 0 where none does.
inline size_t utf8_sequence_length(const std::string& s, size_t i) {
  const uint8_t c = uint8_t(s[i]);
  const size_t len = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) {
    const uint8_t d = uint8_t(s[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3Fu);
  }
  const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  return cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : len;
}

inline bool valid_utf8_c_string(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0 || s[i] == 0) return false;
    i += len;
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
