// dsgen's prompt file reader and prompt checks (prompts.h).
#include "lib/gen/prompts.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace ds::gen {

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream f(path);
  DS_USER_CHECK(f.good(), "--prompt-file {}: cannot read it", path);
  std::vector<std::string> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      DS_USER_ERROR("--prompt-file {}: line {} is not JSON (one {{\"prompt\": \"...\"}} object per line)", path, n);
    }
    const char* key = j.is_object() && j.contains("prompt") ? "prompt" : "text";
    DS_USER_CHECK(j.is_object() && j.contains(key) && j[key].is_string(),
                  "--prompt-file {}: line {} has no string field 'prompt' (or 'text')", path, n);
    out.push_back(j[key].get<std::string>());
    DS_USER_CHECK(out.back().find('\0') == std::string::npos, "--prompt-file {}: line {} holds a NUL character "
                  "(\\u0000), which a prompt cannot hold", path, n);
  }
  DS_USER_CHECK(!out.empty(), "--prompt-file {}: no prompts in it", path);
  return out;
}

void check_prompt(const std::vector<int32_t>& p, int64_t maxT, int64_t V, int64_t index) {
  DS_USER_CHECK(!p.empty(), "prompt {} is empty (it encodes to no tokens)", index);
  DS_USER_CHECK(static_cast<int64_t>(p.size()) < maxT, "prompt {} has {} tokens; the model's context is {} "
                "positions, so it must be shorter", index, p.size(), maxT);
  for (int32_t t : p) DS_USER_CHECK(t >= 0 && t < V, "prompt {}: token id {} outside the vocabulary of {}", index, t, V);
}

std::vector<int32_t> encode_prompt(const data::Tokenizer& tok, const std::string& text, int64_t index, int64_t maxT,
                                   int64_t V) {
  DS_USER_CHECK(text.find('\0') == std::string::npos, "prompt {} holds a NUL byte, which a prompt cannot hold", index);
  std::vector<int32_t> ids;
  if (tok.info().add_bos && tok.info().bos_id >= 0) ids.push_back(tok.info().bos_id);
  tok.encode(text, ids);
  check_prompt(ids, maxT, V, index);
  return ids;
}

}  // namespace ds::gen
