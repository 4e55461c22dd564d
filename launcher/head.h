// dsrun's head: gathers the machine snapshot, makes the plan, and runs it
// through the chosen transport while watching every node.
#pragma once
#include "launcher/plan.h"

namespace ds::launch {

// Reads hostfile, environment, .deepspeed_env files, GPU count and local names.
PlanInputs gather_inputs(const Options& o);

// Number of NVIDIA GPUs visible through /proc or /dev (no CUDA linked).
int count_local_gpus();

// The whole program: `dsrun --agent ...` or the head. Returns the exit code.
int dsrun_main(int argc, char** argv);

}  // namespace ds::launch
