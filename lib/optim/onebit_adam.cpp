// DeepSpeed's 1-bit Adam (onebit_adam.h).
#include "lib/optim/onebit_adam.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

OneBitAdam::OneBitAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : Optimizer(layout, begin, end), spec_(spec) {
  DS_USER_CHECK(dev.is_cpu(), "optimizer.type OneBitAdam runs on the CPU backend only so far");
  allocate_state(dev);
  segs_ = segments_in(begin, end);
}

void OneBitAdam::set_step_count(int64_t n) {
  step_ = n;
  compressing_ = n >= spec_.freeze_step;  // as DeepSpeed's load_state_dict picks the phase
}

void OneBitAdam::compress_moments() {
  if (!dp_ || dp_->size() <= 1) return;
  float* m = state("exp_avg").data<float>();
  errors_.resize(segs_.size());
  for (size_t k = 0; k < segs_.size(); ++k)
    onebit_all_reduce(*dp_, m + segs_[k].begin, segs_[k].end - segs_[k].begin, errors_[k]);
}

void OneBitAdam::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream&) {
  check_range(t, end() - begin(), "step");
  ++step_;
  if (!initialized_) {  // DeepSpeed's initialisation call: exp_avg through a compression with fresh errors
    initialized_ = true;
    compress_moments();
    errors_.clear();
    return;
  }
  float* p = t.params.data<float>();
  const float* g = t.grads.data<float>();
  float* m = state("exp_avg").data<float>();
  float* v = state("exp_avg_sq").data<float>();
  const float b1 = h.beta1, b2 = h.beta2, c1 = static_cast<float>(1.0 - h.beta1),
              c2 = static_cast<float>(1.0 - h.beta2);
  const int64_t n = end() - begin();
  if (!compressing_) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * grad_scale;
      m[i] = m[i] * b1 + c1 * gi;
      v[i] = v[i] * b2 + c2 * gi * gi;
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) m[i] = m[i] * b1 + c1 * (g[i] * grad_scale);
    compress_moments();
  }
  for (const Segment& s : segs_) {
    const float wd = s.decay ? h.weight_decay : 0.f;
#pragma omp parallel for schedule(static)
    for (int64_t i = s.begin; i < s.end; ++i) {
      float u = m[i] / (std::sqrt(v[i]) + h.eps);
      if (wd > 0.f) u += wd * p[i];
      p[i] -= h.lr * u;
    }
  }
  if (t.params_lowp.defined()) ops::cast({.out = t.params_lowp, .inp = t.params}, Stream{});
  if (!compressing_ && step_ >= spec_.freeze_step) compressing_ = true;  // from the next step on
}

}  // namespace ds
