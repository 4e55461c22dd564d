// The Split pre-tokenizer patterns of Hugging Face tokenizer.json files,
// implemented by hand. The cl100k pattern (LLaMA-3; Qwen2 differs only in
// taking one digit at a time) is
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// and each alternative is tried in that order at every position, as the regex
// engine does (leftmost, first alternative that matches, greedy with
// backtracking worked out by hand in the comments below).
#include <array>

#include "lib/core/error.h"
#include "lib/data/bpe.h"
#include "lib/data/hf_tokenizer.h"
#include "lib/data/unicode_class.h"

#include <filesystem>

namespace ds::data {

namespace {

constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kCl100kRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Char {
  uint32_t cp = 0;
  int len = 0;  // 0 past the end
  CharClass cls = CharClass::Other;
};

Char char_at(std::string_view s, size_t i) {
  Char c;
  if (i >= s.size()) return c;
  c.len = utf8_decode(s, i, &c.cp);
  c.cls = char_class(c.cp);
  return c;
}

bool is_newline(const Char& c) { return c.len && (c.cp == '\r' || c.cp == '\n'); }

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i] == '\'': its length, else 0.
size_t contraction_ci(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char c1 = lower(s[i + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char c2 = lower(s[i + 2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// End of the run of class c starting at i, taking at most max_chars characters.
size_t class_run(std::string_view s, size_t i, CharClass c, int max_chars = 1 << 30) {
  for (int n = 0; n < max_chars; ++n) {
    const Char ch = char_at(s, i);
    if (!ch.len || ch.cls != c) break;
    i += ch.len;
  }
  return i;
}

// Length of the cl100k match at s[i]; max_digits is 3 (cl100k) or 1 (Qwen2).
size_t cl100k_match(std::string_view s, size_t i, int max_digits) {
  if (size_t m = contraction_ci(s, i)) return m;
  const Char c = char_at(s, i);
  const Char c2 = char_at(s, i + c.len);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == CharClass::Letter) return class_run(s, i, CharClass::Letter) - i;
  if (c.cls != CharClass::Number && !is_newline(c) && c2.cls == CharClass::Letter && c2.len)
    return class_run(s, i + c.len, CharClass::Letter) - i;
  // \p{N}{1,3}
  if (c.cls == CharClass::Number) return class_run(s, i, CharClass::Number, max_digits) - i;
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = i;
  if (c.cp == ' ' && c2.len && c2.cls == CharClass::Other) j += 1;
  if (char_at(s, j).cls == CharClass::Other && char_at(s, j).len) {
    j = class_run(s, j, CharClass::Other);
    while (is_newline(char_at(s, j))) ++j;
    return j - i;
  }
  // c is white space from here on. \s*[\r\n]+: up to the last \r or \n of the
  // white-space run (\s* backs off to it; [\r\n]+ then takes that one, the
  // run continuing with other spaces).
  const size_t run = class_run(s, i, CharClass::Space);
  size_t last_nl = std::string_view::npos;
  for (size_t k = i; k < run; k += char_at(s, k).len)
    if (is_newline(char_at(s, k))) last_nl = k;
  if (last_nl != std::string_view::npos) return last_nl + 1 - i;
  // \s+(?!\S): the whole run at the end of the text, else all but its last
  // character when that leaves one; \s+ otherwise (a single character).
  if (run == s.size()) return run - i;
  size_t last = i;
  for (size_t k = i; k < run; k += char_at(s, k).len) last = k;
  return last > i ? last - i : run - i;
}

}  // namespace

SplitPattern parse_split_pattern(std::string_view regex, const std::string& where) {
  if (regex == kGpt2Regex) return SplitPattern::Gpt2;
  if (regex == kCl100kRegex) return SplitPattern::Cl100k;
  if (regex == kQwen2Regex) return SplitPattern::Qwen2;
  DS_USER_ERROR("{}: the Split pre-tokenizer pattern ({} bytes) is not one we implement (the GPT-2, LLaMA-3/cl100k "
                "and Qwen2 patterns are)", where, regex.size());
}

const char* split_pattern_regex(SplitPattern p) {
  return p == SplitPattern::Gpt2 ? kGpt2Regex : p == SplitPattern::Cl100k ? kCl100kRegex : kQwen2Regex;
}

void split_by_pattern(SplitPattern p, std::string_view text, std::vector<std::string_view>& out) {
  if (p == SplitPattern::Gpt2) return pretokenize(text, out);
  const int max_digits = p == SplitPattern::Cl100k ? 3 : 1;
  for (size_t i = 0; i < text.size();) {
    size_t m = cl100k_match(text, i, max_digits);
    if (m == 0) m = static_cast<size_t>(char_at(text, i).len);  // cannot happen: every class matches
    out.push_back(text.substr(i, m));
    i += m;
  }
}

std::string hf_tokenizer_json_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return (std::filesystem::path(path) / "tokenizer.json").string();
  return path;
}

}  // namespace ds::data
