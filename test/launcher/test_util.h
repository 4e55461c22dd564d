// Helpers shared by dsrun's tests and bench/launch: run a command and capture
// its output, find processes carrying a job token (leftover check), temporary
// directories, a real sshd on a loopback/namespace address, and a small lab of
// network namespaces joined by a bridge.
#pragma once
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ds::launch::test {

std::string binary_dir();
std::string dsrun_bin();
std::string probe_bin();

struct RunResult {
  int code = -1;  // exit code, 128+signal when killed
  std::string out, err;
  double seconds = 0;
};

// Runs argv with extra environment variables. `during(pid)` runs in this
// process while the command runs (e.g. to send it a signal). Kills it after timeout_s.
RunResult run_cmd(const std::vector<std::string>& argv,
                  const std::vector<std::pair<std::string, std::string>>& env = {},
                  double timeout_s = 60, std::function<void(pid_t)> during = nullptr);

// Pids whose environment or command line contains `token` (excluding this process).
std::vector<pid_t> pids_with_token(const std::string& token);
// The processes of job `token` still alive after waiting up to wait_s seconds
// for them to go; each is killed with SIGKILL so a failing test leaves nothing
// behind. Tests CHECK that the list is empty.
std::vector<pid_t> kill_leftovers(const std::string& token, double wait_s = 0);
// The parent pid of `pid` (0 if it is gone).
pid_t parent_of(pid_t pid);
// Pids whose command line (argv, not environment) contains `needle`.
std::vector<pid_t> pids_with_in_cmdline(const std::string& needle);
// Waits until at least n such processes exist (true) or timeout.
bool wait_for_token_procs(const std::string& token, size_t n, double timeout_s);
// A fresh random token.
std::string new_token();
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
// key=value lines of a probe env file.
std::string env_value(const std::string& env_text, const std::string& key);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int free_port();
// Runs a shell command, returns its exit code (quiet unless it fails).
int sh(const std::string& cmd);

// A real OpenSSH server listening on `addrs` (port `port`), root login by key,
// with generated host and user keys under dir. Runs inside `netns` when given.
class Sshd {
 public:
  Sshd(const std::string& dir, const std::vector<std::string>& addrs, int port,
       const std::string& netns = "");
  ~Sshd();
  bool ok() const { return pid_ > 0; }
  const std::string& error() const { return error_; }
  const std::string& user_key() const { return user_key_; }
  const std::string& known_hosts() const { return known_hosts_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_;
  std::string user_key_, known_hosts_, error_;
};

// Generates (once per dir) the user key and authorized_keys used by Sshd.
// Returns "" on success or an error message.
std::string prepare_ssh_keys(const std::string& dir);

// n network namespaces "hosts" 10.200.0.1..n on a bridge in a switch namespace.
class NetnsLab {
 public:
  explicit NetnsLab(int n);
  ~NetnsLab();
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string ns(int i) const;
  std::string addr(int i) const { return "10.200.0." + std::to_string(i + 1); }

 private:
  std::string prefix_;
  int n_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace ds::launch::test
