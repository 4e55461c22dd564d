// The dsrun head: plan, then local / ssh / pdsh / srun / mpirun execution with supervision.
#include "launcher/head.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "lib/core/crypto.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"
#include "launcher/agent.h"
#include "launcher/autotune/autotuner.h"
#include "launcher/env_export.h"
#include "launcher/guard.h"
#include "launcher/process.h"
#include "launcher/restart.h"
#include "launcher/shell.h"
#include "launcher/ssh_transport.h"

namespace ds::launch {
namespace {

std::vector<std::string> local_names() {
  std::vector<std::string> names;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) {
    names.push_back(host);
    std::string s = host;
    if (s.find('.') != std::string::npos) names.push_back(s.substr(0, s.find('.')));
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
      char buf[NI_MAXHOST];
      socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (getnameinfo(i->ifa_addr, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) names.push_back(buf);
    }
    freeifaddrs(ifs);
  }
  return names;
}

// 128 bits from the system's CSPRNG, as 32 hex digits.
std::string random_token() { return crypto::to_hex(crypto::random_bytes(16)); }

std::string self_path() {
  if (const char* p = std::getenv("DSRUN_AGENT_PATH"); p && *p) return p;
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "dsrun" : p.string();
}

bool in_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

// Runs argv to completion, returning its stdout and exit code.
int capture_command(const std::vector<std::string>& argv, std::string* out) {
  int p[2];
  DS_CHECK(pipe2(p, O_CLOEXEC) == 0, "pipe2");
  SpawnSpec spec{argv, environ_entries(), p[1], -1, {}, true, true};
  pid_t pid;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    close(p[0]), close(p[1]);
    throw;
  }
  close(p[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out->append(buf, n);
  close(p[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return exit_code_of(st);
}

std::string first_word(const std::string& s) {
  auto words = shell_split(s, "hostname -I output");
  return words.empty() ? "" : words[0];
}

// The ssh client command pdsh will use: ssh $PDSH_SSH_ARGS_APPEND [-p PORT] -- HOST CMD...
std::vector<std::string> ssh_client_argv(const Options& o, const std::string& host, const std::string& cmd) {
  std::vector<std::string> argv = {"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes"};
  if (const char* extra = std::getenv("PDSH_SSH_ARGS_APPEND"))
    for (auto& w : shell_split(extra, "PDSH_SSH_ARGS_APPEND")) argv.push_back(w);
  if (o.ssh_port > 0) argv.insert(argv.end(), {"-p", std::to_string(o.ssh_port)});
  argv.insert(argv.end(), {"--", host, cmd});  // never an option, whatever the name
  return argv;
}

SshSettings ssh_settings(const Options& o) {
  return {o.ssh_port, o.ssh_user, o.ssh_identity, o.ssh_known_hosts, o.ssh_no_host_key_check, o.ssh_timeout};
}

// How one node's agent ended in an ssh launch.
struct NodeEnd {
  int code = 0;
  bool lost = false;        // it stopped answering (no heartbeat)
};

std::string node_failure(const std::string& host, size_t i, const NodeEnd& e, double heartbeat_timeout) {
  if (e.lost) return fmt::format("node {} (node rank {}) sent nothing for {} s (lost heartbeat)", host, i,
                                 heartbeat_timeout);
  return fmt::format("node {} (node rank {}) failed with exit code {}", host, i, e.code);
}

// Which node a failed launch is blamed on (the restart log, elastic host
// health). When a rank dies its peers usually fail too (their collectives
// lose the connection), often just as fast, so the first report is not
// always the cause: a node that went silent comes first, then one whose rank
// died from a signal not sent by the teardown (SIGKILL, SIGSEGV, ...), then
// the first failure reported. Teardown ends an agent with 129 (connection closed) or
// 143 (SIGTERM).
int blame_node(const std::vector<NodeEnd>& ends, int first) {
  for (size_t i = 0; i < ends.size(); ++i)
    if (ends[i].lost) return static_cast<int>(i);
  for (size_t i = 0; i < ends.size(); ++i)
    if (ends[i].code > 128 && ends[i].code < 255 && ends[i].code != 129 && ends[i].code != 143)
      return static_cast<int>(i);
  return first;
}

// Built-in ssh: connect everywhere first (unless the caller did), then start
// all agents and watch them.
AttemptResult run_ssh(LaunchPlan& p, const PlanInputs& in, std::vector<std::unique_ptr<SshConnection>> conns) {
  std::vector<std::string> hosts;
  for (const auto& n : p.active) hosts.push_back(n.host);
  if (conns.empty()) conns = ssh_connect_all(hosts, ssh_settings(in.opts));
  if (p.discover_master) {
    std::string addr = first_word(conns[0]->capture("hostname -I"));
    DS_USER_CHECK(!addr.empty(), "ssh {}: 'hostname -I' printed no address; pass --master_addr", hosts[0]);
    p.master_addr = addr;
    build_commands(p, in);
  }
  const double heartbeat_timeout = p.agent.heartbeat > 0 ? in.opts.heartbeat_timeout : 0;
  SignalPipe sig({SIGINT, SIGTERM, SIGHUP});
  std::atomic<bool> stop{false};
  std::mutex mu;
  AttemptResult result;
  result.code = -1;
  std::vector<NodeEnd> ends(hosts.size());
  int first = 0;  // the first node to report a failure
  int done_pipe[2];
  DS_CHECK(pipe2(done_pipe, O_CLOEXEC) == 0, "pipe2");
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hosts.size(); ++i)
    threads.emplace_back([&, i] {
      bool lost = false;
      int code = conns[i]->run(node_remote_command(p, static_cast<int>(i)), p.agent_stdin, stop,
                               in.opts.teardown_grace, heartbeat_timeout, &lost);
      {
        std::lock_guard<std::mutex> lock(mu);
        ends[i] = {code, lost};
        if (code != 0 && result.code < 0 && !stop) {
          result.code = code;
          first = static_cast<int>(i);
          fmt::print(stderr, "dsrun: {}; stopping all nodes\n", node_failure(hosts[i], i, ends[i], heartbeat_timeout));
          stop = true;
        }
      }
      (void)!write(done_pipe[1], "x", 1);
    });
  size_t finished = 0;
  while (finished < hosts.size()) {
    pollfd fds[2] = {{sig.fd(), POLLIN, 0}, {done_pipe[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;
    char c;
    if (fds[1].revents)
      while (finished < hosts.size() && read(done_pipe[0], &c, 1) == 1) ++finished;
    if (fds[0].revents)
      for (int s : sig.drain()) {
        std::lock_guard<std::mutex> lock(mu);
        if (result.code < 0) {
          result.code = 128 + s;
          result.interrupted = true;
          result.cause = fmt::format("dsrun received {}", signal_name(s));
        }
        if (!stop) fmt::print(stderr, "dsrun: received {}; stopping all nodes\n", signal_name(s));
        stop = true;
      }
  }
  for (auto& t : threads) t.join();
  close(done_pipe[0]);
  close(done_pipe[1]);
  if (result.code < 0) result.code = 0;
  if (result.code == 0 || result.interrupted) return result;
  const int blamed = blame_node(ends, first);
  result.code = ends[blamed].code;
  result.failed_node = blamed;
  result.heartbeat_lost = ends[blamed].lost;
  result.cause = node_failure(hosts[blamed], blamed, ends[blamed], heartbeat_timeout);
  return result;
}

// pdsh reports "pdsh@head: HOST: ssh exited with exit code N" for a failed node.
bool parse_pdsh_failure(const std::string& line, std::string* host, int* code) {
  size_t k = line.find(": ssh exited with exit code ");
  if (k == std::string::npos) return false;
  size_t h = line.rfind(": ", k - 1);
  if (h == std::string::npos) return false;
  *host = line.substr(h + 2, k - h - 2);
  *code = std::atoi(line.c_str() + k + 28);
  return *code != 0;
}

// Runs the launcher command; on a node failure (pdsh), a signal or the end of
// the launcher, stops the whole tree. Returns the job's exit code.
int supervise_launcher(LaunchPlan& p, const PlanInputs& in, bool* interrupted) {
  const std::string& prog = p.head_command.at(0);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  SignalPipe sig({SIGCHLD, SIGINT, SIGTERM, SIGHUP});
  int err_p[2];
  DS_CHECK(pipe2(err_p, O_CLOEXEC) == 0, "pipe2");
  SpawnSpec spec{p.head_command, merge_env(environ_entries(), p.head_env), -1, err_p[1], {}, true, true};
  pid_t pid = spawn_process(spec);
  close(err_p[1]);
  int err_fd = err_p[0];
  std::string err_buf;
  int status = 0, result = -1;
  KillDeadline kill_at;
  bool exited = false;
  auto begin_stop = [&](int code, const std::string& why) {
    if (result >= 0) return;
    result = code;
    fmt::print(stderr, "dsrun: {}; stopping all nodes\n", why);
    kill_tree(pid, SIGTERM);  // the launcher and everything under it
    kill_at.arm(in.opts.teardown_grace + 2.0);
  };
  while (!exited || err_fd >= 0) {
    pollfd fds[2] = {{sig.fd(), POLLIN, 0}, {err_fd, POLLIN, 0}};
    int timeout = kill_at.poll_ms();
    if (exited) timeout = 1000;  // launcher gone: finish reading its stderr
    int rc = poll(fds, err_fd >= 0 ? 2 : 1, timeout);
    if (exited && rc == 0) break;
    if (err_fd >= 0 && fds[1].revents) {
      char buf[8192];
      ssize_t n = read(err_fd, buf, sizeof(buf));
      if (n <= 0) close(err_fd), err_fd = -1;
      else err_buf.append(buf, n);
      size_t nl;
      while ((nl = err_buf.find('\n')) != std::string::npos) {
        std::string line = err_buf.substr(0, nl + 1);
        err_buf.erase(0, nl + 1);
        (void)!write(2, line.data(), line.size());
        std::string host;
        int code;
        if (parse_pdsh_failure(line, &host, &code))
          begin_stop(code, fmt::format("node {} failed with exit code {}", host, code));
      }
    }
    for (int s : sig.drain()) {
      if (s == SIGCHLD) continue;
      if (result < 0) *interrupted = true;
      if (result >= 0) kill_at.hurry();
      begin_stop(128 + s, fmt::format("received {}", signal_name(s)));
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
    if (!exited && kill_at.due(60)) kill_tree(pid, SIGKILL);
  }
  if (err_fd >= 0) close(err_fd);
  if (!err_buf.empty()) (void)!write(2, err_buf.data(), err_buf.size());
  kill_group(pid, SIGKILL);
  kill_adopted_children();
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (result >= 0) return result;
  int code = exit_code_of(status);
  if (code != 0) fmt::print(stderr, "dsrun: {} exited with {} (see the node lines above)\n", prog, describe_status(status));
  return code;
}

// pdsh: the agents' private environment files (LaunchPlan::env_file), one per
// node; each agent deletes its own, and whatever is left goes with this object.
class PrivateEnvFiles {
 public:
  explicit PrivateEnvFiles(const LaunchPlan& p) {
    if (p.env_file.empty()) return;
    for (size_t n = 0; n < p.active.size(); ++n) {
      paths_.push_back(fmt::format("{}.{}", p.env_file, n));
      try {
        write_private_env_file(paths_.back(), p.agent_env);
      } catch (...) {
        paths_.pop_back();
        remove_all();
        throw;
      }
    }
  }
  ~PrivateEnvFiles() { remove_all(); }
  PrivateEnvFiles(const PrivateEnvFiles&) = delete;
  PrivateEnvFiles& operator=(const PrivateEnvFiles&) = delete;

 private:
  void remove_all() {
    for (const auto& f : paths_) unlink(f.c_str());
    paths_.clear();
  }
  std::vector<std::string> paths_;
};

// pdsh / srun / mpirun: one launcher process whose exit code carries the agents' codes.
int run_external(LaunchPlan& p, const PlanInputs& in, bool* interrupted) {
  const Options& o = in.opts;
  const std::string& prog = p.head_command.at(0);
  DS_USER_CHECK(in_path(prog), "--launcher {}: '{}' is not installed or not in PATH", o.launcher, prog);
  if (p.transport == Transport::Pdsh) {
    std::string out;
    if (!o.no_ssh_check) {
      int rc = capture_command(ssh_client_argv(o, p.active[0].host, "hostname"), &out);
      DS_USER_CHECK(rc == 0, "ssh check: cannot reach '{}' with key authentication (ssh exit {}); fix ssh "
                    "or pass --no_ssh_check", p.active[0].host, rc);
    }
    if (p.discover_master) {
      out.clear();
      int rc = capture_command(ssh_client_argv(o, p.active[0].host, "hostname -I"), &out);
      DS_USER_CHECK(rc == 0 && !first_word(out).empty(), "cannot discover the master address with 'ssh {} "
                    "hostname -I'; pass --master_addr", p.active[0].host);
      p.master_addr = first_word(out);
      build_commands(p, in);
    }
  }
  PrivateEnvFiles env_files(p);
  return supervise_launcher(p, in, interrupted);
}

}  // namespace

AttemptResult run_attempt(LaunchPlan& p, const PlanInputs& in, std::vector<std::unique_ptr<SshConnection>> conns) {
  if (p.transport == Transport::Ssh) return run_ssh(p, in, std::move(conns));
  AttemptResult r;
  AgentEnd end;
  if (p.transport == Transport::Local) {
    r.code = run_agent(p.agent, p.local_node_rank, false, &end);
    r.interrupted = end.interrupted;
    r.failed_node = 0;
  } else {
    r.code = run_external(p, in, &r.interrupted);
  }
  r.cause = r.interrupted ? "dsrun was interrupted"
            : r.code == kStallExitCode && !end.cause.empty() ? end.cause
                                                               : fmt::format("exit code {}", r.code);
  return r;
}

int count_local_gpus() {
  int n = 0;
  if (DIR* d = opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n;
  }
  for (int i = 0; i < 64; ++i)
    if (access(fmt::format("/dev/nvidia{}", i).c_str(), F_OK) == 0) ++n;
  return n;
}

PlanInputs gather_inputs(const Options& o) {
  PlanInputs in;
  in.opts = o;
  in.hostfile_pool = read_hostfile(o.hostfile, o.hostfile_given);
  in.gpu_count = count_local_gpus();
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) in.cuda_visible_devices = cvd;
  in.environ_entries = environ_entries();
  in.env_file_vars = read_env_files();
  std::error_code ec;
  in.cwd = std::filesystem::current_path(ec).string();
  in.dsrun_path = self_path();
  const char* token = std::getenv("DS_JOB_TOKEN");
  in.job_token = token && *token ? token : random_token();
  in.local_names = local_names();
  in.head_pid = getpid();
  const char* home = std::getenv("HOME");
  in.private_env_file = fmt::format("{}/.dsrun/env-{}", home && *home == '/' ? home : in.cwd, random_token());
  return in;
}

int dsrun_main(int argc, char** argv) {
  // A rank's own exit code is what dsrun returns; its own failures follow run_main.
  return run_main("dsrun", [&] {
    if (argc > 1 && std::string(argv[1]) == "--agent") return agent_main(argc, argv);
    Options o;
    if (!parse_options(argc, argv, &o)) return 0;
    if (!o.autotuning.empty()) return autotune::autotune_main(o, argc, argv);
    PlanInputs in = gather_inputs(o);
    LaunchPlan p = make_plan(in);
    for (const auto& n : p.notes) fmt::print(stderr, "dsrun: {}\n", n);
    if (o.dry_run) {
      fmt::print("{}\n", plan_to_json(p));
      return 0;
    }
    if (o.max_restarts > 0) return run_with_restarts(in, std::move(p));
    if (p.transport == Transport::Local)
      return run_guarded([&] { return run_agent(p.agent, p.local_node_rank, false); });
    return run_attempt(p, in).code;
  });
}

}  // namespace ds::launch
