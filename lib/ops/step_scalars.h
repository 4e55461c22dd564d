// The per-step scalars of the optimizer update and the rule that gates it.
// Besides its constant hyper-parameters (betas, eps) an AdamW update needs
// values that change every step: the schedule's learning rate and weight
// decay, the bias corrections of Adam's step count, the gradient scale (clip
// coefficient / loss scale) and whether the step is skipped (non-finite
// gradients or loss). adamw_step takes them by value, or from a small f32
// block in the op's memory (AdamWArgs::scalars, laid out by AdamWSlot): the
// host writes the first five before the step (the AdamW terms and the loss
// scale), the step_gate op writes the last two from the step's statistics
// without a host read, and adamw_step reads them when it runs. So the whole step, update included, can be one
// CUDA graph replayed with nothing captured that changes between steps
// (docs/cuda.md, "CUDA graphs").
// gate_step is that rule once, compiled for the host and the device: the
// step_gate op runs it on either backend, and the trainer applies it to the
// statistics it reads.
#pragma once
#include <cmath>
#include <cstdint>

#include "lib/ops/host_device.h"

namespace ds {

// Slots of the f32 block AdamWArgs::scalars points at.
struct AdamWSlot {
  enum : int {
    Lr,           // host: the schedule's learning rate
    WeightDecay,  // host: the weight decay of the parameters that decay
    StepSize,     // host: lr / (1 - beta1^t), t = Adam's step count with this step
    InvSqrtBc2,   // host: 1 / sqrt(1 - beta2^t)
    LossScale,    // host: the step's loss scale (fp16 with a loss scaler, else 1); read by step_gate and
                  // cross_entropy only when told to (StepGateArgs::scale_in_block, CrossEntropyArgs::dloss_scale)
    GradScale,    // step_gate: every gradient is multiplied by it (clip coefficient / loss scale)
    Skip,         // step_gate: 1 = no update (weights, m and v stay as they are), else 0
    Count
  };
};

// The host's part of the block for 1-based step t, derived once for both
// backends and both ways of passing them (the bias corrections are rounded
// to f32 before they are used).
struct AdamWTerms {
  float lr = 0, weight_decay = 0, step_size = 0, inv_sqrt_bc2 = 0;
};
inline AdamWTerms adamw_terms(float lr, float weight_decay, float beta1, float beta2, int64_t t) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  return {lr, weight_decay, lr / bc1, static_cast<float>(1.0 / std::sqrt(static_cast<double>(bc2)))};
}
// The host's slots [Lr, LossScale] of the block, in order: what one copy
// to the block's start writes before a step.
constexpr int kStepHostSlots = 5;
static_assert(AdamWSlot::Lr == 0 && AdamWSlot::LossScale == kStepHostSlots - 1);
inline void step_host_slots(const AdamWTerms& t, float loss_scale, float* out) {  // out: (kStepHostSlots)
  out[AdamWSlot::Lr] = t.lr;
  out[AdamWSlot::WeightDecay] = t.weight_decay;
  out[AdamWSlot::StepSize] = t.step_size;
  out[AdamWSlot::InvSqrtBc2] = t.inv_sqrt_bc2;
  out[AdamWSlot::LossScale] = loss_scale;
}

// When a step is not applied.
enum class SkipRule : uint8_t {
  NonFinite,  // bf16 / fp32: the loss or the gradient norm is NaN/Inf
  Overflow,   // fp16 with a loss scaler: a gradient overflowed (the flag) or the loss is NaN/Inf
};

namespace detail {
DS_HOST_DEVICE bool finite(double x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}
DS_HOST_DEVICE double sqrt_rn(double x) {  // IEEE square root (correctly rounded on both)
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}
}  // namespace detail

// Clip coefficient Megatron/DeepSpeed style: min(1, max_norm / (norm + 1e-6)),
// in double; 1 if max_norm <= 0 or the norm is not finite.
DS_HOST_DEVICE float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0 || !detail::finite(norm)) return 1.f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.f;
}

// The gate of one step, from its statistics (the world's sums): the gradient
// sum of squares (loss scale still in), the overflow flag (fp16) and the
// mean loss.
struct StepGate {
  double norm = 0;       // the gradient norm, loss scale divided out
  float grad_scale = 1;  // clip coefficient / loss scale
  bool skip = false;
};
DS_HOST_DEVICE StepGate gate_step(float sumsq, float overflow_flag, float loss, double loss_scale, float max_norm,
                                  SkipRule rule) {
  StepGate g;
  g.norm = detail::sqrt_rn(static_cast<double>(sumsq)) / loss_scale;
  const bool bad_grads = rule == SkipRule::Overflow ? overflow_flag != 0.f : !detail::finite(g.norm);
  g.skip = bad_grads || !detail::finite(static_cast<double>(loss));
  g.grad_scale = static_cast<float>(static_cast<double>(clip_coefficient(g.norm, max_norm)) / loss_scale);
  return g;
}

}  // namespace ds
