// Hugging Face tokenizer.json support (byte-level BPE: GPT-2, GPT-NeoX,
// LLaMA-3, Qwen2 style). The pre-tokenizer regexes that such files carry are
// recognized by their exact text and implemented by hand on the Unicode tables
// of unicode_class.h (no regex engine); any other pattern is an error naming it.
// load_hf_tokenizer (tokenizer.h) reads the file; docs/tokenizers.md lists what
// of the format is supported.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace ds::data {

enum class SplitPattern {
  Gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Cl100k,  // LLaMA-3 / cl100k: case-insensitive contractions, \p{N}{1,3}, newline runs
  Qwen2,   // as Cl100k with single digits (\p{N})
};

// The pattern whose regex text is exactly `regex`; a UserError naming `where`
// and the pattern otherwise.
SplitPattern parse_split_pattern(std::string_view regex, const std::string& where);
const char* split_pattern_regex(SplitPattern p);

// Splits `text` into the pattern's matches (views into text), appended to out.
// The patterns match every character, so the pieces concatenate to text.
void split_by_pattern(SplitPattern p, std::string_view text, std::vector<std::string_view>& out);

// The tokenizer.json inside `path` when it is a directory, else `path`.
std::string hf_tokenizer_json_path(const std::string& path);

}  // namespace ds::data
