// DeepSpeed's 1-bit Adam (onebit_adam.h).
#include "lib/optim/onebit_adam.h"

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

OneBitAdam::OneBitAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : OneBitFamily(layout, dev, begin, end, spec.compress_param_groups), spec_(spec) {
  allocate_state(dev);
}

void OneBitAdam::set_step_count(int64_t n) {
  step_ = n;
  local_ = n >= spec_.freeze_step;  // as DeepSpeed's load_state_dict picks the phase
}

// The rules are optim_step's (lib/ops/optim_rules.h: OneBitMoments,
// OneBitMomentum, OneBitApply), so the step runs where the state lives.
void OneBitAdam::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s) {
  check_range(t, end() - begin(), "step");
  ++step_;
  const Tensor m = state("exp_avg"), v = state("exp_avg_sq");
  if (!initialized_) {  // DeepSpeed's initialisation call: exp_avg through a compression with fresh errors
    initialized_ = true;
    exchange_units(m);
    reset_errors();
    return;
  }
  const OptimTerms terms = base_optim_terms(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, grad_scale);
  auto run = [&](OptimRule rule, const Tensor& grad, const Tensor& s2, const Tensor& lowp) {
    if (!seg_table_.defined()) return;  // no parameter in the range
    ops::optim_step({.param = t.params, .grad = grad, .s1 = m, .s2 = s2, .param_lowp = lowp,
                     .segments = seg_table_, .seg_stats = Tensor(), .rule = rule, .t = terms},
                    s);
  };
  if (!local_) {
    run(OptimRule::OneBitMoments, t.grads, v, Tensor());
  } else {
    run(OptimRule::OneBitMomentum, t.grads, Tensor(), Tensor());
    exchange_units(m);
  }
  run(OptimRule::OneBitApply, Tensor(), v, t.params_lowp);
  if (!local_ && step_ >= spec_.freeze_step) local_ = true;  // compressed from the next step on
}

}  // namespace ds
