// Process plumbing: spawn with exec-error pipe, signal pipe, status decoding, group kills.
#include "launcher/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "lib/core/error.h"

extern char** environ;

namespace ds::launch {
namespace {

int g_signal_write_fd = -1;

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_write_fd >= 0) (void)!write(g_signal_write_fd, &b, 1);
  errno = saved;
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Runs in the forked child: only async-signal-safe calls until exec.
[[noreturn]] void child_exec(const SpawnSpec& spec, char** argv, char** envp, pid_t parent,
                             int err_fd, const cpu_set_t* cpus) {
  if (spec.new_group) setpgid(0, 0);
  if (spec.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (cpus) sched_setaffinity(0, sizeof(cpu_set_t), cpus);
  if (spec.stdout_fd >= 0) dup2(spec.stdout_fd, 1);
  if (spec.stderr_fd >= 0) dup2(spec.stderr_fd, 2);
  execvpe(argv[0], argv, envp);
  int e = errno;
  (void)!write(err_fd, &e, sizeof(e));
  _exit(127);
}

}  // namespace

SignalPipe::SignalPipe(const std::vector<int>& signals) : signals_(signals) {
  int fds[2];
  DS_CHECK(pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2: {}", std::strerror(errno));
  read_fd_ = fds[0];
  g_signal_write_fd = fds[1];
  for (int s : signals_) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (s == SIGCHLD ? SA_NOCLDSTOP : 0);
    auto* old = new struct sigaction;
    sigaction(s, &sa, old);
    old_.push_back(old);
  }
}

SignalPipe::~SignalPipe() {
  for (size_t i = 0; i < signals_.size(); ++i) {
    sigaction(signals_[i], old_[i], nullptr);
    delete old_[i];
  }
  close(g_signal_write_fd);
  g_signal_write_fd = -1;
  close(read_fd_);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = read(read_fd_, buf, sizeof(buf))) > 0)
    for (ssize_t i = 0; i < n; ++i) out.push_back(buf[i]);
  return out;
}

pid_t spawn_process(const SpawnSpec& spec) {
  DS_CHECK(!spec.argv.empty(), "spawn_process: empty argv");
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : spec.cpus) CPU_SET(c, &set);
  int errp[2];
  if (pipe2(errp, O_CLOEXEC) != 0) throw SpawnError(std::strerror(errno));
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) child_exec(spec, argv.data(), envp.data(), parent, errp[1], spec.cpus.empty() ? nullptr : &set);
  close(errp[1]);
  if (pid < 0) {
    const int err = errno;
    close(errp[0]);
    throw SpawnError(fmt::format("fork: {}", std::strerror(err)));
  }
  if (spec.new_group) setpgid(pid, pid);  // also here: no window where the group does not exist
  int child_errno = 0;
  ssize_t n;
  do n = read(errp[0], &child_errno, sizeof(child_errno));
  while (n < 0 && errno == EINTR);
  close(errp[0]);
  if (n > 0) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    DS_USER_ERROR("cannot run '{}': {}", spec.argv[0], std::strerror(child_errno));
  }
  return pid;
}

int exit_code_of(int wstatus) {
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  return 255;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_status(int wstatus) {
  if (WIFSIGNALED(wstatus))
    return fmt::format("killed by {} (exit code {})", signal_name(WTERMSIG(wstatus)), exit_code_of(wstatus));
  return fmt::format("exit code {}", exit_code_of(wstatus));
}

void kill_group(pid_t pgid, int sig) {
  if (pgid > 1) kill(-pgid, sig);
}

void kill_tree(pid_t pid, int sig) {
  for (pid_t d : descendants_of(pid)) kill(d, sig);
  kill_group(pid, sig);
}

void KillDeadline::arm(double grace) {
  if (at_ < 0) at_ = now_seconds() + grace;
}

void KillDeadline::hurry() {
  if (at_ >= 0) at_ = now_seconds();
}

int KillDeadline::poll_ms() const {
  return at_ < 0 ? -1 : std::max(0, static_cast<int>(std::ceil((at_ - now_seconds()) * 1000)));
}

bool KillDeadline::due(double again) {
  const double now = now_seconds();
  if (at_ < 0 || now < at_) return false;
  at_ = again < 0 ? -1 : now + again;
  return true;
}

double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::vector<std::string> environ_entries() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

std::vector<std::string> merge_env(const std::vector<std::string>& base,
                                   const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> out;
  out.reserve(base.size() + overrides.size());
  for (const auto& e : base) {
    std::string name = e.substr(0, e.find('='));
    bool replaced = false;
    for (const auto& kv : overrides) replaced = replaced || kv.first == name;
    if (!replaced) out.push_back(e);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

char process_state(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const size_t rp = line.rfind(')');  // the name may hold spaces and parentheses
  return rp == std::string::npos || rp + 2 >= line.size() ? 0 : line[rp + 2];
}

namespace {

// (pid, ppid) of every process.
std::vector<std::pair<pid_t, pid_t>> process_table() {
  std::vector<std::pair<pid_t, pid_t>> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* ent = readdir(d)) {
    char* end;
    long pid = std::strtol(ent->d_name, &end, 10);
    if (*end || pid <= 1) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    if (!std::getline(stat, line)) continue;
    size_t rp = line.rfind(')');
    char state;
    long ppid = 0;
    if (rp == std::string::npos || sscanf(line.c_str() + rp + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (state != 'Z') out.emplace_back(static_cast<pid_t>(pid), static_cast<pid_t>(ppid));
  }
  closedir(d);
  return out;
}

}  // namespace

std::vector<pid_t> descendants_of(pid_t root) {
  auto table = process_table();
  std::vector<pid_t> out = {root};
  for (size_t i = 0; i < out.size(); ++i)
    for (const auto& [pid, ppid] : table)
      if (ppid == out[i]) out.push_back(pid);
  out.erase(out.begin());
  return out;
}

int kill_adopted_children() {
  pid_t self = getpid();
  std::vector<pid_t> killed;
  DIR* d = opendir("/proc");
  if (!d) return 0;
  while (dirent* ent = readdir(d)) {
    char* end;
    long pid = std::strtol(ent->d_name, &end, 10);
    if (*end || pid <= 1 || pid == self) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    if (!std::getline(stat, line)) continue;
    size_t rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    char state;
    long ppid = 0;
    if (sscanf(line.c_str() + rp + 1, " %c %ld", &state, &ppid) != 2 || ppid != self) continue;
    if (kill(static_cast<pid_t>(pid), SIGKILL) == 0) killed.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  for (pid_t pid : killed) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  }
  return static_cast<int>(killed.size());
}

}  // namespace ds::launch
