// The optimizer base (named state over an owned range) and make_optimizer,
// which builds the class of a type in the table of optimizer_types.cpp.
#include "lib/optim/optimizer.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/optim/adamw.h"
#include "lib/optim/elementwise.h"
#include "lib/optim/lamb.h"
#include "lib/optim/onebit_adam.h"
#include "lib/optim/onebit_lamb.h"
#include "lib/optim/zero_one_adam.h"

namespace ds {

Optimizer::Optimizer(const ModelLayout& layout, int64_t begin, int64_t end)
    : layout_(&layout), begin_(begin), end_(end) {
  DS_CHECK(0 <= begin && begin <= end && end <= layout.total, "optimizer range [{}, {}) outside 0..{}", begin, end,
           layout.total);
}

void Optimizer::allocate_state(Device dev, StateHome home) {
  elsewhere_ = home == StateHome::Elsewhere;
  if (elsewhere_) return;
  MemTagScope tag(MemTag::Optimizer);  // counted as model state (lib/core/mem_tag.h)
  for (const OptimizerStateSpec& s : state_specs())
    state_.emplace_back(s.name, Tensor::zeros({end_ - begin_}, s.dtype, dev));
}

void Optimizer::check_range(const StepTensors& t, int64_t n, const char* what) const {
  DS_CHECK(t.params.numel() == n && t.grads.numel() == n && (!t.params_lowp.defined() || t.params_lowp.numel() == n),
           "{} {}: params {} / grads {} elements, expected {}", type(), what, t.params.numel(), t.grads.numel(), n);
}

Tensor Optimizer::part_state(const StepTensors& t, size_t i, int64_t lo, int64_t hi) {
  if (!elsewhere_) return state_.at(i).second.view(lo, {hi - lo});
  DS_CHECK(i < t.states.size() && t.states[i].numel() == hi - lo && t.states[i].dtype() == DType::F32,
           "{} part [{}, {}): state {} of {} handed in", type(), lo, hi, i, t.states.size());
  return t.states[i];
}

void Optimizer::step_gated(const StepTensors&, const StepHyper&, const Tensor&, const Stream&) {
  DS_CHECK(false, "optimizer {} has no device-gated step", type());
}

AdamWTerms Optimizer::next_terms(const StepHyper&) const {
  DS_CHECK(false, "optimizer {} has no device-gated step", type());
  return {};
}

std::vector<Optimizer::Segment> Optimizer::segments_in(int64_t first, int64_t last) const {
  std::vector<Segment> out;
  const std::vector<ParamSpec>& ps = layout_->params;
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t lo = std::max(ps[i].offset, first), hi = std::min(ps[i].offset + ps[i].numel, last);
    if (lo < hi) out.push_back({lo - first, hi - first, ps[i].decay, static_cast<int>(i)});
  }
  std::sort(out.begin(), out.end(), [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  return out;
}

Tensor Optimizer::segment_table(const std::vector<Segment>& segs, Device dev) {
  if (segs.empty()) return Tensor();
  Tensor host = Tensor::empty({static_cast<int64_t>(segs.size()), 3}, DType::I64);
  int64_t* t = host.data<int64_t>();
  for (size_t i = 0; i < segs.size(); ++i) {
    t[3 * i] = segs[i].begin;
    t[3 * i + 1] = segs[i].end;
    t[3 * i + 2] = segs[i].decay ? 1 : 0;
  }
  return dev.is_cpu() ? host : host.to(dev);
}

Tensor& Optimizer::state(std::string_view name) {
  for (auto& [n, t] : state_)
    if (n == name) return t;
  DS_CHECK(false, "optimizer {} has no state '{}'{}", type(), name, elsewhere_ ? " (its state lives elsewhere)" : "");
  return state_.front().second;  // not reached
}

bool Optimizer::has_state(std::string_view name) const {
  return std::any_of(state_.begin(), state_.end(), [&](const auto& s) { return s.first == name; });
}

std::vector<Tensor> Optimizer::states() const {
  std::vector<Tensor> out;
  for (const auto& s : state_) out.push_back(s.second);
  return out;
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& s : state_) b += s.second.nbytes();
  return b;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, const ModelLayout& layout, Device dev,
                                          int64_t begin, int64_t end, StateHome home) {
  const std::optional<OptimizerKind> kind = optimizer_kind(spec);
  DS_USER_CHECK(kind.has_value(), "optimizer.type '{}' is not supported (dstrain implements {})", spec.type,
                optimizer_types_text());
  const bool scaled = std::any_of(layout.params.begin(), layout.params.end(),
                                  [](const ParamSpec& p) { return p.lr_scale != 1.f; });
  DS_USER_CHECK(!scaled || (*kind == OptimizerKind::AdamW && spec.bias_correction),
                "per-tensor learning rates (LoRA) run with AdamW only; optimizer.type is '{}'", spec.type);
  switch (*kind) {
    case OptimizerKind::AdamW:
      // The fused AdamW op (with its device-gated step) has bias correction built in.
      if (spec.bias_correction) return std::make_unique<AdamW>(layout, dev, begin, end, home);
      return std::make_unique<ElementwiseOptimizer>(*kind, spec, layout, dev, begin, end, home);
    case OptimizerKind::AdamL2:
    case OptimizerKind::SGD:
    case OptimizerKind::Adagrad:
    case OptimizerKind::Lion:
      return std::make_unique<ElementwiseOptimizer>(*kind, spec, layout, dev, begin, end, home);
    case OptimizerKind::Lamb:
      DS_CHECK(home == StateHome::Own, "Lamb keeps its own state (its update is not element-wise)");
      return std::make_unique<Lamb>(spec, layout, dev, begin, end);
    case OptimizerKind::OneBitAdam:
    case OptimizerKind::ZeroOneAdam:
    case OptimizerKind::OneBitLamb:
      DS_CHECK(home == StateHome::Own, "{} keeps its own state (ZeRO stage 0 only)", spec.type);
      if (*kind == OptimizerKind::ZeroOneAdam) return std::make_unique<ZeroOneAdam>(spec, layout, dev, begin, end);
      if (*kind == OptimizerKind::OneBitLamb) return std::make_unique<OneBitLamb>(spec, layout, dev, begin, end);
      return std::make_unique<OneBitAdam>(spec, layout, dev, begin, end);
  }
  DS_CHECK(false, "optimizer kind {} has no class", static_cast<int>(*kind));
  return nullptr;
}

}  // namespace ds
