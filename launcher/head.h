// dsrun's head: gathers the machine snapshot, makes the plan, and runs it
// through the chosen transport while watching every node.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "launcher/plan.h"
#include "launcher/ssh_transport.h"

namespace ds::launch {

// Reads hostfile, environment, .deepspeed_env files, GPU count and local names.
PlanInputs gather_inputs(const Options& o);

// Number of NVIDIA GPUs visible through /proc or /dev (no CUDA linked).
int count_local_gpus();

// How one launch of a plan ended.
struct AttemptResult {
  int code = 0;              // the job's exit code (docs/dsrun.md, Exit codes)
  bool interrupted = false;  // dsrun itself got SIGINT/SIGTERM/SIGHUP: never restarted
  int failed_node = -1;      // index in plan.active of the node whose failure ended it, when known
  bool heartbeat_lost = false;  // that node stopped answering (ssh)
  std::string cause;         // one line for the restart log
};

// Runs plan p once through its transport. conns (ssh only): connections to
// p.active's hosts in order, already open; empty: connect here.
AttemptResult run_attempt(LaunchPlan& p, const PlanInputs& in,
                          std::vector<std::unique_ptr<SshConnection>> conns = {});

// The whole program: `dsrun --agent ...` or the head. Returns the exit code.
int dsrun_main(int argc, char** argv);

}  // namespace ds::launch
