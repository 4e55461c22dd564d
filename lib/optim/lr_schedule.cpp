// Learning-rate schedules (see lr_schedule.h). Computed in double, returned as float.
//
// Step alignment, matching each reference implementation:
// - Megatron builds its scheduler with step(0), so step k runs at f(k): with
//   warmup, step 0 runs at the warmup start value (0 unless --lr-warmup-init).
// - DeepSpeed advances its scheduler after each optimizer step, starting from
//   last_batch_iteration = -1, so step k runs at f(k - 1); f(-1) is
//   warmup_min_lr for WarmupLR / WarmupDecayLR and 0 for WarmupCosineLR.
#include "lib/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace ds {

const char* lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::Constant: return "constant";
    case LrDecay::Linear: return "linear";
    case LrDecay::Cosine: return "cosine";
    case LrDecay::InverseSqrt: return "inverse-square-root";
    case LrDecay::WSD: return "WSD";
  }
  return "?";
}

const char* wsd_decay_name(WsdDecay d) {
  switch (d) {
    case WsdDecay::Exponential: return "exponential";
    case WsdDecay::Linear: return "linear";
    case WsdDecay::Cosine: return "cosine";
    case WsdDecay::MinusSqrt: return "minus_sqrt";
  }
  return "?";
}
namespace {

constexpr double kPi = 3.14159265358979323846;

// Megatron-LM's WSD coefficient at `done` of a decay of `length` (either unit):
// 1 during the stable phase, then the final decay over the last `wsd` of it.
double wsd_coeff(const OptimizerConfig& o, double done, double length, double wsd) {
  const double start = length - wsd;
  if (done <= start) return 1.0;
  const double r = (done - start) / wsd;
  switch (o.wsd_style) {
    case WsdDecay::Linear: return 1.0 - r;
    case WsdDecay::Cosine: return 0.5 * (std::cos(kPi * r) + 1.0);
    case WsdDecay::Exponential: return 2.0 * std::pow(0.5, r) - 1.0;
    case WsdDecay::MinusSqrt: return 1.0 - std::sqrt(r);
  }
  return 1.0;
}

double megatron_lr(const OptimizerConfig& o, int64_t step, int64_t train_iters) {
  const double max_lr = o.lr, min_lr = o.min_lr, init_lr = o.warmup_min_lr;
  const int64_t warmup = o.warmup_iters;
  const int64_t decay = o.decay_iters > 0 ? o.decay_iters : train_iters;
  if (warmup > 0 && step <= warmup)
    return init_lr + (max_lr - init_lr) * static_cast<double>(step) / static_cast<double>(warmup);
  if (o.decay == LrDecay::Constant) return max_lr;
  if (step > decay) return min_lr;
  if (o.decay == LrDecay::InverseSqrt)  // Megatron: max_lr sqrt(warmup / step), at least min_lr
    return std::max(min_lr, max_lr * std::sqrt(static_cast<double>(std::max<int64_t>(warmup, 1))) /
                                std::sqrt(static_cast<double>(std::max<int64_t>(step, 1))));
  if (decay <= warmup) return min_lr;
  if (o.decay == LrDecay::WSD)
    return min_lr + wsd_coeff(o, static_cast<double>(step), static_cast<double>(decay),
                              static_cast<double>(o.wsd_decay_iters)) * (max_lr - min_lr);
  const double ratio = static_cast<double>(step - warmup) / static_cast<double>(decay - warmup);
  const double coeff = o.decay == LrDecay::Linear ? 1.0 - ratio : 0.5 * (std::cos(kPi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

// DeepSpeed's warmup fraction in [0, 1) for scheduler iteration it < warmup.
double ds_warmup_gamma(const OptimizerConfig& o, int64_t it, int64_t warmup) {
  if (o.warmup_type == WarmupKind::Log)
    return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(warmup));
  return static_cast<double>(it) / static_cast<double>(warmup);
}

// OneCycle's position in the cycle for scheduler iteration it >= 0 (DeepSpeed's
// _get_scale_factor, in double as Python computes it).
double one_cycle_scale(const OneCycleParams& p, int64_t it) {
  const double first = static_cast<double>(p.cycle_first_step_size);
  const double second = static_cast<double>(p.cycle_second_step_size < 0 ? p.cycle_first_step_size
                                                                            : p.cycle_second_step_size);
  const double total = first + second, ratio = first / total;
  const int64_t stairs1 = p.cycle_first_stair_count;
  const int64_t stairs2 = p.cycle_second_stair_count < 0 ? stairs1 : p.cycle_second_stair_count;
  const double b = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + b / total);
  const double x = 1.0 + b / total - cycle;
  double scale;
  int64_t stairs;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = stairs1;
  } else {
    scale = (x - 1.0) / (ratio - 1.0);
    stairs = stairs2;
  }
  if (stairs > 0) {
    const double ci = std::fmod(b, total);
    const double pos = ci <= first ? ci * static_cast<double>(stairs) / first
                                   : (total - ci) * static_cast<double>(stairs) / second;
    scale = std::floor(pos) / static_cast<double>(stairs);
  }
  return scale;
}

double one_cycle_total(const OneCycleParams& p) {
  return static_cast<double>(p.cycle_first_step_size) +
         static_cast<double>(p.cycle_second_step_size < 0 ? p.cycle_first_step_size : p.cycle_second_step_size);
}

double one_cycle_lr(const OneCycleParams& p, int64_t it) {
  if (it < 0) return p.cycle_min_lr;  // set when the scheduler is built
  if (static_cast<double>(it) < one_cycle_total(p))
    return p.cycle_min_lr + (static_cast<double>(p.cycle_max_lr) - p.cycle_min_lr) * one_cycle_scale(p, it);
  if (p.decay_step_size == 0 || p.decay_lr_rate == 0) return p.cycle_min_lr;
  const double interval = (static_cast<double>(it) - one_cycle_total(p) + 1.0) / static_cast<double>(p.decay_step_size);
  return p.cycle_min_lr / (1.0 + p.decay_lr_rate * interval);
}

double one_cycle_mom(const OneCycleParams& p, int64_t it) {
  if (it < 0) return p.cycle_min_mom;
  if (static_cast<double>(it) < one_cycle_total(p))
    return p.cycle_max_mom - (static_cast<double>(p.cycle_max_mom) - p.cycle_min_mom) * one_cycle_scale(p, it);
  if (p.decay_step_size == 0 || p.decay_mom_rate == 0) return p.cycle_max_mom;
  const double interval = (static_cast<double>(it) - one_cycle_total(p) + 1.0) / static_cast<double>(p.decay_step_size);
  return p.cycle_max_mom * (1.0 + p.decay_mom_rate * interval);
}

double range_test_lr(const LrRangeTestParams& p, int64_t it) {
  if (it < 0) return p.min_lr;
  const double b = static_cast<double>(it + 1) / static_cast<double>(p.step_size);
  return p.min_lr * (1.0 + p.step_rate * (p.staircase ? std::floor(b) : b));
}

double deepspeed_lr(const OptimizerConfig& o, int64_t it, int64_t train_iters) {
  if (o.scheduler == LrScheduler::OneCycle) return one_cycle_lr(o.one_cycle, it);
  if (o.scheduler == LrScheduler::LRRangeTest) return range_test_lr(o.range_test, it);
  const bool cosine = o.scheduler == LrScheduler::WarmupCosineLR;
  if (it < 0) return cosine ? 0.0 : o.warmup_min_lr;
  const int64_t warmup = std::max<int64_t>(2, o.warmup_iters);  // DeepSpeed clamps to >= 2
  const int64_t total = o.decay_iters > 0 ? o.decay_iters : train_iters;
  const double max_lr = o.lr;
  if (cosine) {
    double ratio;
    if (it < warmup) {
      ratio = o.warmup_min_ratio + ds_warmup_gamma(o, it, warmup) * (1.0 - o.warmup_min_ratio);
    } else {
      const double step = static_cast<double>(it - warmup + 1);
      const double span = static_cast<double>(total - warmup);
      const double c = span > 0 ? (1.0 + std::cos(kPi * step / span)) / 2.0 : 0.0;
      ratio = std::max(0.0, o.cos_min_ratio + (1.0 - o.cos_min_ratio) * c);
    }
    return max_lr * ratio;
  }
  const double min_lr = o.warmup_min_lr;
  double gamma = 1.0;
  if (it < warmup) {
    gamma = ds_warmup_gamma(o, it, warmup);
  } else if (o.scheduler == LrScheduler::WarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(total - it) /
                              std::max(1.0, static_cast<double>(total - warmup)));
  }
  return min_lr + (max_lr - min_lr) * gamma;
}

// transformers' get_scheduler lambdas (optimization.py) at LambdaLR step
// `step` (the applied optimizer steps so far).
double hf_lambda(const OptimizerConfig& o, int64_t step) {
  const double s = static_cast<double>(step), warmup = static_cast<double>(o.warmup_iters),
               total = static_cast<double>(o.decay_iters);
  const bool warming = step < o.warmup_iters;
  const double warm = s / std::max(1.0, warmup);
  const double progress = (s - warmup) / std::max(1.0, total - warmup);
  switch (o.hf_schedule) {
    case HfSchedule::Constant: return 1.0;
    case HfSchedule::ConstantWithWarmup: return warming ? warm : 1.0;
    case HfSchedule::Linear: return warming ? warm : std::max(0.0, (total - s) / std::max(1.0, total - warmup));
    case HfSchedule::Cosine: return warming ? warm : std::max(0.0, 0.5 * (1.0 + std::cos(kPi * 0.5 * 2.0 * progress)));
    case HfSchedule::CosineWithRestarts:
      if (warming) return warm;
      if (progress >= 1.0) return 0.0;
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(1.0 * progress, 1.0))));
    case HfSchedule::Polynomial: {
      constexpr double kLrEnd = 1e-7, kPower = 1.0;
      const double lr_init = o.lr;
      if (warming) return warm;
      // (transformers divides by zero at step == total when warmup == total;
      // dschat refuses that schedule)
      if (step > o.decay_iters || o.decay_iters <= o.warmup_iters) return kLrEnd / lr_init;
      const double remaining = 1.0 - (s - warmup) / (total - warmup);
      return ((lr_init - kLrEnd) * std::pow(remaining, kPower) + kLrEnd) / lr_init;
    }
  }
  return 1.0;
}

// Megatron-DeepSpeed's OptimizerParamScheduler.get_lr on the clock: warmup
// and decay each count samples, or tokens where a token length is given.
double megatron_clock_lr(const OptimizerConfig& o, const LrClock& c) {
  const double max_lr = o.lr, min_lr = o.min_lr, init_lr = o.warmup_min_lr;
  auto warm = [&](double done, double length) { return init_lr + (max_lr - init_lr) * done / length; };
  if (o.warmup_tokens < 0) {
    if (o.warmup_samples > 0 && c.samples <= o.warmup_samples)
      return warm(static_cast<double>(c.samples), static_cast<double>(o.warmup_samples));
  } else if (o.warmup_tokens > 0 && c.tokens <= o.warmup_tokens) {
    return warm(static_cast<double>(c.tokens), static_cast<double>(o.warmup_tokens));
  }
  if (o.decay == LrDecay::Constant) return max_lr;
  double done, length;
  if (o.decay_tokens < 0) {
    done = static_cast<double>(c.samples - o.warmup_samples);
    length = static_cast<double>(o.decay_samples - o.warmup_samples);
    if (c.samples > o.decay_samples) return min_lr;
  } else {
    // A token-wise decay starts where the warmup ended: its token length, or
    // the tokens counted when a sample-wise warmup ended (0 without warmup).
    const int64_t start = o.warmup_tokens >= 0 ? o.warmup_tokens : std::max<int64_t>(0, c.warmup_end_tokens);
    done = static_cast<double>(c.tokens - start);
    length = static_cast<double>(o.decay_tokens - start);
    if (c.tokens > o.decay_tokens) return min_lr;
  }
  if (o.decay == LrDecay::InverseSqrt) {  // Megatron-DeepSpeed: in tokens with a token-wise warmup
    const bool tok = o.warmup_tokens >= 0;
    const double w = static_cast<double>(std::max<int64_t>(tok ? o.warmup_tokens : o.warmup_samples, 1));
    const double n = static_cast<double>(std::max<int64_t>(tok ? c.tokens : c.samples, 1));
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  if (length <= 0) return min_lr;
  if (o.decay == LrDecay::WSD)  // sample-wise (the config refuses a token-wise WSD decay)
    return min_lr + wsd_coeff(o, static_cast<double>(c.samples), static_cast<double>(o.decay_samples),
                              static_cast<double>(o.wsd_decay_samples)) * (max_lr - min_lr);
  const double ratio = std::clamp(done / length, 0.0, 1.0);
  const double coeff = o.decay == LrDecay::Linear ? 1.0 - ratio : 0.5 * (std::cos(kPi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace

float lr_at(const OptimizerConfig& o, const LrClock& clock) {
  if (o.scheduler == LrScheduler::Transformers) return static_cast<float>(o.lr * hf_lambda(o, clock.steps));
  if (o.scheduler != LrScheduler::Megatron) return lr_at(o, clock.steps, o.decay_iters);
  return static_cast<float>(megatron_clock_lr(o, clock));
}

LrScheduleValues lr_schedule_values(const OptimizerConfig& o) {
  return {.max_lr = o.lr, .min_lr = o.min_lr, .warmup_samples = o.warmup_samples, .decay_samples = o.decay_samples,
          .warmup_tokens = o.warmup_tokens, .decay_tokens = o.decay_tokens, .decay_style = lr_decay_name(o.decay)};
}

void advance_lr_clock(const OptimizerConfig& o, LrClock& clock, int64_t samples, int64_t tokens_before) {
  clock.steps += 1;
  clock.samples += samples;
  clock.tokens = tokens_before;
  if (o.warmup_tokens < 0 && o.decay_tokens >= 0 && o.warmup_samples > 0 && clock.samples == o.warmup_samples)
    clock.warmup_end_tokens = clock.tokens;
}

float lr_at(const OptimizerConfig& o, int64_t iteration, int64_t train_iters) {
  if (o.scheduler == LrScheduler::Megatron) return static_cast<float>(megatron_lr(o, iteration, train_iters));
  if (o.scheduler == LrScheduler::Transformers) return static_cast<float>(o.lr * hf_lambda(o, iteration));
  return static_cast<float>(deepspeed_lr(o, iteration - 1, train_iters));
}

bool cycles_momentum(const OptimizerConfig& o) {
  if (o.scheduler != LrScheduler::OneCycle || !o.one_cycle.cycle_momentum) return false;
  const OptimizerKind k = optimizer_kind(o.spec).value_or(OptimizerKind::AdamW);
  return k != OptimizerKind::SGD && k != OptimizerKind::Adagrad;  // DeepSpeed: optimizers with betas only
}

std::optional<std::pair<float, float>> betas_at(const OptimizerConfig& o, const LrClock& clock) {
  if (!cycles_momentum(o)) return std::nullopt;
  return std::pair<float, float>{static_cast<float>(one_cycle_mom(o.one_cycle, clock.steps - 1)), 0.99f};
}

}  // namespace ds
