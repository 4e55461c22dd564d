// Which environment goes to remote nodes: variables with DeepSpeed's export
// prefixes plus the KEY=VALUE lines of .deepspeed_env files. Pure except read_env_files.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ds::launch {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Prefixes whose variables are exported: NCCL, PYTHON, UCX, MV2, CUDA, OMP, DS_, MLFLOW.
const std::vector<std::string>& export_prefixes();

// Picks the exported variables out of "NAME=value" entries (like environ), sorted by name.
EnvList exported_env(const std::vector<std::string>& environ_entries);

// Parses a .deepspeed_env file: KEY=VALUE per line, blank lines and '#' comments
// allowed. A line without '=' or with an invalid name is a ds::UserError naming
// `source` and the line number.
EnvList parse_env_file(const std::string& text, const std::string& source);

// Sets or replaces `key` in `env`, keeping the first position.
void env_set(EnvList& env, const std::string& key, const std::string& value);

// True for [A-Za-z_][A-Za-z0-9_]*.
bool valid_env_name(const std::string& name);

// Reads $HOME/<name> then ./<name>, where name is $DS_ENV_FILE or ".deepspeed_env".
EnvList read_env_files();

}  // namespace ds::launch
