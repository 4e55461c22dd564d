// Process plumbing for the agent and the head: spawning a program in its own
// process group (with exec errors reported to the parent), signals delivered
// through a pipe so one poll() loop sees everything, exit-status decoding,
// and group kills by id. Linux only.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace ds::launch {

// Installs handlers for `signals` that write the signal number to a pipe.
// Only one SignalPipe may exist at a time; the destructor restores the old handlers.
class SignalPipe {
 public:
  explicit SignalPipe(const std::vector<int>& signals);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int fd() const { return read_fd_; }
  std::vector<int> drain();  // signals received since the last drain

 private:
  int read_fd_ = -1;
  std::vector<int> signals_;
  std::vector<struct ::sigaction*> old_;
};

struct SpawnSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // complete environment, NAME=value
  int stdout_fd = -1;            // -1: inherit
  int stderr_fd = -1;
  std::vector<int> cpus;         // non-empty: sched_setaffinity to these cores
  bool new_group = true;         // setpgid(0, 0): the child leads its own group
  bool die_with_parent = true;   // PR_SET_PDEATHSIG(SIGKILL)
};

// The system refused the resources for a new process (file descriptors for
// its pipes, fork: process limit, memory). what() is the reason alone
// (strerror), for the caller to name what it was starting.
class SpawnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Forks and execs (PATH search). If exec fails the child is reaped and a
// ds::UserError "cannot run 'PROG': reason" is thrown; SpawnError when the
// pipe or the fork fails.
pid_t spawn_process(const SpawnSpec& spec);

// 128+signal for a signal death (shell convention), else the exit status.
int exit_code_of(int wstatus);
// "exit code 3" or "killed by SIGSEGV (exit code 139)".
std::string describe_status(int wstatus);
std::string signal_name(int sig);

// kill(-pgid, sig), ignoring groups that are already gone.
void kill_group(pid_t pgid, int sig);
// `sig` to every live descendant of `pid`, then to its process group: a
// launcher (pdsh runs each ssh in a group of its own) or a dsrun with all it started.
void kill_tree(pid_t pid, int sig);
// Monotonic seconds.
double now_seconds();

// The kill deadline of a teardown, the one rule the agent (its ranks), the
// head (the launcher process tree) and the autotuner (one dsrun) supervise
// by: once the processes were asked to stop, they are killed when the grace
// runs out, and at once when the stop is asked for again. Each loop polls
// with poll_ms() and kills when due() says so.
class KillDeadline {
 public:
  bool armed() const { return at_ >= 0; }
  // The kill is due `grace` seconds from now (nothing when already armed).
  void arm(double grace);
  // A second request to stop: the kill is due now (when armed).
  void hurry();
  // Milliseconds until the kill is due, rounded up: a poll() timeout; -1 when not armed.
  int poll_ms() const;
  // Whether the kill is due; if so, the next one is due `again` seconds
  // later, or never (again < 0).
  bool due(double again);

 private:
  double at_ = -1;
};
// The current environment as NAME=value strings.
std::vector<std::string> environ_entries();
// `base` with each NAME=value of `overrides` replacing or adding that variable.
std::vector<std::string> merge_env(const std::vector<std::string>& base,
                                   const std::vector<std::pair<std::string, std::string>>& overrides);
// The state letter of /proc/PID/stat (R, S, D, T stopped, t traced, Z...), 0 when gone.
char process_state(pid_t pid);
// Every live descendant of `root` (children, grandchildren, ...), found through /proc.
std::vector<pid_t> descendants_of(pid_t root);
// Sends SIGKILL to every process whose parent is this process (orphans that we
// adopted as subreaper) and reaps them. Returns how many were killed.
int kill_adopted_children();

}  // namespace ds::launch
