// AdamW over the flat layout: one fused op call for the whole owned range,
// its per-step values by value or from a step-scalars block (step_gated).
// The layout's parameters become the call's segments (one per parameter, with
// its decay flag), built once on the device: one kernel launch per step on
// CUDA, and on the CPU the same bits as one call per parameter.
#include "lib/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

AdamW::AdamW(const ModelLayout& layout, Device dev, int64_t begin, int64_t end, StateHome home)
    : Optimizer(layout, begin, end) {
  allocate_state(dev, home);
  if (home == StateHome::Own) {
    m_ = state("exp_avg");
    v_ = state("exp_avg_sq");
  }
  // The segment table (24 bytes per parameter) is bookkeeping, not model state.
  std::vector<int64_t> seg;  // {begin, end, decay} relative to begin, sorted by offset
  std::vector<const ParamSpec*> specs;
  for (const ParamSpec& p : layout.params) specs.push_back(&p);
  std::sort(specs.begin(), specs.end(), [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  for (const ParamSpec* p : specs) {
    const int64_t lo = std::max(p->offset, begin), hi = std::min(p->offset + p->numel, end);
    if (lo >= hi) continue;
    seg.insert(seg.end(), {lo - begin, hi - begin, p->decay ? 1 : 0});
    scaled_ = scaled_ || p->lr_scale != 1.f;
  }
  if (seg.empty()) return;
  Tensor host = Tensor::empty({int64_t(seg.size() / 3), 3}, DType::I64);
  std::copy(seg.begin(), seg.end(), host.data<int64_t>());
  segments_ = dev.is_cpu() ? host : host.to(dev);
}

AdamWArgs AdamW::args(const StepTensors& t, const StepHyper& h) const {
  DS_CHECK(!state_elsewhere(), "AdamW: a whole-range step with the moments elsewhere (step_part only)");
  check_range(t, end() - begin(), "step");
  AdamWArgs a;
  a.param = t.params;
  a.grad = t.grads;
  if (t.params_lowp.defined()) a.param_lowp = t.params_lowp;
  a.m = m_;
  a.v = v_;
  a.lr = h.lr;
  a.beta1 = h.beta1;
  a.beta2 = h.beta2;
  a.eps = h.eps;
  a.weight_decay = h.weight_decay;
  a.segments = segments_;
  return a;
}

void AdamW::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s) {
  AdamWArgs a = args(t, h);
  ++step_;
  if (!segments_.defined()) return;  // no parameter in the range
  if (scaled_) return step_params(0, end() - begin(), t, m_, v_, h, grad_scale);
  a.grad_scale = grad_scale;
  a.step = step_;
  ops::adamw_step(a, s);
}

bool AdamW::step_part(int64_t lo, int64_t hi, const StepTensors& t, const StepHyper& h, float grad_scale) {
  DS_CHECK(0 <= lo && lo <= hi && hi <= end() - begin(), "AdamW part [{}, {}) of a range of {}", lo, hi,
           end() - begin());
  check_range(t, hi - lo, "part");
  step_params(lo, hi, t, part_state(t, 0, lo, hi), part_state(t, 1, lo, hi), h, grad_scale);
  return true;
}

void AdamW::step_params(int64_t lo, int64_t hi, const StepTensors& t, const Tensor& m, const Tensor& v,
                        const StepHyper& h, float grad_scale) {
  const int64_t first = begin() + lo, last = begin() + hi;
  for (const ParamSpec& p : layout().params) {
    const int64_t a = std::max(p.offset, first), b = std::min(p.offset + p.numel, last);
    if (a >= b || p.lr_scale == 0.f) continue;  // frozen: no update, no moments
    AdamWArgs args;
    args.param = t.params.view(a - first, {b - a});
    args.grad = t.grads.view(a - first, {b - a});
    if (t.params_lowp.defined()) args.param_lowp = t.params_lowp.view(a - first, {b - a});
    args.m = m.view(a - first, {b - a});
    args.v = v.view(a - first, {b - a});
    args.lr = h.lr * p.lr_scale;
    args.beta1 = h.beta1;
    args.beta2 = h.beta2;
    args.eps = h.eps;
    args.weight_decay = p.decay ? h.weight_decay : 0.f;
    args.grad_scale = grad_scale;
    args.step = step_;
    ops::adamw_step(args, Stream{});
  }
}

void AdamW::step_gated(const StepTensors& t, const StepHyper& h, const Tensor& scalars, const Stream& s) {
  AdamWArgs a = args(t, h);
  if (!segments_.defined()) return;  // no parameter in the range
  a.scalars = scalars;
  ops::adamw_step(a, s);
}

double grad_sum_squares(const Tensor& grads, const Stream& s) {
  Tensor acc = Tensor::zeros({1}, DType::F32, grads.device());
  ops::sum_squares({.out = acc, .x = grads}, s);
  Tensor host = acc.device().is_cpu() ? acc : acc.to(Device::cpu());
  return static_cast<double>(host.data<float>()[0]);
}

}  // namespace ds
