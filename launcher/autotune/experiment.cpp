// Child processes of the autotuner: estimates and experiments with logs and timeouts.
#include "launcher/autotune/experiment.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "launcher/process.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds::launch::autotune {
namespace {

int open_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_USER_CHECK(fd >= 0, "cannot create '{}': {}", path, std::strerror(errno));
  return fd;
}

}  // namespace

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    DS_USER_CHECK(f.good(), "cannot write '{}'", tmp);
    f << text;
    DS_USER_CHECK(f.good(), "cannot write '{}'", tmp);
  }
  DS_USER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot write '{}'", path);
}

std::string last_error_line(const std::string& path) {
  std::istringstream in(slurp(path));
  std::string line, last, err;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (line.find("error") != std::string::npos || line.find("Error") != std::string::npos) err = line;
  }
  return err.empty() ? last : err;
}

ProcessResult run_logged(const std::vector<std::string>& argv, const EnvPairs& env, const std::string& out_path,
                         const std::string& err_path, double timeout_s, double grace) {
  ProcessResult r;
  SignalPipe sig({SIGINT, SIGTERM, SIGHUP});
  const int out_fd = open_log(out_path), err_fd = open_log(err_path);
  SpawnSpec spec{argv, merge_env(environ_entries(), env), out_fd, err_fd, {}, true, true};
  pid_t pid;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    close(out_fd), close(err_fd);
    throw;
  }
  close(out_fd);
  close(err_fd);
  const double t0 = now_seconds();
  KillDeadline kill_at;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (!r.timed_out && !r.interrupted && now_seconds() - t0 > timeout_s) {
      r.timed_out = true;
      kill(pid, SIGTERM);  // dsrun tears its ranks down
      kill_at.arm(grace + 5);
    }
    if (kill_at.due(5)) kill_tree(pid, SIGKILL);
    pollfd fd{sig.fd(), POLLIN, 0};
    if (poll(&fd, 1, 100) > 0)
      for (int s : sig.drain()) {
        if (!r.interrupted) kill(pid, s);
        else kill_tree(pid, SIGKILL);  // a second signal: stop at once
        r.interrupted = s;
        kill_at.arm(grace + 5);
      }
  }
  r.code = exit_code_of(status);
  r.seconds = now_seconds() - t0;
  return r;
}

std::optional<nlohmann::json> run_estimate(const std::string& program, const std::vector<std::string>& args,
                                           int world, int local_size, const std::string& json_path,
                                           std::string* error) {
  std::vector<std::string> argv = {program, "--estimate-memory"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::remove(json_path.c_str());
  const EnvPairs env = {{"WORLD_SIZE", std::to_string(world)},
                        {"RANK", "0"},
                        {"LOCAL_RANK", "0"},
                        {"LOCAL_SIZE", std::to_string(local_size)},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"DS_AUTOTUNING_ESTIMATE_PATH", json_path}};
  const std::string err = json_path + ".stderr.log";
  ProcessResult r = run_logged(argv, env, json_path + ".stdout.log", err, 120, 2);
  if (r.interrupted) throw Interrupted{r.interrupted};
  if (r.code != 0 || access(json_path.c_str(), R_OK) != 0) {
    *error = r.code == 0 ? "PROGRAM --estimate-memory wrote no estimate (is PROGRAM dstrain?)" : last_error_line(err);
    if (error->empty()) *error = fmt::format("PROGRAM --estimate-memory exited with code {}", r.code);
    return std::nullopt;
  }
  return load_json_file(json_path);
}

}  // namespace ds::launch::autotune
