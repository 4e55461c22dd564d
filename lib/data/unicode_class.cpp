// UTF-8 decoding and character classification for the GPT-2 pre-tokenizer.
// ASCII is decided inline; other code points by binary search in the tables of
// unicode_tables.cpp.
#include "lib/data/unicode_class.h"

#include <algorithm>

namespace ds::data {

namespace {

bool in_table(const CodeRange* t, size_t n, uint32_t cp) {
  const CodeRange* end = t + n;
  const CodeRange* it =
      std::upper_bound(t, end, cp, [](uint32_t v, const CodeRange& r) { return v < r.lo; });
  return it != t && cp <= (it - 1)->hi;
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return CharClass::Space;
    return CharClass::Other;
  }
  using namespace unicode_tables;
  if (in_table(kLetters, kNumLetters, cp)) return CharClass::Letter;
  if (in_table(kNumbers, kNumNumbers, cp)) return CharClass::Number;
  if (in_table(kSpaces, kNumSpaces, cp)) return CharClass::Space;
  return CharClass::Other;
}

int utf8_decode(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int len = 0;
  uint32_t v = 0, min = 0;
  if ((b0 & 0xe0) == 0xc0) len = 2, v = b0 & 0x1f, min = 0x80;
  else if ((b0 & 0xf0) == 0xe0) len = 3, v = b0 & 0x0f, min = 0x800;
  else if ((b0 & 0xf8) == 0xf0) len = 4, v = b0 & 0x07, min = 0x10000;
  if (len == 0 || i + len > s.size()) {
    *cp = 0xfffd;
    return 1;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0) != 0x80) {
      *cp = 0xfffd;
      return 1;
    }
    v = (v << 6) | (b & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
    *cp = 0xfffd;
    return 1;
  }
  *cp = v;
  return len;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace ds::data
