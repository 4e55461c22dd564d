// DeepSpeed's 1-bit Adam (onebit_adam.h).
#include "lib/optim/onebit_adam.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

OneBitAdam::OneBitAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : OneBitFamily(layout, dev, begin, end, "OneBitAdam", spec.compress_param_groups), spec_(spec) {
  allocate_state(dev);
}

void OneBitAdam::set_step_count(int64_t n) {
  step_ = n;
  local_ = n >= spec_.freeze_step;  // as DeepSpeed's load_state_dict picks the phase
}

void OneBitAdam::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream&) {
  check_range(t, end() - begin(), "step");
  ++step_;
  if (!initialized_) {  // DeepSpeed's initialisation call: exp_avg through a compression with fresh errors
    initialized_ = true;
    exchange_units(state("exp_avg").data<float>());
    reset_errors();
    return;
  }
  float* p = t.params.data<float>();
  const float* g = t.grads.data<float>();
  float* m = state("exp_avg").data<float>();
  float* v = state("exp_avg_sq").data<float>();
  const float b1 = h.beta1, b2 = h.beta2, c1 = static_cast<float>(1.0 - h.beta1),
              c2 = static_cast<float>(1.0 - h.beta2);
  const int64_t n = end() - begin();
  if (!local_) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * grad_scale;
      m[i] = m[i] * b1 + c1 * gi;
      v[i] = v[i] * b2 + c2 * gi * gi;
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) m[i] = m[i] * b1 + c1 * (g[i] * grad_scale);
    exchange_units(m);
  }
  adam_update(p, m, v, nullptr, h);
  if (t.params_lowp.defined()) ops::cast({.out = t.params_lowp, .inp = t.params}, Stream{});
  if (!local_ && step_ >= spec_.freeze_step) local_ = true;  // compressed from the next step on
}

}  // namespace ds
