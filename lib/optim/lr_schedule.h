// Learning-rate schedules: Megatron's (linear warmup, then constant / linear /
// cosine decay to min_lr) and DeepSpeed's WarmupLR, WarmupDecayLR and
// WarmupCosineLR, as pure functions of the step number so that resuming from a
// checkpoint needs no scheduler state beyond the iteration count.
#pragma once
#include <cstdint>

#include "lib/optim/optimizer_config.h"

namespace ds {

// The learning rate for the optimizer step `iteration` (0-based: the step about
// to be taken). o.scheduler_type picks the family: "" = Megatron style, else the
// named DeepSpeed scheduler. train_iters stands in for o.decay_iters when 0.
float lr_at(const OptimizerConfig& o, int64_t iteration, int64_t train_iters);

}  // namespace ds
