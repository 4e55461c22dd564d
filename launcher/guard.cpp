// The guard/worker split of a dsrun process (guard.h).
#include "launcher/guard.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "launcher/liveness.h"
#include "launcher/process.h"

namespace ds::launch {
namespace {

volatile sig_atomic_t g_worker = 0;
pid_t g_guard = 0;  // set in the worker

// kill() from another process is forwarded; the terminal's own signals
// (si_code > 0, e.g. SI_KERNEL for Ctrl-C) already reach the worker.
void forward(int sig, siginfo_t* info, void*) {
  if (g_worker > 0 && info && info->si_code <= 0 && info->si_pid != g_worker) kill(g_worker, sig);
}

void install_forwarding() {
  struct sigaction sa {};
  sa.sa_sigaction = forward;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
}

int guard_exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int guard_pid() { return g_guard > 0 ? g_guard : getpid(); }

int kill_all_adopted() {
  int total = 0;
  for (int round = 0; round < 200; ++round) {  // ~2 s at most
    const int n = kill_adopted_children();
    total += n;
    if (n == 0) break;
    usleep(10000);
  }
  return total;
}

int run_guarded(const std::function<int()>& fn) {
  const pid_t guard = getpid();
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::fflush(nullptr);
  const pid_t worker = fork();
  if (worker < 0) return fn();  // no process to spare: run unguarded rather than not at all
  if (worker == 0) {
    g_guard = guard;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != guard) raise(SIGTERM);  // the guard died before prctl took effect
    const int rc = fn();
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  g_worker = worker;
  install_forwarding();
  int status = 0;
  while (waitpid(worker, &status, 0) < 0) {
    if (errno != EINTR) return 1;
  }
  kill_all_adopted();  // whatever the worker's ranks left behind
  if (WIFSIGNALED(status)) remove_heartbeat_dirs_of(worker);  // it had no chance to
  return guard_exit_code(status);
}

}  // namespace ds::launch
