// DeepSpeed's optimizer.type names dstrain implements, the class each maps
// to, and the per-optimizer `optimizer.params` keys (OptimizerSpec): the table
// the config reader checks a type against and make_optimizer (optimizer.h)
// builds from. Plain data, no tensors, so the config layer (and its fuzz
// target) needs nothing else of lib/optim.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace ds {

// AdamW: decoupled weight decay (DeepSpeed's "AdamW", and "Adam" with its
// default adam_w_mode true). AdamL2: "Adam" with adam_w_mode false (the decay
// is added to the gradient, torch.optim.Adam). The rest: DeepSpeed's names.
enum class OptimizerKind { AdamW, AdamL2, SGD, Adagrad, Lion, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb };
// The 1-bit family: DeepSpeed's optimizers with compressed communication (ZeRO stage 0).
inline bool is_onebit(OptimizerKind k) {
  return k == OptimizerKind::OneBitAdam || k == OptimizerKind::ZeroOneAdam || k == OptimizerKind::OneBitLamb;
}

// The optimizer and its own hyper-parameters (the shared ones, lr, betas,
// eps and weight_decay, are per step: StepHyper, optimizer.h). Defaults are
// DeepSpeed's (torch.optim's for SGD and Adagrad).
struct OptimizerSpec {
  std::string type = "AdamW";  // the registry's spelling of optimizer.type
  bool adam_w_mode = true;     // Adam: false = L2 weight decay added to the gradient
  bool bias_correction = true;  // Adam, AdamW, Lamb
  float momentum = 0, dampening = 0;  // SGD
  bool nesterov = false;              // SGD
  float lr_decay = 0, initial_accumulator_value = 0;  // Adagrad
  float max_coeff = 10.f, min_coeff = 0.01f;          // Lamb, OneBitLamb: the trust ratio's clamp
  bool eps_inside_sqrt = false;                       // Lamb: sqrt(v + eps) instead of sqrt(v) + eps
  int64_t freeze_step = 100000;  // OneBitAdam, OneBitLamb: warm-up steps before the compressed exchange
  // ZeroOneAdam: the last step that updates the variance, the variance
  // interval's doubling period, the local-step interval's doubling period and cap.
  int64_t var_freeze_step = 100000, var_update_scaler = 16, local_step_scaler = 32678, local_step_clipper = 16;
  // OneBitLamb: the frozen trust ratio's moving-average coefficient and the
  // compression stage's factor bounds.
  float coeff_beta = 0.9f, factor_max = 4.0f, factor_min = 0.5f, factor_threshold = 0.1f;
  // OneBitAdam, ZeroOneAdam: one compression unit per Megatron parameter
  // group (the tensors that decay, then those that do not, each group's
  // tensors one after the other) instead of one per tensor. Derived, not a
  // key: fp16 sets it, as DeepSpeed's fp16 wrapper flattens each group.
  bool compress_param_groups = false;
};

// The kind of a registered type (case-insensitive), none for anything else.
std::optional<OptimizerKind> optimizer_kind(std::string_view type);
// The kind a spec builds: its type's, with Adam's adam_w_mode applied.
std::optional<OptimizerKind> optimizer_kind(const OptimizerSpec& spec);
// The canonical spelling of a registered type ("adamw" -> "AdamW"), "" when
// none; and the list a config error names ("Adam, AdamW, ... and Lamb").
std::string canonical_optimizer_type(std::string_view type);
std::string optimizer_types_text();
// The name a checkpoint records for a kind (Optimizer::type()): "AdamW",
// "Adam" (L2), "SGD", "Adagrad", "Lion", "Lamb", "OneBitAdam",
// "ZeroOneAdam", "OneBitLamb".
const char* optimizer_kind_name(OptimizerKind k);
// f32 state tensors the optimizer keeps per parameter element (the memory
// estimate): AdamW, Adam, Lamb, OneBitAdam, ZeroOneAdam 2; OneBitLamb 3; Adagrad, Lion 1;
// SGD 1 with momentum, else 0.
int optimizer_state_count(const OptimizerSpec& spec);

}  // namespace ds
