// DeepSpeed's 1-bit Lamb (onebit_lamb.h).
#include "lib/optim/onebit_lamb.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

// K sums over i in [0, n) of what f(i, acc) adds to acc[0..K): blocks of a
// fixed size summed in double, then the blocks in order, so that the sums do
// not depend on the thread count.
constexpr int64_t kBlock = 1 << 16;

template <int K, class F>
std::array<double, K> block_sums(int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<std::array<double, K>> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    std::array<double, K> acc{};
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) f(i, acc);
    part[static_cast<size_t>(b)] = acc;
  }
  std::array<double, K> out{};
  for (const auto& a : part)
    for (int k = 0; k < K; ++k) out[k] += a[k];
  return out;
}

float root(double sum_sq) { return static_cast<float>(std::sqrt(sum_sq)); }

}  // namespace

OneBitLamb::OneBitLamb(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : OneBitFamily(layout, dev, begin, end, "OneBitLamb"), spec_(spec) {
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

void OneBitLamb::warmup_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  float* p = t.params.data<float>();
  const float* g = t.grads.data<float>();
  float* m = state("exp_avg").data<float>();
  float* v = state("exp_avg_sq").data<float>();
  const int64_t n = end() - begin();
  const float b1 = h.beta1, b2 = h.beta2, c1 = 1.f - h.beta1, c2 = 1.f - h.beta2;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = m[i] * b1 + c1 * gi;
    v[i] = v[i] * b2 + c2 * gi * gi;
  }
  if (step_ == spec_.freeze_step) state("exp_avg_sq_fresh").copy_from(state("exp_avg_sq"));
  for (size_t k = 0; k < segs_.size(); ++k) {
    const Segment& s = segs_[k];
    const float wd = s.decay ? h.weight_decay : 0.f;
    // u = m / (sqrt(v) + eps) + wd p, computed where it is used (the norms, then the update).
    auto u = [&](int64_t e) {
      const float x = m[e] / (std::sqrt(v[e]) + h.eps);
      return wd > 0.f ? x + wd * p[e] : x;
    };
    const auto sums = block_sums<2>(s.end - s.begin, [&](int64_t i, std::array<double, 2>& a) {
      const int64_t e = s.begin + i;
      const double ue = u(e);
      a[0] += static_cast<double>(p[e]) * p[e];
      a[1] += ue * ue;
    });
    const float wn = root(sums[0]), un = root(sums[1]);
    double coeff = 1.0;
    if (wn != 0.f && un != 0.f) coeff = std::min(std::max(static_cast<double>(wn / un), double{spec_.min_coeff}),
                                                 double{spec_.max_coeff});
    if (coeff != 1.0) coeff_freeze_[k] = spec_.coeff_beta * coeff_freeze_[k] + (1 - spec_.coeff_beta) * coeff;
    coeffs_[k] = coeff;
    const float step = static_cast<float>(-h.lr * coeff);
#pragma omp parallel for schedule(static)
    for (int64_t e = s.begin; e < s.end; ++e) p[e] += step * u(e);
  }
}

void OneBitLamb::compressed_step(const StepTensors& t, const StepHyper& h, float grad_scale) {
  float* p = t.params.data<float>();
  const float* g = t.grads.data<float>();
  float* m = state("exp_avg").data<float>();
  const float* v = state("exp_avg_sq").data<float>();
  float* w = state("exp_avg_sq_fresh").data<float>();
  const int64_t n = end() - begin();
  const float b1 = h.beta1, b2 = h.beta2, c1 = 1.f - h.beta1, c2 = 1.f - h.beta2;
  m_old_.assign(m, m + n);
  const float* m_old = m_old_.data();
  if (!have_scaling_) {  // the momentum scales at the end of the warm-up
    std::vector<double> rms(segs_.size());
    double sum = 0;
    for (size_t k = 0; k < segs_.size(); ++k) {
      const Segment& s = segs_[k];
      const auto sq = block_sums<1>(s.end - s.begin, [&](int64_t i, std::array<double, 1>& a) {
        a[0] += static_cast<double>(m[s.begin + i]) * m[s.begin + i];
      });
      rms[k] = root(sq[0]) / std::sqrt(static_cast<double>(s.end - s.begin));
      sum += rms[k];
    }
    const double united = segs_.empty() ? 0 : sum / static_cast<double>(segs_.size());
    for (size_t k = 0; k < segs_.size(); ++k) scaling_[k] = rms[k] != 0 ? united / rms[k] : 1.0;
    have_scaling_ = true;
  }
  for (size_t k = 0; k < segs_.size(); ++k) {
    const float sc = static_cast<float>(scaling_[k]);
#pragma omp parallel for schedule(static)
    for (int64_t i = segs_[k].begin; i < segs_[k].end; ++i) m[i] = (m[i] * b1 + c1 * (g[i] * grad_scale)) * sc;
  }
  exchange_whole(m);
  for (size_t k = 0; k < segs_.size(); ++k) {
    const Segment& s = segs_[k];
    const float wd = s.decay ? h.weight_decay : 0.f;
    const float sc = static_cast<float>(scaling_[k]);
    // First pass: m unscaled, exp_avg_sq_fresh from the gradient the
    // exchanged momentum implies, the factor's maximum and the norms of u0
    // and u (the maximum per block of block_sums, each block on one thread);
    // second pass: the update.
    std::vector<float> part_max(static_cast<size_t>((s.end - s.begin + kBlock - 1) / kBlock), 0.f);
    const auto sums = block_sums<2>(s.end - s.begin, [&](int64_t i, std::array<double, 2>& a) {
      const int64_t e = s.begin + i;
      m[e] /= sc;
      const float rec = (m[e] - m_old[e] * b1) / c1;
      w[e] = w[e] * b2 + c2 * rec * rec;
      const float denom = std::sqrt(v[e]) + h.eps;
      const float u0 = m[e] / denom, u = wd > 0.f ? u0 + wd * p[e] : u0;
      float& mx = part_max[static_cast<size_t>(i / kBlock)];
      mx = std::max(mx, denom / (std::sqrt(w[e]) + h.eps));
      a[0] += static_cast<double>(u0) * u0;
      a[1] += static_cast<double>(u) * u;
    });
    double f = part_max.empty() ? 0.f : *std::max_element(part_max.begin(), part_max.end());
    if (wd > 0.f) {
      const double q = std::min(1.0, static_cast<double>(root(sums[0]) / root(sums[1])));
      f = f * q + (1.0 - q);
    }
    f = std::max(std::min(f, double{spec_.factor_max}), double{spec_.factor_min});
    const double thr = spec_.factor_threshold;
    f = std::max(std::min(f, last_factor_[k] * (1.0 + thr)), last_factor_[k] * (1.0 - thr));
    last_factor_[k] = f;
    coeffs_[k] = coeff_freeze_[k] * f;
    const float step = static_cast<float>(-h.lr * coeffs_[k]);
#pragma omp parallel for schedule(static)
    for (int64_t e = s.begin; e < s.end; ++e) {
      const float u0 = m[e] / (std::sqrt(v[e]) + h.eps);
      p[e] += step * (wd > 0.f ? u0 + wd * p[e] : u0);
    }
  }
}

void OneBitLamb::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream&) {
  check_range(t, end() - begin(), "step");
  ++step_;
  if (!initialized_) {  // DeepSpeed's initialisation call: exp_avg through a compression with fresh errors
    initialized_ = true;
    reset_errors();
    exchange_whole(state("exp_avg").data<float>());
    reset_errors();
    return;
  }
  if (frozen_)
    compressed_step(t, h, grad_scale);
  else
    warmup_step(t, h, grad_scale);
  if (!frozen_ && step_ >= spec_.freeze_step) frozen_ = local_ = true;  // compressed from the next step on
  if (t.params_lowp.defined()) ops::cast({.out = t.params_lowp, .inp = t.params}, Stream{});
}

}  // namespace ds
