// AdamW over the flat layout: one fused op call per parameter range, with the
// weight-decay choice taken from the layout (decay flag per weight).
#include "lib/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/ops/ops.h"

namespace ds {

AdamW::AdamW(const ModelLayout& layout, Device dev, int64_t begin, int64_t end)
    : layout_(&layout), begin_(begin), end_(end) {
  DS_CHECK(0 <= begin && begin <= end && end <= layout.total, "AdamW range [{}, {}) outside 0..{}", begin, end,
           layout.total);
  MemTagScope tag(MemTag::Optimizer);  // counted as model state (lib/core/mem_tag.h)
  m_ = Tensor::zeros({end - begin}, DType::F32, dev);
  v_ = Tensor::zeros({end - begin}, DType::F32, dev);
}

void AdamW::step(const Tensor& params, const Tensor& grads, const AdamWHyper& h, float grad_scale,
                 const Stream& s, const Tensor& params_lowp) {
  DS_CHECK(params.numel() == end_ - begin_ && grads.numel() == end_ - begin_,
           "AdamW: params {} / grads {} elements, expected {}", params.numel(), grads.numel(), end_ - begin_);
  ++step_;
  for (const ParamSpec& p : layout_->params) {
    int64_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.numel, end_);
    if (lo >= hi) continue;
    int64_t off = lo - begin_, n = hi - lo;
    AdamWArgs a;
    a.param = params.view(off, {n});
    a.grad = grads.view(off, {n});
    if (params_lowp.defined()) a.param_lowp = params_lowp.view(off, {n});
    a.m = m_.view(off, {n});
    a.v = v_.view(off, {n});
    a.lr = h.lr;
    a.beta1 = h.beta1;
    a.beta2 = h.beta2;
    a.eps = h.eps;
    a.weight_decay = p.decay ? h.weight_decay : 0.f;
    a.grad_scale = grad_scale;
    a.step = step_;
    ops::adamw_step(a, s);
  }
}

double grad_sum_squares(const Tensor& grads, const Stream& s) {
  Tensor acc = Tensor::zeros({1}, DType::F32, grads.device());
  ops::sum_squares({.out = acc, .x = grads}, s);
  Tensor host = acc.device().is_cpu() ? acc : acc.to(Device::cpu());
  return static_cast<double>(host.data<float>()[0]);
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.f;
  double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.f;
}

}  // namespace ds
