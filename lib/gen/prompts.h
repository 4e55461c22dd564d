// dsgen's prompts before generation: a JSON-lines prompt file read, and a
// prompt checked and encoded. Pure (no model), so the fuzz target and the
// generator share these checks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/data/tokenizer.h"

namespace ds::gen {

// One prompt per line of a JSONL file: {"prompt": ...} or {"text": ...}; blank
// lines skipped. A line that is not such an object, a prompt holding a NUL
// character, or a file without prompts is a UserError naming the file and line.
std::vector<std::string> read_prompt_file(const std::string& path);

// A UserError unless prompt `index` (1-based, for the message) is non-empty,
// shorter than the model's context maxT and within its vocabulary of V ids.
void check_prompt(const std::vector<int32_t>& ids, int64_t maxT, int64_t V, int64_t index);

// The ids of prompt `index`: bos first where the tokenizer adds one, then the
// text; a UserError naming the prompt for a NUL byte (it would be cut short
// where the prompt is printed) or a failed check_prompt().
std::vector<int32_t> encode_prompt(const data::Tokenizer& tok, const std::string& text, int64_t index, int64_t maxT,
                                   int64_t V);

}  // namespace ds::gen
