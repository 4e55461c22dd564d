// Resuming the learning-rate schedule, with Megatron's rules: the counters
// always come from the checkpoint; the schedule's values (peak and minimum
// lr, warmup and decay lengths, decay style) must equal the command line's,
// unless --override-opt_param-scheduler (take the flags) or
// --use-checkpoint-opt_param-scheduler (take the checkpoint) picks a side.
#pragma once
#include "lib/ckpt/state_json.h"
#include "lib/config/config.h"

namespace ds {

// Applies the rules to cfg.optim for a run that loaded `loaded`. Throws
// UserError naming every differing value when no side was picked. Returns a
// log line describing what was done ("" when there was nothing to say).
std::string reconcile_lr_schedule(TrainConfig& cfg, const TrainState& loaded);

// Fills the counters of a checkpoint written before they were saved
// (lr_clock.samples < 0): from the applied steps and the global batch.
void fill_legacy_lr_clock(const TrainConfig& cfg, TrainState& st);

}  // namespace ds
