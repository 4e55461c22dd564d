// The built-in SSH transport (libssh): connect and authenticate to every host
// in parallel before anything starts, verify host keys against known_hosts,
// then start one agent per host and stream its output. Stopping closes every
// remote agent (an SSH "signal" request, then EOF and channel close, which the
// agent notices as a hang-up).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ds::launch {

struct SshSettings {
  int port = 0;  // 0: ~/.ssh/config or 22
  std::string user;
  std::string identity;
  std::string known_hosts;
  bool no_host_key_check = false;
  int timeout_s = 10;
};

// One authenticated connection.
class SshConnection {
 public:
  ~SshConnection();
  // Connects and authenticates; throws ds::UserError naming the host on failure.
  static std::unique_ptr<SshConnection> open(const std::string& host, const SshSettings& s);
  // Runs `command` and returns its stdout (for `hostname -I`); throws on failure.
  std::string capture(const std::string& command);
  // Runs `command`, streaming output to fds 1/2 line by line, until it ends or
  // `stop` becomes true (then the remote side is stopped, waiting at most
  // grace_s for it). `input` is written to the command's stdin first (the
  // agent's secrets; the channel's input stays open until stopping). Returns
  // the remote exit status (255 when unknown). heartbeat_timeout_s > 0: when
  // nothing (output or heartbeat) arrives for that long (at least 30 s before
  // the agent's first line), gives the host up at once, sets *heartbeat_lost
  // and returns 255.
  int run(const std::string& command, const std::string& input, const std::atomic<bool>& stop, double grace_s,
          double heartbeat_timeout_s = 0, bool* heartbeat_lost = nullptr);
  const std::string& host() const { return host_; }

 private:
  SshConnection() = default;
  void* session_ = nullptr;  // ssh_session
  std::string host_;
};

// Opens connections to all hosts at once. Throws one ds::UserError listing
// every host that failed.
std::vector<std::unique_ptr<SshConnection>> ssh_connect_all(const std::vector<std::string>& hosts,
                                                            const SshSettings& s);

// The same, but a host that cannot be reached gets a null connection and its
// one-line error in (*errors)[i] instead of failing the whole call.
std::vector<std::unique_ptr<SshConnection>> ssh_try_connect_all(const std::vector<std::string>& hosts,
                                                                const SshSettings& s,
                                                                std::vector<std::string>* errors);

}  // namespace ds::launch
