// DeepSpeed's 0/1 Adam (zero_one_adam.h).
#include "lib/optim/zero_one_adam.h"

#include <algorithm>
#include <cmath>

#include "lib/ops/ops.h"

namespace ds {

ZeroOneAdam::ZeroOneAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin,
                         int64_t end)
    : OneBitFamily(layout, dev, begin, end, "ZeroOneAdam", spec.compress_param_groups), spec_(spec) {
  allocate_state(dev);
  acc_.assign(static_cast<size_t>(end - begin), 0.f);
}

void ZeroOneAdam::set_step_count(int64_t n) {
  step_ = n;  // a fresh process: it initialises first, then starts the counters over
}

void ZeroOneAdam::variance_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  float* m = state("exp_avg").data<float>();
  float* v = state("exp_avg_sq").data<float>();
  const float* g = t.grads.data<float>();
  const int64_t n = end() - begin();
  const float b1 = h.beta1, b2 = h.beta2, c1 = 1.f - h.beta1, c2 = 1.f - h.beta2;
  if (step_ % var_interval_ == 0) {  // all-reduced gradients
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * grad_scale;
      v[i] = v[i] * b2 + c2 * gi * gi;
      m[i] = m[i] * b1 + c1 * gi;
    }
  } else if (ranks() > 1) {  // the rank's own gradients through the 1-bit exchange
    float* c = acc_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) c[i] = g[i] * grad_scale;
    exchange_units(c);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) m[i] = m[i] * b1 + c1 * c[i];
  }
  adam_update(t.params.data<float>(), m, v, nullptr, h);
  if (step_ % var_interval_ == 0 && ++var_counter_ == spec_.var_update_scaler) {
    var_counter_ = 0;
    var_interval_ *= 2;
  }
  local_ = (step_ + 1) % var_interval_ != 0;  // the next step's gradients
}

void ZeroOneAdam::local_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  float* p = t.params.data<float>();
  float* m = state("exp_avg").data<float>();
  const float* v = state("exp_avg_sq").data<float>();
  const float* g = t.grads.data<float>();
  float* a = acc_.data();
  const int64_t n = end() - begin();
  const float b1 = h.beta1, c1 = 1.f - h.beta1;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) m[i] = m[i] * b1 + c1 * (g[i] * grad_scale);
  lrs_ += h.lr;
  adam_update(p, m, v, a, h);
  if (step_ % local_interval_ == 0) {  // synchronise
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      p[i] -= a[i];
      a[i] *= std::sqrt(v[i]) + h.eps;
    }
    exchange_units(a);
    // DeepSpeed divides by the learning rates' sum; a run whose rates were
    // all 0 since the last synchronisation keeps its momentum instead of 0/0.
    const float lr_sum = static_cast<float>(lrs_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      if (lrs_ != 0) m[i] = -(a[i] / lr_sum);
      p[i] += a[i] / (std::sqrt(v[i]) + h.eps);
      a[i] = 0.f;
    }
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
    std::fill(acc_.begin(), acc_.end(), 0.f);
  }
  if (t.params_lowp.defined()) ops::cast({.out = t.params_lowp, .inp = t.params}, Stream{});
}

}  // namespace ds
