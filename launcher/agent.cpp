// Per-node agent: spawn, supervise, forward output, and tear down local ranks.
#include "launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "lib/core/error.h"
#include "launcher/process.h"
#include "launcher/rank_env.h"
#include "launcher/world_info.h"
#include "launcher/env_export.h"
#include "launcher/guard.h"
#include "launcher/liveness.h"
#include "lib/core/heartbeat.h"

namespace ds::launch {
namespace {

struct OutStream {
  int fd = -1;
  std::string buf;
};

struct RankProc {
  RankInfo info;
  pid_t pid = 0;
  bool done = false;
  OutStream out, err;
};

void write_all(int fd, const std::string& s, bool* broken) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (broken) *broken = true;
      return;
    }
    off += n;
  }
}

// The --save_pid file /tmp/<pid>.deepspeed. /tmp is shared, so the file is
// created with O_EXCL|O_NOFOLLOW: a file or symlink already at that path (left
// behind, or planted to redirect the write) is refused, never written through.
// Removal unlinks the path only while it is still the file we created.
class PidFile {
 public:
  // Returns "" on success, else the one-line reason.
  std::string create(const std::string& path, int pid) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST)
      return fmt::format("--save_pid: '{}' already exists (a file or link dsrun did not create); "
                         "remove it or run without --save_pid", path);
    if (fd < 0) return fmt::format("--save_pid: cannot create '{}': {}", path, std::strerror(errno));
    bool broken = false;
    write_all(fd, std::to_string(pid), &broken);
    struct stat st {};
    const bool ok = !broken && fstat(fd, &st) == 0;
    close(fd);
    if (!ok) {
      unlink(path.c_str());
      return fmt::format("--save_pid: cannot write '{}'", path);
    }
    path_ = path, dev_ = st.st_dev, ino_ = st.st_ino;
    return "";
  }
  ~PidFile() {
    struct stat st {};
    if (!path_.empty() && lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == dev_ &&
        st.st_ino == ino_)
      unlink(path_.c_str());
  }

 private:
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

class Agent {
 public:
  Agent(const AgentOptions& a, int node_rank, bool watch)
      : a_(a), node_rank_(node_rank), watch_(watch),
        sig_({SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {}
  int run();

 private:
  void start_ranks();
  void spawn_rank(RankProc& r, const std::vector<std::string>& base_env, int omp,
                  const std::vector<int>& cores);
  void loop_once();
  void reap();
  void check_liveness();
  void on_signal(int sig);
  void pump(OutStream& s, int out_fd, const std::string& prefix);
  void begin_teardown(int code, const std::string& why);
  void check_stdin();
  void emit(int fd, const std::string& s);
  int live() const;
  int open_streams() const;

  AgentOptions a_;
  int node_rank_;
  bool watch_;
  SignalPipe sig_;
  std::vector<RankProc> ranks_;
  int result_ = -1;
  bool teardown_ = false, head_lost_ = false;
  bool stdin_open_ = true;  // with a_.stop_on_stdin_eof: stdin not yet at end of input
  KillDeadline kill_at_;  // armed by begin_teardown; kills the ranks once
  double drain_deadline_ = 0;
  double next_heartbeat_ = 0;
  bool interrupted_ = false;  // stopped by a signal (not by a rank's failure)
  std::string cause_;         // why the teardown began
  std::unique_ptr<LivenessWatch> liveness_;

 public:
  bool interrupted() const { return interrupted_; }
  const std::string& cause() const { return cause_; }
};

int Agent::live() const {
  int n = 0;
  for (const auto& r : ranks_) n += (r.pid > 0 && !r.done);
  return n;
}

int Agent::open_streams() const {
  int n = 0;
  for (const auto& r : ranks_) n += (r.out.fd >= 0) + (r.err.fd >= 0);
  return n;
}

void Agent::emit(int fd, const std::string& s) {
  bool broken = false;
  write_all(fd, s, &broken);
  if (broken && watch_ && !head_lost_) {
    head_lost_ = true;
    begin_teardown(128 + SIGHUP, "lost the connection to the dsrun head");
  }
}

// stdin is readable: input is ignored; end of input (or an error) means the
// head closed our ssh channel, i.e. the job is being stopped.
void Agent::check_stdin() {
  char buf[4096];
  const ssize_t n = read(0, buf, sizeof buf);
  if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
  stdin_open_ = false;
  begin_teardown(128 + SIGHUP, "the dsrun head closed the connection (the job is stopping)");
}

void Agent::begin_teardown(int code, const std::string& why) {
  if (result_ < 0) result_ = code;
  if (teardown_) return;
  teardown_ = true;
  cause_ = why;
  int n = live();
  std::string msg = fmt::format("dsrun: {}", why);
  if (n > 0) msg += fmt::format("; stopping {} rank(s) on {}", n, ranks_.empty() ? "" : ranks_[0].info.host);
  emit(2, msg + "\n");
  for (auto& r : ranks_)
    if (r.pid > 0 && !r.done) {
      kill_group(r.pid, SIGTERM);
      kill_group(r.pid, SIGCONT);  // a stopped rank acts on its SIGTERM too
    }
  kill_at_.arm(a_.teardown_grace);
}

void Agent::spawn_rank(RankProc& r, const std::vector<std::string>& base_env, int omp,
                       const std::vector<int>& cores) {
  SpawnSpec spec;
  spec.argv = rank_argv(a_.program, a_.args, r.info.local_rank, a_.no_local_rank);
  EnvList env = rank_env(r.info, {a_.master_addr, a_.master_port, a_.job_token}, omp);
  // Always set, so a DS_HEARTBEAT_FILE inherited by this agent never reaches a rank.
  env.emplace_back(kHeartbeatFileEnv, liveness_->add_rank(r.info.rank));
  // Every line of the rank's output gets "[rank N] " here (unless it goes to a
  // file of its own), so its warnings leave their own rank prefix out.
  if (a_.each_rank_log.empty()) env.emplace_back("DS_OUTPUT_RANK_PREFIXED", "1");
  spec.env = merge_env(base_env, env);
  if (!cores.empty()) spec.cpus = cores_for_rank(cores, r.info.local_size, r.info.local_rank);
  int log_fd = -1, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
  if (!a_.each_rank_log.empty()) {
    std::string path = fmt::format("{}/rank_{}.log", a_.each_rank_log, r.info.rank);
    log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    // A SpawnError (exit 1, "error: ..."): exit code 127 means the program could not be run.
    if (log_fd < 0) throw SpawnError(fmt::format("--enable_each_rank_log: cannot write '{}': {}", path,
                                                 std::strerror(errno)));
    spec.stdout_fd = spec.stderr_fd = log_fd;
  } else {
    if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
      const int err = errno;
      for (int fd : {log_fd, out_p[0], out_p[1]})
        if (fd >= 0) close(fd);
      throw SpawnError(std::strerror(err));
    }
    spec.stdout_fd = out_p[1];
    spec.stderr_fd = err_p[1];
  }
  try {
    r.pid = spawn_process(spec);
    liveness_->started(&r - ranks_.data(), r.pid, now_seconds());
  } catch (...) {
    for (int fd : {log_fd, out_p[0], out_p[1], err_p[0], err_p[1]})
      if (fd >= 0) close(fd);
    throw;
  }
  if (log_fd >= 0) close(log_fd);
  if (out_p[0] >= 0) {
    close(out_p[1]);
    close(err_p[1]);
    fcntl(out_p[0], F_SETFL, O_NONBLOCK);
    fcntl(err_p[0], F_SETFL, O_NONBLOCK);
    r.out.fd = out_p[0];
    r.err.fd = err_p[0];
  }
}

void Agent::start_ranks() {
  ActiveResources active = decode_world_info(a_.world_info);
  for (auto& info : ranks_of_node(active, node_rank_)) ranks_.push_back({info, 0, false, {}, {}});
  std::vector<int> cores;
  int omp = 0;
  if (a_.bind_cores_to_rank || !a_.bind_core_list.empty()) {
    if (!a_.bind_core_list.empty()) {
      cores = parse_core_list(a_.bind_core_list);
    } else {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof(set), &set);
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cores.push_back(c);
    }
    omp = static_cast<int>(cores_for_rank(cores, static_cast<int>(ranks_.size()), 0).size());
  }
  if (!a_.each_rank_log.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a_.each_rank_log, ec);
    if (ec) throw SpawnError(fmt::format("--enable_each_rank_log: cannot create '{}': {}", a_.each_rank_log,
                                         ec.message()));
  }
  std::vector<std::string> base_env = environ_entries();
  liveness_ = std::make_unique<LivenessWatch>(a_.heartbeat_timeout);
  for (auto& r : ranks_) {
    if (teardown_) break;  // a signal arrived while starting
    try {
      spawn_rank(r, base_env, omp, cores);
    } catch (const SpawnError& e) {
      throw SpawnError(fmt::format("cannot start rank {}: {}", r.info.rank, e.what()));
    }
    for (int s : sig_.drain()) on_signal(s);
  }
}

void Agent::on_signal(int sig) {
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  if (teardown_ && (sig == SIGINT || sig == SIGTERM)) {
    kill_at_.hurry();  // asked twice: kill now
    return;
  }
  if (!teardown_) interrupted_ = true;
  begin_teardown(128 + sig, fmt::format("received {}", signal_name(sig)));
}

void Agent::reap() {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (auto& r : ranks_) {
      if (r.pid != pid) continue;
      r.done = true;
      if (liveness_) liveness_->exited(&r - ranks_.data());
      int code = exit_code_of(st);
      if (code != 0 && !teardown_)
        begin_teardown(code, fmt::format("rank {} (host {}, local rank {}) {}", r.info.rank, r.info.host,
                                         r.info.local_rank, describe_status(st)));
      kill_group(r.pid, SIGKILL);  // leftovers of a finished rank never outlive it
    }
  }
}

// A rank stalled: it is killed at once (a stopped or hung rank would not act
// on SIGTERM), the others are stopped as after a failure.
void Agent::check_liveness() {
  if (!liveness_ || teardown_) return;
  const std::optional<Stall> s = liveness_->check(now_seconds());
  if (!s) return;
  RankProc& r = ranks_.at(s->index);
  begin_teardown(kStallExitCode,
                 fmt::format("rank {} (host {}, local rank {}) {}", r.info.rank, r.info.host, r.info.local_rank, s->why));
  kill_group(r.pid, SIGKILL);
}

void Agent::pump(OutStream& s, int out_fd, const std::string& prefix) {
  char buf[65536];
  ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  bool eof = n <= 0;
  if (!eof) s.buf.append(buf, n);
  std::string out;
  size_t start = 0, nl;
  while ((nl = s.buf.find('\n', start)) != std::string::npos) {
    out += prefix;
    out.append(s.buf, start, nl - start + 1);
    start = nl + 1;
  }
  s.buf.erase(0, start);
  if (eof && !s.buf.empty()) out += prefix + s.buf + "\n", s.buf.clear();
  if (!out.empty()) emit(out_fd, out);
  if (eof) close(s.fd), s.fd = -1;
}

void Agent::loop_once() {
  std::vector<pollfd> fds = {{sig_.fd(), POLLIN, 0}};
  std::vector<std::pair<OutStream*, int>> streams;  // stream, output fd
  std::vector<std::string> prefixes;
  for (auto& r : ranks_) {
    for (auto [s, fd] : {std::pair{&r.out, 1}, std::pair{&r.err, 2}}) {
      if (s->fd < 0) continue;
      fds.push_back({s->fd, POLLIN, 0});
      streams.push_back({s, fd});
      prefixes.push_back(fmt::format("[rank {}] ", r.info.rank));
    }
  }
  const bool reading_stdin = a_.stop_on_stdin_eof && stdin_open_;
  if (reading_stdin) fds.push_back({0, POLLIN, 0});
  bool watching = watch_ && !head_lost_;
  if (watching) fds.push_back({1, 0, 0});
  int timeout = -1;
  double now = now_seconds();
  if (teardown_) timeout = kill_at_.poll_ms();
  if (live() == 0) timeout = std::max(0, static_cast<int>((drain_deadline_ - now) * 1000));
  if (a_.heartbeat > 0 && watching) {
    if (now >= next_heartbeat_) {
      emit(1, kHeartbeatLine);
      next_heartbeat_ = now + a_.heartbeat;
    }
    const int until = std::max(0, static_cast<int>(std::ceil((next_heartbeat_ - now) * 1000)));
    timeout = timeout < 0 ? until : std::min(timeout, until);
  }
  if (liveness_ && liveness_->on() && !teardown_) {
    const int until = liveness_->ms_to_next_check(now);
    timeout = timeout < 0 ? until : std::min(timeout, until);
  }
  int rc = poll(fds.data(), fds.size(), timeout);
  if (rc < 0 && errno != EINTR) DS_THROW("poll: {}", std::strerror(errno));
  if (rc > 0) {
    if (fds[0].revents) for (int s : sig_.drain()) on_signal(s);
    for (size_t i = 0; i < streams.size(); ++i)
      if (fds[i + 1].revents && streams[i].first->fd >= 0) pump(*streams[i].first, streams[i].second, prefixes[i]);
    if (reading_stdin && fds[streams.size() + 1].revents) check_stdin();
    if (watching && (fds.back().revents & (POLLERR | POLLHUP)) && !head_lost_) {
      head_lost_ = true;
      begin_teardown(128 + SIGHUP, "lost the connection to the dsrun head");
    }
  }
  check_liveness();
  if (kill_at_.due(-1)) {
    for (auto& r : ranks_)
      if (r.pid > 0 && !r.done) kill_group(r.pid, SIGKILL);
  }
}

int Agent::run() {
  PidFile pid_file;
  if (a_.save_pid > 0) {
    const std::string why = pid_file.create(fmt::format("/tmp/{}.deepspeed", a_.save_pid), guard_pid());
    if (!why.empty()) {  // before any rank starts
      emit(2, fmt::format("dsrun: error: {}\n", why));
      return 1;
    }
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  try {
    start_ranks();
  } catch (const UserError& e) {
    begin_teardown(127, e.what());
  } catch (const SpawnError& e) {  // e.g. out of file descriptors: stop what was started
    begin_teardown(1, fmt::format("error: {}", e.what()));
  } catch (const std::exception& e) {
    begin_teardown(1, fmt::format("cannot start the ranks: {}", e.what()));
  }
  drain_deadline_ = 0;
  while (live() > 0 || open_streams() > 0) {
    if (live() == 0 && drain_deadline_ == 0) drain_deadline_ = now_seconds() + 1.0;
    if (live() == 0 && now_seconds() >= drain_deadline_) break;  // a grandchild holds a pipe open
    loop_once();
  }
  for (auto& r : ranks_) {
    if (r.pid > 0) kill_group(r.pid, SIGKILL);
    for (OutStream* s : {&r.out, &r.err})
      if (s->fd >= 0) close(s->fd), s->fd = -1;
  }
  kill_all_adopted();
  liveness_.reset();  // the heartbeat files go with the ranks
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  return result_ < 0 ? 0 : result_;
}

bool names_match(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto shortname = [](const std::string& s) { return s.substr(0, s.find('.')); };
  return shortname(a) == shortname(b);
}

}  // namespace

int resolve_node_rank(const AgentOptions& a, const ActiveResources& active) {
  int given = (a.node_rank >= 0) + !a.node_name.empty() + !a.node_name_env.empty() + !a.node_rank_env.empty();
  DS_USER_CHECK(given == 1, "dsrun --agent: give exactly one of --node_rank, --node_name, "
                            "--node_name_env, --node_rank_env");
  int n = a.node_rank;
  std::string name = a.node_name;
  auto env = [](const std::string& var) {
    const char* v = std::getenv(var.c_str());
    DS_USER_CHECK(v && *v, "dsrun --agent: environment variable {} is not set on this node", var);
    return std::string(v);
  };
  if (!a.node_name_env.empty()) name = env(a.node_name_env);
  if (!a.node_rank_env.empty()) {
    std::string v = env(a.node_rank_env);
    char* end;
    n = static_cast<int>(std::strtol(v.c_str(), &end, 10));
    DS_USER_CHECK(*end == 0, "dsrun --agent: {}='{}' is not a node rank", a.node_rank_env, v);
  }
  if (!name.empty()) {
    n = -1;
    for (size_t i = 0; i < active.size() && n < 0; ++i)
      if (active[i].host == name) n = static_cast<int>(i);
    for (size_t i = 0; i < active.size() && n < 0; ++i)
      if (names_match(active[i].host, name)) n = static_cast<int>(i);
    DS_USER_CHECK(n >= 0, "dsrun --agent: node '{}' is not one of the job's hosts", name);
  }
  DS_USER_CHECK(n >= 0 && n < static_cast<int>(active.size()),
                "dsrun --agent: node rank {} is out of range (the job has {} nodes)", n, active.size());
  return n;
}

int run_agent(const AgentOptions& a, int node_rank, bool watch_hangup, AgentEnd* end) {
  signal(SIGPIPE, SIG_IGN);
  Agent agent(a, node_rank, watch_hangup);
  const int code = agent.run();
  if (end) *end = {agent.interrupted(), agent.cause()};
  return code;
}

// Runs this binary again with the same arguments minus the secret-delivery
// flags and with `env` added to the environment, so the agent and its ranks
// carry the variables in their environment like any other (never in argv).
// Returns only if exec fails (the variables are set in-process then).
static void reexec_with_env(int argc, char** argv, const EnvList& env) {
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  bool program = false;
  for (int i = 0; i < argc; ++i) {
    const std::string w = argv[i];
    program = program || w == "--";
    if (!program && (w == "--env_from_stdin" || w.rfind("--env_file=", 0) == 0)) continue;
    if (!program && w == "--env_file") {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  args.push_back(nullptr);
  std::fflush(nullptr);
  execv("/proc/self/exe", args.data());
}

int agent_main(int argc, char** argv) {
  AgentOptions a;
  if (!parse_agent_options(argc, argv, &a)) return 0;
  int node = resolve_node_rank(a, decode_world_info(a.world_info));
  if (a.env_from_stdin || !a.env_file.empty()) {  // ssh: stdin; pdsh: a private file
    EnvList env = a.env_from_stdin ? read_env_lines(0) : take_private_env_file(fmt::format("{}.{}", a.env_file, node));
    reexec_with_env(argc, argv, env);
  }
  if (a.job_token.empty()) {
    const char* t = std::getenv("DS_JOB_TOKEN");
    DS_USER_CHECK(t && *t, "dsrun --agent: no job token (DS_JOB_TOKEN is not set in the agent's environment)");
    a.job_token = t;
  }
  struct stat st {};
  bool watch = fstat(1, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
  return run_guarded([&] { return run_agent(a, node, watch); });
}

}  // namespace ds::launch
