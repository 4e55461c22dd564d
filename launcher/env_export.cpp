// Environment export to remote nodes (prefix filter + .deepspeed_env files).
#include "launcher/env_export.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "lib/core/error.h"

namespace ds::launch {

const std::vector<std::string>& export_prefixes() {
  static const std::vector<std::string> p = {"NCCL", "PYTHON", "UCX", "MV2",
                                             "CUDA", "OMP",    "DS_", "MLFLOW"};
  return p;
}

bool valid_env_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

void env_set(EnvList& env, const std::string& key, const std::string& value) {
  for (auto& kv : env)
    if (kv.first == key) {
      kv.second = value;
      return;
    }
  env.emplace_back(key, value);
}

EnvList exported_env(const std::vector<std::string>& environ_entries) {
  EnvList out;
  for (const auto& e : environ_entries) {
    size_t eq = e.find('=');
    if (eq == std::string::npos) continue;
    std::string name = e.substr(0, eq);
    if (!valid_env_name(name)) continue;
    for (const auto& p : export_prefixes())
      if (name.rfind(p, 0) == 0) {
        env_set(out, name, e.substr(eq + 1));
        break;
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

EnvList parse_env_file(const std::string& text, const std::string& source) {
  EnvList out;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    size_t eq = line.find('=');
    DS_USER_CHECK(eq != std::string::npos, "{}:{}: expected KEY=VALUE, got '{}'", source, line_no,
                  line);
    std::string key = line.substr(b, eq - b);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    if (key.rfind("export ", 0) == 0) key = key.substr(7);
    DS_USER_CHECK(valid_env_name(key), "{}:{}: '{}' is not a valid variable name", source,
                  line_no, key);
    env_set(out, key, line.substr(eq + 1));
  }
  return out;
}

EnvList read_env_files() {
  const char* name_env = std::getenv("DS_ENV_FILE");
  std::string name = name_env && *name_env ? name_env : ".deepspeed_env";
  std::vector<std::string> paths;
  if (name[0] == '/') {
    paths.push_back(name);
  } else {
    if (const char* home = std::getenv("HOME")) paths.push_back(std::string(home) + "/" + name);
    paths.push_back(name);
  }
  EnvList out;
  for (const auto& p : paths) {
    std::ifstream f(p);
    if (!f) continue;
    std::stringstream ss;
    ss << f.rdbuf();
    for (const auto& kv : parse_env_file(ss.str(), p)) env_set(out, kv.first, kv.second);
  }
  return out;
}

}  // namespace ds::launch
