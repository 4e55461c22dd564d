// Process launcher for the multi-process communication tests.
#include "test/comm/proc_harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ds::test {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

static std::string worker_path() {
  char buf[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.rfind('/')) + "/ds_comm_worker";
}

static std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string JobResult::summary() const {
  std::string s = timed_out ? "job TIMED OUT\n" : "";
  for (size_t r = 0; r < ranks.size(); ++r)
    s += "--- rank " + std::to_string(r) + " exit " + std::to_string(ranks[r].exit_code) + "\n" +
         ranks[r].output;
  return s;
}

// Child side: rank environment, output to `out`, then exec the worker.
[[noreturn]] static void exec_rank(const JobSpec& spec, int rank, int port, const std::string& out,
                                   const std::string& exe) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(spec.world)},
      {"LOCAL_RANK", std::to_string(rank)},  {"LOCAL_SIZE", std::to_string(spec.world)},
      {"MASTER_ADDR", "127.0.0.1"},          {"MASTER_PORT", std::to_string(port)},
      {"DS_JOB_TOKEN", "test-token"},        {"DS_RENDEZVOUS_TIMEOUT", "20"},
      {"DS_COMM_TIMEOUT", "20"}};
  for (const auto& [k, v] : spec.env) env[k] = v;
  if (auto it = spec.rank_env.find(rank); it != spec.rank_env.end())
    for (const auto& [k, v] : it->second) env[k] = v;
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  execl(exe.c_str(), exe.c_str(), spec.scenario.c_str(), static_cast<char*>(nullptr));
  _exit(127);
}

JobResult run_job(const JobSpec& spec) {
  auto t0 = std::chrono::steady_clock::now();
  const int port = spec.port ? spec.port : free_port();
  const std::string exe = worker_path();
  char dir_tmpl[] = "/tmp/ds_comm_test_XXXXXX";
  std::string dir = mkdtemp(dir_tmpl);
  std::vector<pid_t> pids(spec.world, -1);
  std::vector<std::string> outs(spec.world);
  for (int r = 0; r < spec.world; ++r) {
    outs[r] = dir + "/rank" + std::to_string(r) + ".log";
    pid_t pid = fork();
    if (pid == 0) exec_rank(spec, r, port, outs[r], exe);
    pids[r] = pid;
  }
  JobResult res;
  res.ranks.resize(spec.world);
  auto deadline = t0 + std::chrono::duration<double>(spec.timeout_s);
  int left = spec.world;
  while (left > 0) {
    for (int r = 0; r < spec.world; ++r) {
      if (pids[r] < 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res.ranks[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      res.timed_out = true;
      for (int r = 0; r < spec.world; ++r)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      for (int r = 0; r < spec.world; ++r)
        if (pids[r] > 0) waitpid(pids[r], nullptr, 0);
      break;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < spec.world; ++r) {
    res.ranks[r].output = slurp(outs[r]);
    unlink(outs[r].c_str());
  }
  rmdir(dir.c_str());
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace ds::test
