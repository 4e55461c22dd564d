// DeepSpeed's 0/1 Adam (zero_one_adam.h).
#include "lib/optim/zero_one_adam.h"

#include <algorithm>

#include "lib/ops/ops.h"

namespace ds {

ZeroOneAdam::ZeroOneAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin,
                         int64_t end)
    : OneBitFamily(layout, dev, begin, end, spec.compress_param_groups), spec_(spec) {
  allocate_state(dev);
  acc_ = Tensor::zeros({end - begin}, DType::F32, dev);
}

void ZeroOneAdam::set_step_count(int64_t n) {
  step_ = n;  // a fresh process: it initialises first, then starts the counters over
}

// One optim_step call over the range's parameters (lib/ops/optim_rules.h).
void ZeroOneAdam::run(OptimRule rule, const StepTensors& t, const Tensor& grad, const Tensor& acc, const StepHyper& h,
                      float grad_scale, float lr_sum) {
  if (!seg_table_.defined()) return;  // no parameter in the range
  OptimTerms terms = base_optim_terms(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, grad_scale);
  terms.step_size = lr_sum;  // ZeroOneSync's L
  const bool moments_only = rule == OptimRule::OneBitMomentum;
  ops::optim_step({.param = t.params, .grad = grad, .s1 = state("exp_avg"),
                   .s2 = moments_only ? Tensor() : state("exp_avg_sq"), .param_lowp = Tensor(),
                   .segments = seg_table_, .seg_stats = Tensor(), .rule = rule, .s3 = acc, .t = terms},
                  Stream{});
}

void ZeroOneAdam::variance_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  if (step_ % var_interval_ == 0) {  // all-reduced gradients
    run(OptimRule::OneBitMoments, t, t.grads, Tensor(), h, grad_scale);
  } else if (ranks() > 1) {  // the rank's own gradients through the 1-bit exchange
    if (t.grads.dtype() == DType::F32)
      acc_.copy_from(t.grads);
    else
      ops::cast({.out = acc_, .inp = t.grads}, Stream{});
    ops::scale({.x = acc_, .s = grad_scale}, Stream{});
    exchange_units(acc_);
    run(OptimRule::OneBitMomentum, t, acc_, Tensor(), h, 1.f);
  }
  run(OptimRule::OneBitApply, t, Tensor(), Tensor(), h, grad_scale);
  if (step_ % var_interval_ == 0 && ++var_counter_ == spec_.var_update_scaler) {
    var_counter_ = 0;
    var_interval_ *= 2;
  }
  local_ = (step_ + 1) % var_interval_ != 0;  // the next step's gradients
}

void ZeroOneAdam::local_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  run(OptimRule::OneBitMomentum, t, t.grads, Tensor(), h, grad_scale);
  lrs_ += h.lr;
  run(OptimRule::OneBitApply, t, Tensor(), acc_, h, grad_scale);
  if (step_ % local_interval_ == 0) {  // synchronise
    run(OptimRule::ZeroOneUnwind, t, Tensor(), acc_, h, grad_scale);
    exchange_units(acc_);
    // DeepSpeed divides by the learning rates' sum; a run whose rates were
    // all 0 since the last synchronisation keeps its momentum instead of 0/0.
    run(OptimRule::ZeroOneSync, t, Tensor(), acc_, h, grad_scale, static_cast<float>(lrs_));
    lrs_ = 0;
  }
  if (++local_counter_ == spec_.local_step_scaler) {
    local_counter_ = 0;
    local_interval_ = std::min(spec_.local_step_clipper, local_interval_ * 2);
  }
}

void ZeroOneAdam::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream&) {
  check_range(t, end() - begin(), "step");
  ++step_;
  if (!initialized_) {  // DeepSpeed's initialisation call (its exchange of the zero accumulator changes nothing)
    initialized_ = true;
    frozen_ = local_ = false;
    var_interval_ = 1, var_counter_ = 0, local_interval_ = 1, local_counter_ = 0, lrs_ = 0;
    reset_errors();
    return;
  }
  if (frozen_)
    local_step(t, h, grad_scale);
  else
    variance_step(t, h, grad_scale);
  if (!frozen_ && step_ > spec_.var_freeze_step) {  // from the next step on: local steps
    frozen_ = local_ = true;
    reset_errors();  // they held the gradients' errors; now the accumulated updates'
    acc_.zero_();
  }
  if (t.params_lowp.defined()) ops::cast({.out = t.params_lowp, .inp = t.params}, Stream{});
}

}  // namespace ds
