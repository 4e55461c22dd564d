// DeepSpeed's 1-bit Lamb (onebit_lamb.h): the element-wise passes are
// optim_step rules on the state's device, the per-tensor decisions are the
// host's.
#include "lib/optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

OneBitLamb::OneBitLamb(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : OneBitFamily(layout, dev, begin, end), spec_(spec), dev_(dev) {
  allocate_state(dev);
  reset_scalars();
}

void OneBitLamb::reset_scalars() {
  coeff_freeze_.assign(segs_.size(), 0.0);
  last_factor_.assign(segs_.size(), 1.0);
  scaling_.assign(segs_.size(), 1.0);
  coeffs_.assign(segs_.size(), 1.0);
  have_scaling_ = false;
}

void OneBitLamb::set_step_count(int64_t n) {
  step_ = n;
  frozen_ = local_ = n >= spec_.freeze_step;
  if (!frozen_) reset_scalars();  // DeepSpeed's load in the warm-up stage
}

std::string OneBitLamb::saved_scalars() const {
  if (!frozen_) return "";
  nlohmann::json names = nlohmann::json::array();
  for (const Segment& s : segs_) names.push_back(layout().params[static_cast<size_t>(s.param)].name);
  nlohmann::json j{{"params", names}, {"lamb_coeff_freeze", coeff_freeze_}, {"last_factor", last_factor_}};
  if (have_scaling_) j["scaling_coeff"] = scaling_;  // (saved at the step that reached freeze_step: not yet)
  return j.dump();
}

void OneBitLamb::load_scalars(const std::string& text) {
  if (text.empty() || !frozen_) return;  // the warm-up keeps none
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  auto list = [&](const char* key) {
    DS_USER_CHECK(j.is_object() && j.contains(key) && j[key].is_array() && j[key].size() == segs_.size(),
                  "checkpoint: OneBitLamb's per-tensor values '{}' must list {} numbers, one per parameter tensor "
                  "of this rank", key, segs_.size());
    std::vector<double> v;
    for (const auto& x : j[key]) {
      DS_USER_CHECK(x.is_number() && std::isfinite(x.get<double>()),
                    "checkpoint: OneBitLamb's per-tensor values '{}' must be finite numbers", key);
      v.push_back(x.get<double>());
    }
    return v;
  };
  DS_USER_CHECK(j.is_object() && j.contains("params") && j["params"].is_array() &&
                    j["params"].size() == segs_.size(),
                "checkpoint: OneBitLamb's per-tensor values must name the {} parameter tensors of this rank",
                segs_.size());
  for (size_t k = 0; k < segs_.size(); ++k) {
    const std::string& want = layout().params[static_cast<size_t>(segs_[k].param)].name;
    DS_USER_CHECK(j["params"][k].is_string() && j["params"][k].get<std::string>() == want,
                  "checkpoint: OneBitLamb's per-tensor value {} belongs to another tensor than '{}'", k, want);
  }
  coeff_freeze_ = list("lamb_coeff_freeze");
  last_factor_ = list("last_factor");
  have_scaling_ = j.contains("scaling_coeff");
  if (have_scaling_) scaling_ = list("scaling_coeff");
}

Tensor OneBitLamb::to_state_device(const std::vector<float>& x, int64_t width) const {
  Tensor host = Tensor::empty({static_cast<int64_t>(segs_.size()), width}, DType::F32);
  std::copy(x.begin(), x.end(), host.data<float>());
  return dev_.is_cpu() ? host : host.to(dev_);
}

std::vector<float> OneBitLamb::to_host(const Tensor& x) const {
  const Tensor host = dev_.is_cpu() ? x : x.to(Device::cpu());
  return std::vector<float>(host.data<float>(), host.data<float>() + host.numel());
}

void OneBitLamb::apply(const StepTensors& t, const StepHyper& h, const OptimTerms& terms, const Stream& s) {
  std::vector<float> c(segs_.size());
  for (size_t k = 0; k < segs_.size(); ++k) c[k] = static_cast<float>(h.lr * coeffs_[k]);
  OptimTerms tm = terms;
  tm.step_size = 1.f;  // p -= 1 c u: the step c u, as p += (-c) u
  ops::optim_step({.param = t.params, .grad = Tensor(), .s1 = state("exp_avg"), .s2 = state("exp_avg_sq"),
                   .param_lowp = t.params_lowp, .segments = seg_table_, .seg_stats = to_state_device(c, 1),
                   .rule = OptimRule::LambApply, .t = tm},
                  s);
}

void OneBitLamb::warmup_step(const StepTensors& t, const StepHyper& h, const OptimTerms& terms, const Stream& s) {
  const int64_t S = static_cast<int64_t>(segs_.size());
  const Tensor stats = Tensor::zeros({S, 2}, DType::F32, dev_);  // {sum p^2, sum u^2} per segment
  ops::optim_step({.param = t.params, .grad = t.grads, .s1 = state("exp_avg"), .s2 = state("exp_avg_sq"),
                   .param_lowp = Tensor(), .segments = seg_table_, .seg_stats = stats,
                   .rule = OptimRule::LambMoments, .t = terms},
                  s);
  if (step_ == spec_.freeze_step) state("exp_avg_sq_fresh").copy_from(state("exp_avg_sq"));
  const std::vector<float> sums = to_host(stats);
  for (size_t k = 0; k < segs_.size(); ++k) {
    const double coeff = optim_rule::lamb_coeff(sums[2 * k], sums[2 * k + 1], spec_.min_coeff, spec_.max_coeff);
    if (coeff != 1.0) coeff_freeze_[k] = spec_.coeff_beta * coeff_freeze_[k] + (1 - spec_.coeff_beta) * coeff;
    coeffs_[k] = coeff;
  }
  apply(t, h, terms, s);
}

void OneBitLamb::compressed_step(const StepTensors& t, const StepHyper& h, const OptimTerms& terms,
                                 const Stream& s) {
  const Tensor m = state("exp_avg");
  const int64_t S = static_cast<int64_t>(segs_.size());
  if (!have_scaling_) {  // the momentum scales at the end of the warm-up
    const Tensor sq = Tensor::zeros({S}, DType::F32, dev_);
    for (int64_t k = 0; k < S; ++k) {
      const Segment& g = segs_[static_cast<size_t>(k)];
      ops::sum_squares({.out = sq.view(k, {1}), .x = m.view(g.begin, {g.end - g.begin})}, s);
    }
    const std::vector<float> sums = to_host(sq);
    std::vector<double> rms(segs_.size());
    double sum = 0;
    for (size_t k = 0; k < segs_.size(); ++k) {
      rms[k] = std::sqrt(static_cast<double>(sums[k])) / std::sqrt(static_cast<double>(segs_[k].end - segs_[k].begin));
      sum += rms[k];
    }
    const double united = segs_.empty() ? 0 : sum / static_cast<double>(segs_.size());
    for (size_t k = 0; k < segs_.size(); ++k) scaling_[k] = rms[k] != 0 ? united / rms[k] : 1.0;
    have_scaling_ = true;
  }
  if (!m_old_.defined()) m_old_ = Tensor::empty({end() - begin()}, DType::F32, dev_);
  std::vector<float> scale(segs_.size());
  for (size_t k = 0; k < segs_.size(); ++k) scale[k] = static_cast<float>(scaling_[k]);
  ops::optim_step({.param = t.params, .grad = t.grads, .s1 = m, .s2 = Tensor(), .param_lowp = Tensor(),
                   .segments = seg_table_, .seg_stats = to_state_device(scale, 1),
                   .rule = OptimRule::OneBitLambMomentum, .prev = m_old_, .t = terms},
                  s);
  exchange_whole(m);
  // Per segment {scale in; max (sqrt(v) + eps) / (sqrt(w) + eps), sum u0^2, sum u^2 out}.
  std::vector<float> row(4 * segs_.size(), 0.f);
  for (size_t k = 0; k < segs_.size(); ++k) row[4 * k] = scale[k];
  const Tensor stats = to_state_device(row, 4);
  ops::optim_step({.param = t.params, .grad = Tensor(), .s1 = m, .s2 = state("exp_avg_sq"), .param_lowp = Tensor(),
                   .segments = seg_table_, .seg_stats = stats, .rule = OptimRule::OneBitLambFresh,
                   .s3 = state("exp_avg_sq_fresh"), .prev = m_old_, .t = terms},
                  s);
  row = to_host(stats);
  for (size_t k = 0; k < segs_.size(); ++k) {
    double f = row[4 * k + 1];
    if (segs_[k].decay && h.weight_decay > 0.f) {
      const float n0 = static_cast<float>(std::sqrt(static_cast<double>(row[4 * k + 2])));
      const float n1 = static_cast<float>(std::sqrt(static_cast<double>(row[4 * k + 3])));
      const double q = std::min(1.0, static_cast<double>(n0 / n1));
      f = f * q + (1.0 - q);
    }
    f = std::max(std::min(f, double{spec_.factor_max}), double{spec_.factor_min});
    const double thr = spec_.factor_threshold;
    f = std::max(std::min(f, last_factor_[k] * (1.0 + thr)), last_factor_[k] * (1.0 - thr));
    last_factor_[k] = f;
    coeffs_[k] = coeff_freeze_[k] * f;
  }
  apply(t, h, terms, s);
}

void OneBitLamb::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s) {
  check_range(t, end() - begin(), "step");
  ++step_;
  if (!initialized_) {  // DeepSpeed's initialisation call: exp_avg through a compression with fresh errors
    initialized_ = true;
    reset_errors();
    exchange_whole(state("exp_avg"));
    reset_errors();
    return;
  }
  if (!segs_.empty()) {  // (stage 0: every rank's range is the whole model)
    const OptimTerms terms = base_optim_terms(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, grad_scale);
    if (frozen_)
      compressed_step(t, h, terms, s);
    else
      warmup_step(t, h, terms, s);
  }
  if (!frozen_ && step_ >= spec_.freeze_step) frozen_ = local_ = true;  // compressed from the next step on
}

}  // namespace ds
