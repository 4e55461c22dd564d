// Strict JSON section reader and file loader.
#include "lib/core/json_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/core/log.h"

namespace ds {

JsonSection::JsonSection(const nlohmann::json& obj, std::string path)
    : obj_(obj.is_null() ? nlohmann::json::object() : obj), path_(std::move(path)) {
  DS_USER_CHECK(obj_.is_object(), "config: '{}' must be a JSON object, got {}",
                path_.empty() ? "<root>" : path_, obj_.dump());
}

bool JsonSection::has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

namespace {
std::set<std::string>* g_key_log = nullptr;
}  // namespace

void JsonSection::set_key_log(std::set<std::string>* log) { g_key_log = log; }

void JsonSection::note(const std::string& key) {
  seen_.insert(key);
  if (g_key_log) g_key_log->insert(full(key));
}

JsonSection JsonSection::section(const std::string& key) {
  note(key);
  if (!obj_.contains(key)) return JsonSection(nlohmann::json::object(), full(key));
  return JsonSection(obj_.at(key), full(key));
}

void JsonSection::finish(UnknownKeys mode) const {
  std::string unknown;
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (seen_.count(it.key())) continue;
    if (mode == UnknownKeys::Warn) {
      DS_WARN("config: key '{}' is not implemented by dstrain and is ignored", full(it.key()));
    } else {
      unknown += (unknown.empty() ? "" : ", ") + std::string("'") + full(it.key()) + "'";
    }
  }
  DS_USER_CHECK(unknown.empty(), "config: unknown key {} (see README 'Config reference')", unknown);
}

size_t json_too_deep_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // unbalanced text is the parser's to report
    }
  }
  return std::string_view::npos;
}

nlohmann::json parse_json_text(std::string_view text, const std::string& what) {
  const size_t deep = json_too_deep_at(text, kMaxJsonDepth);
  DS_USER_CHECK(deep == std::string_view::npos, "{} nests JSON arrays/objects deeper than {} levels (at byte {})",
                what, kMaxJsonDepth, deep);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // The parser's "; last read: '...'" quotes the file's text: cut it (the
    // line and column before it say where). The file may not be JSON at all.
    std::string msg = e.what();
    const size_t quoted = msg.find("; last read: '");
    if (quoted != std::string::npos) msg.resize(quoted);
    DS_USER_ERROR("{} is not valid JSON: {}", what, msg);
  }
}

nlohmann::json load_json_file(const std::string& path) {
  std::error_code ec;
  DS_USER_CHECK(!std::filesystem::is_directory(path, ec), "config file '{}' is a directory; give the JSON file",
                path);
  std::ifstream f(path, std::ios::binary);
  DS_USER_CHECK(f.good(), "config file '{}' cannot be opened", path);
  std::stringstream ss;
  ss << f.rdbuf();
  DS_USER_CHECK(!f.bad(), "config file '{}' cannot be read", path);
  return parse_json_text(ss.str(), "config file '" + path + "'");
}

}  // namespace ds
