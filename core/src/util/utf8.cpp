#include "util/utf8.h"

#include <cstdio>

namespace normlab::util {

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) lo = 0xA0;  // no overlongs
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) lo = 0x90;  // no overlongs
      if (c == 0xF4) hi = 0x8F;  // ≤ U+10FFFF
    } else {
      return i;  // continuation byte without a lead, C0/C1 overlong leads, F5..FF
    }
    if (i + extra >= n) return i;  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      unsigned b = p[i + k];
      unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) return i;
    }
    i += extra + 1;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view text, size_t max_bytes) {
  std::string shown;
  for (unsigned char c : text.substr(0, max_bytes)) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    shown += (c >= 0x20 && c < 0x7f) ? std::string(1, char(c)) : std::string(hex);
  }
  if (text.size() > max_bytes) shown += "...";
  return shown;
}

}  // namespace normlab::util
