// Learning-rate schedules: Megatron's (linear warmup, then constant / linear /
// cosine / inverse-square-root decay to min_lr) and DeepSpeed's WarmupLR,
// WarmupDecayLR, WarmupCosineLR, OneCycle (with its momentum cycle) and
// LRRangeTest, as pure functions of a few counters, so that resuming from a
// checkpoint needs only those counters (LrClock, saved in state.json).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "lib/optim/optimizer_config.h"

namespace ds {

// The learning rate for the optimizer step `iteration` (0-based: the step about
// to be taken), with warmup and decay counted in iterations (o.warmup_iters,
// o.decay_iters). o.scheduler picks the family: Megatron's or the named DeepSpeed
// scheduler. train_iters stands in for o.decay_iters when 0.
float lr_at(const OptimizerConfig& o, int64_t iteration, int64_t train_iters);

// The counters of Megatron-DeepSpeed's OptimizerParamScheduler, advanced once
// per applied optimizer step (a skipped step advances nothing).
struct LrClock {
  int64_t steps = 0;    // applied optimizer steps
  int64_t samples = 0;  // Megatron's num_steps: samples of the applied steps
  // Megatron-DeepSpeed's num_tokens: the tokens consumed before the iteration
  // of the last applied step (its scheduler reads the counter before the
  // iteration's tokens are added).
  int64_t tokens = 0;
  // With a sample-wise warmup and a token-wise decay, Megatron-DeepSpeed takes
  // the token count at the step where the warmup ends as the decay's start.
  int64_t warmup_end_tokens = -1;
};

// The learning rate for the next optimizer step. DeepSpeed schedulers count
// clock.steps; Megatron's schedule counts samples (o.warmup_samples,
// o.decay_samples) or tokens (o.warmup_tokens / o.decay_tokens when >= 0).
float lr_at(const OptimizerConfig& o, const LrClock& clock);

// Advances the clock after an applied step of `samples` samples taken in an
// iteration that started with `tokens_before` tokens consumed.
void advance_lr_clock(const OptimizerConfig& o, LrClock& clock, int64_t samples, int64_t tokens_before);

// OneCycle with cycle_momentum on an optimizer with betas (Adam, AdamW, Lamb,
// Lion; DeepSpeed leaves SGD's and Adagrad's momentum alone, with a warning).
bool cycles_momentum(const OptimizerConfig& o);
// The (beta1, beta2) OneCycle sets for the next step when cycles_momentum(o):
// beta1 cycles inversely to the learning rate between cycle_min_mom and
// cycle_max_mom and beta2 is 0.99, as DeepSpeed writes (momentum, 0.99) into
// the optimizer's betas; none otherwise.
std::optional<std::pair<float, float>> betas_at(const OptimizerConfig& o, const LrClock& clock);

// The schedule values Megatron's OptimizerParamScheduler compares with the
// command line when it resumes (its state_dict, lengths in samples / tokens).
struct LrScheduleValues {
  double max_lr = 0, min_lr = 0;
  int64_t warmup_samples = 0, decay_samples = 0, warmup_tokens = -1, decay_tokens = -1;
  std::string decay_style;
  bool operator==(const LrScheduleValues&) const = default;
};

// The values of the Megatron schedule `o` (o.scheduler must be LrScheduler::Megatron).
LrScheduleValues lr_schedule_values(const OptimizerConfig& o);

}  // namespace ds
