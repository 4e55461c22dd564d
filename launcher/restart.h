// --max_restarts and --elastic_training: run the job, and after a failure tear
// it down and launch it again (on the hosts that remain, for an elastic job),
// logging every restart. See docs/dsrun.md, "Restarts and elastic training".
#pragma once
#include "launcher/plan.h"

namespace ds::launch {

// Runs `first` (planned from `in`), restarting it up to in.opts.max_restarts
// times. Returns the exit code of the last attempt.
int run_with_restarts(const PlanInputs& in, LaunchPlan first);

}  // namespace ds::launch
