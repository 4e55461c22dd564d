// libssh fan-out: parallel connect/auth with host key verification, remote exec, output streaming.
#include "launcher/ssh_transport.h"

#include <libssh/libssh.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "lib/core/error.h"
#include "launcher/options.h"
#include "launcher/process.h"

namespace ds::launch {
namespace {

std::mutex g_out_mutex;

// Seconds an agent may take to send its first heartbeat.
constexpr double kFirstHeartbeatWithin = 30;
// Seconds a captured command (hostname -I) may take.
constexpr double kCaptureWithin = 60;

void locked_write(int fd, const std::string& s) {
  std::lock_guard<std::mutex> lock(g_out_mutex);
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += n;
  }
}

// Passes complete lines through, keeping partial lines until they complete;
// drops the agent's heartbeat lines (they only tell the head it is alive).
struct LineBuffer {
  std::string buf;
  void add(int fd, const char* data, int n, bool flush) {
    buf.append(data, n);
    size_t last = buf.rfind('\n');
    if (flush && !buf.empty()) {
      if (buf.back() != '\n') buf += '\n';
      last = buf.size() - 1;
    }
    if (last == std::string::npos) return;
    std::string lines = buf.substr(0, last + 1);
    buf.erase(0, last + 1);
    const std::string beat = kHeartbeatLine;
    for (size_t at = 0; (at = lines.find(beat, at)) != std::string::npos;) {
      if (at == 0 || lines[at - 1] == '\n') lines.erase(at, beat.size());
      else at += beat.size();
    }
    if (!lines.empty()) locked_write(fd, lines);
  }
};

void verify_host_key(ssh_session s, const std::string& host, const SshSettings& st) {
  if (st.no_host_key_check) return;
  std::string kh = st.known_hosts.empty() ? "~/.ssh/known_hosts" : st.known_hosts;
  switch (ssh_session_is_known_server(s)) {
    case SSH_KNOWN_HOSTS_OK:
      return;
    case SSH_KNOWN_HOSTS_CHANGED:
      DS_USER_ERROR("ssh {}: the host key does NOT match the one in {} (possible man-in-the-middle); "
                    "refusing to connect. Fix the entry or pass --ssh_no_host_key_check", host, kh);
    case SSH_KNOWN_HOSTS_OTHER:
      DS_USER_ERROR("ssh {}: the host offered a key of another type than the one in {}; refusing to "
                    "connect", host, kh);
    case SSH_KNOWN_HOSTS_UNKNOWN:
    case SSH_KNOWN_HOSTS_NOT_FOUND:
      DS_USER_ERROR("ssh {}: host key is not in {}; add it (ssh-keyscan {}{} >> {}) or pass "
                    "--ssh_no_host_key_check", host, kh, st.port ? fmt::format("-p {} ", st.port) : "",
                    host, kh);
    default:
      DS_USER_ERROR("ssh {}: cannot check the host key: {}", host, ssh_get_error(s));
  }
}

void authenticate(ssh_session s, const std::string& host, const SshSettings& st) {
  int rc;
  if (!st.identity.empty()) {
    ssh_key key = nullptr;
    DS_USER_CHECK(ssh_pki_import_privkey_file(st.identity.c_str(), nullptr, nullptr, nullptr, &key) == SSH_OK,
                  "--ssh_identity '{}': cannot read the private key", st.identity);
    rc = ssh_userauth_publickey(s, nullptr, key);
    ssh_key_free(key);
  } else {
    rc = ssh_userauth_publickey_auto(s, nullptr, nullptr);
  }
  DS_USER_CHECK(rc == SSH_AUTH_SUCCESS, "ssh {}: public key authentication failed ({}); set up key login "
                "(ssh-agent or ~/.ssh/id_*) or pass --ssh_identity", host,
                st.identity.empty() ? "tried ssh-agent and ~/.ssh keys" : st.identity);
}

}  // namespace

SshConnection::~SshConnection() {
  if (session_) {
    auto s = static_cast<ssh_session>(session_);
    ssh_disconnect(s);
    ssh_free(s);
  }
}

std::unique_ptr<SshConnection> SshConnection::open(const std::string& host, const SshSettings& st) {
  std::unique_ptr<SshConnection> c(new SshConnection);
  c->host_ = host;
  ssh_session s = ssh_new();
  DS_CHECK(s, "ssh_new failed");
  c->session_ = s;
  ssh_options_set(s, SSH_OPTIONS_HOST, host.c_str());
  ssh_options_parse_config(s, nullptr);
  if (st.port > 0) {
    unsigned int port = st.port;
    ssh_options_set(s, SSH_OPTIONS_PORT, &port);
  }
  if (!st.user.empty()) ssh_options_set(s, SSH_OPTIONS_USER, st.user.c_str());
  if (!st.known_hosts.empty()) ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, st.known_hosts.c_str());
  long timeout = st.timeout_s;
  ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &timeout);
  DS_USER_CHECK(ssh_connect(s) == SSH_OK, "ssh {}{}: cannot connect: {}", host,
                st.port ? fmt::format(" port {}", st.port) : "", ssh_get_error(s));
  verify_host_key(s, host, st);
  authenticate(s, host, st);
  return c;
}

std::string SshConnection::capture(const std::string& command) {
  auto s = static_cast<ssh_session>(session_);
  ssh_channel ch = ssh_channel_new(s);
  DS_USER_CHECK(ch && ssh_channel_open_session(ch) == SSH_OK && ssh_channel_request_exec(ch, command.c_str()) == SSH_OK,
                "ssh {}: cannot run '{}': {}", host_, command, ssh_get_error(s));
  std::string out;
  char buf[4096];
  // A blocking read gives up after the session's connect timeout and returns 0
  // as at the end; read until the real end (a busy host may take longer).
  const double give_up = now_seconds() + kCaptureWithin;
  while (true) {
    const int n = ssh_channel_read_timeout(ch, buf, sizeof(buf), 0, 200);
    if (n > 0) {
      out.append(buf, n);
      continue;
    }
    if (n < 0 || ssh_channel_is_eof(ch) || ssh_channel_is_closed(ch) || now_seconds() > give_up) break;
  }
  ssh_channel_send_eof(ch);
  int status = ssh_channel_get_exit_status(ch);
  ssh_channel_close(ch);
  ssh_channel_free(ch);
  DS_USER_CHECK(status == 0, "ssh {}: '{}' failed (exit status {})", host_, command, status);
  return out;
}

int SshConnection::run(const std::string& command, const std::string& input, const std::atomic<bool>& stop,
                       double grace_s, double heartbeat_timeout_s, bool* heartbeat_lost) {
  auto s = static_cast<ssh_session>(session_);
  ssh_channel ch = ssh_channel_new(s);
  if (!ch || ssh_channel_open_session(ch) != SSH_OK || ssh_channel_request_exec(ch, command.c_str()) != SSH_OK) {
    locked_write(2, fmt::format("dsrun: ssh {}: cannot start the agent: {}\n", host_, ssh_get_error(s)));
    if (ch) ssh_channel_free(ch);
    return 255;
  }
  for (size_t at = 0; at < input.size();) {
    const int n = ssh_channel_write(ch, input.data() + at, static_cast<uint32_t>(input.size() - at));
    if (n <= 0) {
      locked_write(2, fmt::format("dsrun: ssh {}: cannot send the agent its environment: {}\n", host_,
                                  ssh_get_error(s)));
      ssh_channel_free(ch);
      return 255;
    }
    at += static_cast<size_t>(n);
  }
  LineBuffer out, err;
  char buf[16384];
  bool stopping = false;
  double give_up = 0, last_heard = now_seconds();
  bool lost = false, heard = false;
  while (true) {
    if (stop && !stopping) {
      stopping = true;
      ssh_channel_request_send_signal(ch, "TERM");
      ssh_channel_send_eof(ch);
      give_up = now_seconds() + grace_s + 2.0;
    }
    if (stopping && now_seconds() > give_up) break;  // closing the channel hangs up the agent
    int n = ssh_channel_read_timeout(ch, buf, sizeof(buf), 0, 50);
    if (n > 0) out.add(1, buf, n, false);
    int m;
    while ((m = ssh_channel_read_nonblocking(ch, buf, sizeof(buf), 1)) > 0) err.add(2, buf, m, false);
    if (n == SSH_ERROR || m == SSH_ERROR) break;
    if (n <= 0 && m <= 0 && (ssh_channel_is_eof(ch) || ssh_channel_is_closed(ch))) break;
    if (n > 0 || m > 0) last_heard = now_seconds(), heard = true;
    // Until the agent's first line, allow for a slow start (exec, loading, a busy host).
    const double limit = heard ? heartbeat_timeout_s : std::max(heartbeat_timeout_s, kFirstHeartbeatWithin);
    if (heartbeat_timeout_s > 0 && !stopping && now_seconds() - last_heard > limit) {
      lost = true;  // nothing can be asked of a host that does not answer: give it up at once
      break;
    }
  }
  if (heartbeat_lost) *heartbeat_lost = lost;
  out.add(1, "", 0, true);
  err.add(2, "", 0, true);
  int status = 255;
  if (!lost && (!stopping || now_seconds() <= give_up)) status = ssh_channel_get_exit_status(ch);
  if (status < 0) status = 255;
  ssh_channel_close(ch);
  ssh_channel_free(ch);
  return status;
}

std::vector<std::unique_ptr<SshConnection>> ssh_connect_all(const std::vector<std::string>& hosts,
                                                            const SshSettings& s) {
  std::vector<std::string> errors;
  auto conns = ssh_try_connect_all(hosts, s, &errors);
  std::string all;
  for (const auto& e : errors)
    if (!e.empty()) all += (all.empty() ? "" : "\n") + e;
  if (!all.empty()) throw UserError(all);
  return conns;
}

std::vector<std::unique_ptr<SshConnection>> ssh_try_connect_all(const std::vector<std::string>& hosts,
                                                                const SshSettings& s,
                                                                std::vector<std::string>* errors_out) {
  ssh_init();
  std::vector<std::unique_ptr<SshConnection>> conns(hosts.size());
  std::vector<std::string> errors(hosts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hosts.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        conns[i] = SshConnection::open(hosts[i], s);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  *errors_out = std::move(errors);
  return conns;
}

}  // namespace ds::launch
