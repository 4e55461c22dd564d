// DeepSpeed-Chat's local/jsonfile examples (pairs.h).
#include "lib/chat/pairs.h"

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_config.h"

namespace ds::chat {
namespace {

ChatExample example_of(const nlohmann::json& j, const std::string& where) {
  DS_USER_CHECK(j.is_object(), "{}: expected a JSON object with prompt / chosen / rejected, got {}", where,
                j.type_name());
  ChatExample e;
  auto field = [&](const char* name, std::optional<std::string>& out) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return;
    DS_USER_CHECK(it->is_string(), "{}: field '{}' is {}, expected a string or null", where, name, it->type_name());
    out = it->get<std::string>();
  };
  field("prompt", e.prompt);
  field("chosen", e.chosen);
  field("rejected", e.rejected);
  return e;
}

}  // namespace

std::vector<ChatExample> read_pair_file(const std::string& path) {
  const std::string text = read_small_file(path, size_t(4) << 30, "data file '" + path + "'");
  std::vector<ChatExample> out;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // one JSON array
    const nlohmann::json all = parse_json_text(text, "data file '" + path + "'");
    for (size_t i = 0; i < all.size(); ++i)
      out.push_back(example_of(all[i], "data file '" + path + "', element " + std::to_string(i)));
    return out;
  }
  size_t at = 0;
  for (int line = 1; at < text.size(); ++line) {  // JSON Lines
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view l(text.data() + at, end - at);
    at = end + 1;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = "data file '" + path + "', line " + std::to_string(line);
    out.push_back(example_of(parse_json_text(l, where), where));
  }
  return out;
}

std::optional<std::string> prompt_text(const ChatExample& e) {
  if (!e.prompt) return std::nullopt;
  return " " + *e.prompt;
}

std::optional<std::string> chosen_text(const ChatExample& e) {
  if (!e.chosen) return std::nullopt;
  return " " + *e.chosen;
}

std::optional<std::string> rejected_text(const ChatExample& e) {
  if (!e.rejected) return std::nullopt;
  return " " + *e.rejected;
}

std::optional<std::string> prompt_and_chosen(const ChatExample& e) {
  if (!e.prompt || !e.chosen) return std::nullopt;
  return " " + *e.prompt + " " + *e.chosen;
}

std::optional<std::string> prompt_and_rejected(const ChatExample& e) {
  if (!e.prompt || !e.rejected) return std::nullopt;
  return " " + *e.prompt + " " + *e.rejected;
}

}  // namespace ds::chat
