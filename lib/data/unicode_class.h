// Unicode helpers for the byte-level BPE: UTF-8 decoding that never fails (an
// invalid byte decodes as U+FFFD and consumes one byte) and the letter / number /
// space classification the GPT-2 pre-tokenizer regex needs (\p{L}, \p{N}, \s).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds::data {

struct CodeRange {
  uint32_t lo, hi;  // inclusive
};

enum class CharClass : uint8_t { Letter, Number, Space, Other };

CharClass char_class(uint32_t cp);

// Decodes the code point starting at s[i]; returns its byte length (1..4).
// Overlong forms, surrogates and truncated sequences decode as U+FFFD, length 1.
int utf8_decode(std::string_view s, size_t i, uint32_t* cp);

// Appends the UTF-8 encoding of cp.
void utf8_append(std::string& out, uint32_t cp);

namespace unicode_tables {
extern const CodeRange kLetters[];
extern const CodeRange kNumbers[];
extern const CodeRange kSpaces[];
extern const size_t kNumLetters, kNumNumbers, kNumSpaces;
}  // namespace unicode_tables

}  // namespace ds::data
