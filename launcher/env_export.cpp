// Environment export to remote nodes (prefix filter + .deepspeed_env files).
#include "launcher/env_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

std::string encode_env_lines(const EnvList& env) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (const auto& [k, v] : env) {
    out += k + "=";
    for (unsigned char c : v) out += {kHex[c >> 4], kHex[c & 15]};
    out += "\n";
  }
  return out + "\n";
}

EnvList read_env_lines(int fd) {
  EnvList env;
  std::string line;
  auto nibble = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  while (true) {
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    DS_USER_CHECK(n == 1, "dsrun --agent: the environment from the head ended early");
    if (c != '\n') {
      DS_USER_CHECK(line.size() < (1u << 20), "dsrun --agent: a line of the environment from the head is too long");
      line += c;
      continue;
    }
    if (line.empty()) return env;
    const size_t eq = line.find('=');
    const std::string hex = eq == std::string::npos ? "" : line.substr(eq + 1);
    DS_USER_CHECK(eq != std::string::npos && eq > 0 && hex.size() % 2 == 0 &&
                      hex.find_first_not_of("0123456789abcdef") == std::string::npos,
                  "dsrun --agent: malformed line in the environment from the head");
    std::string v;
    for (size_t i = 0; i < hex.size(); i += 2) v += static_cast<char>(nibble(hex[i]) << 4 | nibble(hex[i + 1]));
    env.emplace_back(line.substr(0, eq), v);
    line.clear();
  }
}

void write_private_env_file(const std::string& path, const EnvList& env) {
  const std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  if (!dir.empty() && mkdir(dir.c_str(), 0700) != 0)
    DS_USER_CHECK(errno == EEXIST, "cannot create '{}': {}", dir, std::strerror(errno));
  struct stat st {};
  DS_USER_CHECK(dir.empty() || (lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
                                (st.st_mode & 077) == 0),
                "'{}' must be a directory owned by you with mode 0700 (it holds the job's secrets)", dir);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  DS_USER_CHECK(fd >= 0, "cannot create '{}': {}", path, std::strerror(errno));
  const std::string text = encode_env_lines(env);
  size_t at = 0;
  while (at < text.size()) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  const int err = at == text.size() ? 0 : errno;
  ::close(fd);
  if (err != 0 || at != text.size()) unlink(path.c_str());
  DS_USER_CHECK(at == text.size(), "cannot write '{}': {}", path, std::strerror(err));
}

EnvList take_private_env_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "dsrun --agent: cannot read the job's environment file '{}': {} (with --launcher pdsh "
                "it is written by the head in $HOME/.dsrun, which must be shared with every node; or use "
                "--launcher ssh)", path, std::strerror(errno));
  struct stat st {};
  const bool private_file = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                            (st.st_mode & 077) == 0;
  if (!private_file) ::close(fd);
  DS_USER_CHECK(private_file, "dsrun --agent: '{}' is not a private file of this user (mode 0600); refusing it",
                path);
  EnvList env;
  try {
    env = read_env_lines(fd);
  } catch (...) {
    ::close(fd);
    unlink(path.c_str());
    throw;
  }
  ::close(fd);
  unlink(path.c_str());
  return env;
}

}  // namespace ds::launch
