// Lamb over the flat layout (lamb.h): moments and the per-segment sums of
// squares, the per-tensor sums over the ZeRO shards, the trust ratios on the
// host, then the update.
#include "lib/optim/lamb.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

Lamb::Lamb(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : Optimizer(layout, begin, end), spec_(spec), dev_(dev) {
  allocate_state(dev);
  segs_ = segments_in(begin, end);
  segments_ = segment_table(segs_, dev);
  coeffs_.assign(layout.params.size(), 1.f);
}

OptimTerms Lamb::terms(const StepHyper& h, float grad_scale) const {
  OptimTerms t = base_optim_terms(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, grad_scale);
  t.eps_inside_sqrt = spec_.eps_inside_sqrt;
  t.step_size = h.lr;
  if (spec_.bias_correction) {  // FusedLamb: lr * sqrt(1 - beta2^t) / (1 - beta1^t), in f32
    const float bc1 = 1.f - std::pow(h.beta1, static_cast<float>(step_));
    const float bc2 = 1.f - std::pow(h.beta2, static_cast<float>(step_));
    t.step_size = h.lr * std::sqrt(bc2) / bc1;
  }
  return t;
}

std::vector<float> Lamb::tensor_sums(const std::vector<float>& seg_sums) {
  const size_t P = layout().params.size();
  std::vector<float> sums(2 * P, 0.f);
  for (size_t s = 0; s < segs_.size(); ++s) {
    sums[2 * segs_[s].param] = seg_sums[2 * s];
    sums[2 * segs_[s].param + 1] = seg_sums[2 * s + 1];
  }
  if (shard_sum_ && P > 0) {
    Tensor host = Tensor::empty({static_cast<int64_t>(2 * P)}, DType::F32);
    std::copy(sums.begin(), sums.end(), host.data<float>());
    Tensor t = dev_.is_cpu() ? host : host.to(dev_);
    shard_sum_(t);
    if (!dev_.is_cpu()) host = t.to(Device::cpu());
    std::copy(host.data<float>(), host.data<float>() + 2 * P, sums.begin());
  }
  return sums;
}

void Lamb::step_empty_range() {
  ++step_;
  tensor_sums({});  // joins the shards' sum with zeros
}

void Lamb::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s) {
  check_range(t, end() - begin(), "step");
  ++step_;
  const OptimTerms tm = terms(h, grad_scale);
  const int64_t S = static_cast<int64_t>(segs_.size());
  std::vector<float> seg_sums(2 * S);
  Tensor stats;
  if (S > 0) {
    stats = Tensor::zeros({S, 2}, DType::F32, dev_);
    ops::optim_step({.param = t.params, .grad = t.grads, .s1 = state("exp_avg"), .s2 = state("exp_avg_sq"),
                     .param_lowp = Tensor(), .segments = segments_, .seg_stats = stats,
                     .rule = OptimRule::LambMoments, .t = tm},
                    s);
    const Tensor host = dev_.is_cpu() ? stats : stats.to(Device::cpu());
    std::copy(host.data<float>(), host.data<float>() + 2 * S, seg_sums.begin());
  }
  const std::vector<float> sums = tensor_sums(seg_sums);
  std::fill(coeffs_.begin(), coeffs_.end(), 1.f);
  if (S == 0) return;
  Tensor coeff = Tensor::empty({S}, DType::F32);
  for (int64_t i = 0; i < S; ++i) {
    const int p = segs_[i].param;
    coeffs_[p] = optim_rule::lamb_coeff(sums[2 * p], sums[2 * p + 1], spec_.min_coeff, spec_.max_coeff);
    coeff.data<float>()[i] = coeffs_[p];
  }
  ops::optim_step({.param = t.params, .grad = Tensor(), .s1 = state("exp_avg"), .s2 = state("exp_avg_sq"),
                   .param_lowp = t.params_lowp, .segments = segments_,
                   .seg_stats = dev_.is_cpu() ? coeff : coeff.to(dev_), .rule = OptimRule::LambApply, .t = tm},
                  s);
}

}  // namespace ds
