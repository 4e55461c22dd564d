// Optimizer and learning-rate schedule settings (AdamW, Megatron's schedule
// or one of DeepSpeed's schedulers). Plain values; lib/train fills them from
// the config file and flags and resolves decay_iters.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "lib/optim/optimizer_types.h"

namespace ds {

enum class LrDecay { Constant, Linear, Cosine, InverseSqrt, WSD };  // Megatron's --lr-decay-style
// Megatron-LM's --lr-wsd-decay-style: the shape of WSD's final decay.
enum class WsdDecay { Exponential, Linear, Cosine, MinusSqrt };
enum class WarmupKind { Linear, Log };  // DeepSpeed warmup_type "linear" | "log"

// DeepSpeed's OneCycle (deepspeed/runtime/lr_schedules.py): keys and defaults.
struct OneCycleParams {
  float cycle_min_lr = 0, cycle_max_lr = 0, decay_lr_rate = 0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = -1;    // -1: = cycle_first_step_size
  int64_t cycle_first_stair_count = 0;    // 0: no staircase
  int64_t cycle_second_stair_count = -1;  // -1: = cycle_first_stair_count
  int64_t decay_step_size = 0;            // 0: no decay after the cycle
  bool cycle_momentum = true;             // beta1 cycled inversely to the lr (optimizers with betas)
  float cycle_min_mom = 0.8f, cycle_max_mom = 0.9f, decay_mom_rate = 0;
};

// DeepSpeed's LRRangeTest: lr = min_lr * (1 + step_rate * interval).
struct LrRangeTestParams {
  float min_lr = 1e-3f;
  int64_t step_size = 2000;
  float step_rate = 1.0f;
  bool staircase = false;
};

// The learning-rate schedule: Megatron's (the training.lr_* keys, no
// DeepSpeed "scheduler" section) or one of DeepSpeed's scheduler types.
// Transformers: transformers' get_scheduler (DeepSpeed-Chat's
// --lr_scheduler_type), a LambdaLR stepped once per applied optimizer step.
enum class LrScheduler : uint8_t {
  Megatron, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, Transformers
};
// DeepSpeed's type names, as scheduler.type spells them (Megatron: "").
inline constexpr std::pair<LrScheduler, const char*> kLrSchedulerNames[] = {
    {LrScheduler::WarmupLR, "WarmupLR"},       {LrScheduler::WarmupDecayLR, "WarmupDecayLR"},
    {LrScheduler::WarmupCosineLR, "WarmupCosineLR"}, {LrScheduler::OneCycle, "OneCycle"},
    {LrScheduler::LRRangeTest, "LRRangeTest"}};
inline const char* lr_scheduler_name(LrScheduler s) {
  for (const auto& [k, name] : kLrSchedulerNames)
    if (k == s) return name;
  return "";
}

// transformers' schedule names: lr x lambda(step), warmup_iters of linear
// warmup from 0, then over decay_iters (num_training_steps) in total:
// linear to 0, half a cosine to 0, one cosine cycle restarting (num_cycles
// 1), polynomial to lr_end 1e-7 (power 1), or constant (with or without the
// warmup).
enum class HfSchedule : uint8_t { Linear, Cosine, CosineWithRestarts, Polynomial, Constant, ConstantWithWarmup };
inline constexpr std::pair<HfSchedule, const char*> kHfScheduleNames[] = {
    {HfSchedule::Linear, "linear"},     {HfSchedule::Cosine, "cosine"},
    {HfSchedule::CosineWithRestarts, "cosine_with_restarts"}, {HfSchedule::Polynomial, "polynomial"},
    {HfSchedule::Constant, "constant"}, {HfSchedule::ConstantWithWarmup, "constant_with_warmup"}};

struct OptimizerConfig {
  OptimizerSpec spec;  // optimizer.type and the keys of that optimizer alone
  float lr = 6e-4f, min_lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 = off
  LrDecay decay = LrDecay::Cosine;
  int64_t warmup_iters = 0, decay_iters = 0;  // decay_iters: resolved (0 in file = train_iters)
  LrScheduler scheduler = LrScheduler::Megatron;
  float warmup_min_lr = 0.f;   // Megatron --lr-warmup-init / DeepSpeed warmup_min_lr
  // DeepSpeed schedulers only:
  WarmupKind warmup_type = WarmupKind::Linear;  // DeepSpeed's own default is "log"
  float warmup_min_ratio = 0.f;     // WarmupCosineLR: warmup starts at ratio * lr
  float cos_min_ratio = 0.0001f;    // WarmupCosineLR: cosine ends at ratio * lr
  OneCycleParams one_cycle;
  LrRangeTestParams range_test;
  HfSchedule hf_schedule = HfSchedule::Cosine;  // LrScheduler::Transformers
  // Megatron's schedule in the units Megatron counts (resolved by lib/train
  // from iterations x global batch, or from sample / token counts): warmup and
  // decay lengths in samples, and optionally in tokens (Megatron-DeepSpeed's
  // --lr-warmup-tokens / --lr-decay-tokens; -1 = not token-based).
  int64_t warmup_samples = 0, decay_samples = 0;
  // WSD: the final decay's length in samples (and iterations, iteration-based), and its shape.
  int64_t wsd_decay_samples = 0, wsd_decay_iters = 0;
  WsdDecay wsd_style = WsdDecay::Exponential;
  int64_t warmup_tokens = -1, decay_tokens = -1;
};

const char* lr_decay_name(LrDecay d);  // "constant" | "linear" | "cosine" | "inverse-square-root" | "WSD"
const char* wsd_decay_name(WsdDecay d);  // "exponential" | "linear" | "cosine" | "minus_sqrt"

}  // namespace ds
