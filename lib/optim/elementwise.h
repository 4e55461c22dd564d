// The element-wise optimizers besides the fused AdamW: DeepSpeed's "Adam"
// with adam_w_mode false (L2 decay added to the gradient), AdamW without bias
// correction, "SGD" (torch.optim.SGD: momentum, dampening, nesterov),
// "Adagrad" (torch.optim.Adagrad: lr_decay, initial_accumulator_value) and
// "Lion" (DeepSpeed's FusedLion). One op call (optim_step, the rule of
// lib/ops/optim_rules.h) covers the owned range, one segment per parameter
// with its decay flag, as AdamW's; an update of a part (offload) is the same
// call on the part's segments, so the parts give the bits of the whole.
// State names are torch.optim's / DeepSpeed's: exp_avg and exp_avg_sq (Adam),
// momentum_buffer (SGD with momentum; none without), sum (Adagrad), exp_avg
// (Lion). No device-gated step: --cuda-graph refuses them.
#pragma once
#include "lib/ops/optim_rules.h"
#include "lib/optim/optimizer.h"

namespace ds {

class ElementwiseOptimizer final : public Optimizer {
 public:
  ElementwiseOptimizer(OptimizerKind kind, const OptimizerSpec& spec, const ModelLayout& layout, Device dev,
                       int64_t begin, int64_t end, StateHome home = StateHome::Own);

  const char* type() const override { return optimizer_kind_name(kind_); }
  std::vector<OptimizerStateSpec> state_specs() const override;
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  bool step_part(int64_t lo, int64_t hi, const StepTensors& t, const StepHyper& h, float grad_scale) override;
  float initial_state_value(size_t i) const override;

  // The rule's values for the step count step_count() (already advanced).
  OptimTerms terms(const StepHyper& h, float grad_scale) const;

 private:
  void run(const StepTensors& t, const Tensor& s1, const Tensor& s2, const Tensor& segments, const StepHyper& h,
           float grad_scale, const Stream& s) const;
  OptimizerKind kind_;
  OptimizerSpec spec_;
  OptimRule rule_;
  Tensor segments_;  // (S, 3) i64 of the owned range, on the state's device
};

}  // namespace ds
