// Test helper: starts N copies of the ds_comm_worker program (next to the test
// binary) as ranks of one job on 127.0.0.1, with the dsrun rank environment,
// waits for them with a deadline, and returns each rank's exit code and output.
// Children die with the test (PR_SET_PDEATHSIG) and are killed and reaped on
// timeout, so no process is left behind.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ds::test {

struct RankResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr
};

struct JobResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  double seconds = 0;
  std::string summary() const;  // every rank's code and output, for failure messages
};

struct JobSpec {
  std::string scenario;
  int world = 2;
  double timeout_s = 30;
  std::map<std::string, std::string> env;                   // for all ranks
  std::map<int, std::map<std::string, std::string>> rank_env;  // per rank overrides
  int port = 0;  // 0: pick a free one
};

JobResult run_job(const JobSpec& spec);
int free_port();

}  // namespace ds::test
