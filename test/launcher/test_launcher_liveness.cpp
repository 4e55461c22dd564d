// The agent's liveness watch (launcher/liveness.h) on real local launches: a
// rank that stops itself (SIGSTOP) or that opted in to the heartbeat and then
// hangs ends the job with exit code 124 and one line naming it, within about
// --heartbeat_timeout; --max_restarts restarts it; slow but live ranks, ranks
// that never opt in and paused heartbeats are left alone; the heartbeat files
// go with the job.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "test/launcher/test_util.h"

using namespace ds::launch::test;
namespace fs = std::filesystem;

namespace {

struct Job {
  TempDir dir;
  std::string token = new_token();
  std::string hostfile;
  explicit Job(int slots) {
    hostfile = dir.path() + "/hosts";
    write_file(hostfile, "localhost slots=" + std::to_string(slots) + "\n");
  }
  RunResult run(std::vector<std::string> flags, const std::vector<std::string>& prog, double timeout = 30,
                std::function<void(pid_t)> during = nullptr) const {
    std::vector<std::string> argv = {dsrun_bin(), "--hostfile", hostfile, "--teardown_grace", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(probe_bin());
    argv.insert(argv.end(), prog.begin(), prog.end());
    return run_cmd(argv, {{"DS_JOB_TOKEN", token}}, timeout, during);
  }
  void check_no_leftovers() const { CHECK(kill_leftovers(token).empty()); }
};

// The heartbeat file rank `rank` was given ("heartbeat PATH" in its output).
std::string heartbeat_of(const RunResult& r, int rank) {
  const std::string key = "[rank " + std::to_string(rank) + "] heartbeat ";
  const size_t at = r.out.find(key);
  if (at == std::string::npos) return "";
  return r.out.substr(at + key.size(), r.out.find('\n', at) - at - key.size());
}

}  // namespace

TEST_CASE("liveness: a rank that stops itself ends the job with 124 and one line naming it", "[launcher]") {
  Job job(2);
  auto r = job.run({"--heartbeat_timeout", "2"}, {"stop", "1"});
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("dsrun: rank 1 (host localhost, local rank 1) has been stopped (process state T: "
                                    "SIGSTOP or SIGTSTP) for "));
  CHECK_THAT(r.err, Catch::Contains(" s, over --heartbeat_timeout 2; stopping 2 rank(s) on localhost"));
  CHECK(r.seconds >= 2);
  CHECK(r.seconds < 5);
  const std::string hb = heartbeat_of(r, 1);
  CHECK_THAT(hb, Catch::Contains("/dsrun-hb-"));
  CHECK_FALSE(fs::exists(fs::path(hb).parent_path()));  // the files went with the job
  job.check_no_leftovers();
}

TEST_CASE("liveness: --max_restarts restarts a stalled job like a failed one", "[launcher]") {
  Job job(2);
  const std::string once = job.dir.path() + "/stopped_once";
  auto r = job.run({"--heartbeat_timeout", "2", "--max_restarts", "1"}, {"stop", "1", once});
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 1 after rank 1 (host localhost, local rank 1) has been "
                                    "stopped (process state T: SIGSTOP or SIGTSTP) for "));
  CHECK_THAT(r.err, Catch::Contains("dsrun: the job finished after 1 restart(s)"));
  CHECK(r.seconds < 7);
  job.check_no_leftovers();
}

TEST_CASE("liveness: with no restarts left the stall's code is dsrun's", "[launcher]") {
  Job job(2);
  auto r = job.run({"--heartbeat_timeout", "1", "--max_restarts", "1"}, {"stop", "0"});
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("dsrun: attempt 2 ended with rank 0 (host localhost, local rank 0) has been "
                                    "stopped"));
  CHECK_THAT(r.err, Catch::Contains("no restarts left (--max_restarts 1); exit code 124"));
  job.check_no_leftovers();
}

TEST_CASE("liveness: a one-rank job that opted in and then hangs is stopped", "[launcher]") {
  Job job(1);
  auto r = job.run({"--heartbeat_timeout", "2"}, {"beat_then_hang"});
  CHECK(r.code == 124);
  CHECK_THAT(r.err, Catch::Contains("dsrun: rank 0 (host localhost, local rank 0) touched no heartbeat for "));
  CHECK_THAT(r.err, Catch::Contains(" s, over --heartbeat_timeout 2: it is hung or deadlocked; stopping 1 rank(s)"));
  CHECK(r.seconds >= 2);
  CHECK(r.seconds < 5);
  job.check_no_leftovers();
}

TEST_CASE("liveness: slow but live ranks are left alone", "[launcher]") {
  Job job(2);
  SECTION("beating more often than the timeout") {
    auto r = job.run({"--heartbeat_timeout", "1"}, {"beat", "3"});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
  }
  SECTION("never opting in (any program): only the process state is watched") {
    auto r = job.run({"--heartbeat_timeout", "1"}, {"sleep", "3"});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
  }
  SECTION("a heartbeat paused (file removed) for longer than the timeout") {
    auto r = job.run({"--heartbeat_timeout", "1"}, {"pause", "3"});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
  }
  job.check_no_leftovers();
}

TEST_CASE("liveness: --heartbeat_timeout 0 turns the watch off", "[launcher]") {
  Job job(1);
  bool still_stopped = false;
  auto r = job.run({"--heartbeat_timeout", "0"}, {"stop", "0"}, 30, [&](pid_t) {
    usleep(2500000);
    for (pid_t p : pids_with_token(job.token)) {
      if (read_file("/proc/" + std::to_string(p) + "/stat").find(") T ") == std::string::npos) continue;
      still_stopped = true;
      kill(p, SIGCONT);
    }
  });
  CHECK(still_stopped);
  CHECK(r.code == 0);
  CHECK(heartbeat_of(r, 0).empty());  // no file: DS_HEARTBEAT_FILE is set empty
  job.check_no_leftovers();
}

TEST_CASE("liveness: a bad --heartbeat_timeout is one line naming it", "[launcher]") {
  Job job(1);
  for (const char* bad : {"0.5", "-1", "nan", "90000"}) {
    auto r = job.run({"--heartbeat_timeout", bad}, {"sleep", "0"});
    CHECK(r.code == 1);
    CHECK(r.err == "dsrun: error: --heartbeat_timeout " + std::string(bad == std::string("nan") ? "nan" : bad) +
                       " must be 0 (off) or between 1 and 86400 seconds\n");
  }
}
