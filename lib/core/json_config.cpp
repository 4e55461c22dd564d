// Strict JSON section reader and file loader.
#include "lib/core/json_config.h"

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

JsonSection JsonSection::section(const std::string& key) {
  seen_.insert(key);
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

nlohmann::json load_json_file(const std::string& path) {
  std::ifstream f(path);
  DS_USER_CHECK(f.good(), "config file '{}' cannot be opened", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    DS_USER_ERROR("config file '{}' is not valid JSON: {}", path, e.what());
  }
}

}  // namespace ds
