// Optimizer and learning-rate schedule settings (AdamW, Megatron's schedule
// or one of DeepSpeed's schedulers). Plain values; lib/train fills them from
// the config file and flags and resolves decay_iters.
#pragma once
#include <cstdint>
#include <string>

#include "lib/optim/optimizer_types.h"

namespace ds {

enum class LrDecay { Constant, Linear, Cosine };
enum class WarmupKind { Linear, Log };  // DeepSpeed warmup_type "linear" | "log"

struct OptimizerConfig {
  OptimizerSpec spec;  // optimizer.type and the keys of that optimizer alone
  float lr = 6e-4f, min_lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 = off
  LrDecay decay = LrDecay::Cosine;
  int64_t warmup_iters = 0, decay_iters = 0;  // decay_iters: resolved (0 in file = train_iters)
  std::string scheduler_type;  // "" (Megatron schedule) | WarmupLR | WarmupDecayLR | WarmupCosineLR
  float warmup_min_lr = 0.f;   // Megatron --lr-warmup-init / DeepSpeed warmup_min_lr
  // DeepSpeed schedulers only:
  WarmupKind warmup_type = WarmupKind::Linear;  // DeepSpeed's own default is "log"
  float warmup_min_ratio = 0.f;     // WarmupCosineLR: warmup starts at ratio * lr
  float cos_min_ratio = 0.0001f;    // WarmupCosineLR: cosine ends at ratio * lr
  // Megatron's schedule in the units Megatron counts (resolved by lib/train
  // from iterations x global batch, or from sample / token counts): warmup and
  // decay lengths in samples, and optionally in tokens (Megatron-DeepSpeed's
  // --lr-warmup-tokens / --lr-decay-tokens; -1 = not token-based).
  int64_t warmup_samples = 0, decay_samples = 0;
  int64_t warmup_tokens = -1, decay_tokens = -1;
};

const char* lr_decay_name(LrDecay d);  // "constant" | "linear" | "cosine"

}  // namespace ds
