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

// Variables as lines "NAME=<hex of value>\n" ended by an empty line: how the
// built-in ssh transport hands secrets to a remote agent over stdin.
std::string encode_env_lines(const EnvList& env);
// Reads such lines from fd until the empty line (byte by byte: nothing after
// it is consumed). UserError on malformed input or end of input first.
EnvList read_env_lines(int fd);

// The pdsh transport's channel for the same lines: a file created exclusively
// with mode 0600 (never through a symlink) in a directory only the user can
// enter (created 0700 when missing). UserError naming the path on failure.
void write_private_env_file(const std::string& path, const EnvList& env);
// Reads such a file and deletes it. Refuses (UserError naming the path) a file
// that is missing, a symlink, not owned by this user or open to group/others.
EnvList take_private_env_file(const std::string& path);

}  // namespace ds::launch
