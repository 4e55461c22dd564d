// The optimizer base (named state over an owned range) and make_optimizer,
// which builds the class of a type in the table of optimizer_types.cpp.
#include "lib/optim/optimizer.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/optim/adamw.h"

namespace ds {

Optimizer::Optimizer(const ModelLayout& layout, int64_t begin, int64_t end)
    : layout_(&layout), begin_(begin), end_(end) {
  DS_CHECK(0 <= begin && begin <= end && end <= layout.total, "optimizer range [{}, {}) outside 0..{}", begin, end,
           layout.total);
}

void Optimizer::allocate_state(Device dev) {
  MemTagScope tag(MemTag::Optimizer);  // counted as model state (lib/core/mem_tag.h)
  for (const OptimizerStateSpec& s : state_specs())
    state_.emplace_back(s.name, Tensor::zeros({end_ - begin_}, s.dtype, dev));
}

void Optimizer::check_range(const StepTensors& t, int64_t n, const char* what) const {
  DS_CHECK(t.params.numel() == n && t.grads.numel() == n && (!t.params_lowp.defined() || t.params_lowp.numel() == n),
           "{} {}: params {} / grads {} elements, expected {}", type(), what, t.params.numel(), t.grads.numel(), n);
}

void Optimizer::step_gated(const StepTensors&, const StepHyper&, const Tensor&, const Stream&) {
  DS_CHECK(false, "optimizer {} has no device-gated step", type());
}

AdamWTerms Optimizer::next_terms(const StepHyper&) const {
  DS_CHECK(false, "optimizer {} has no device-gated step", type());
  return {};
}

Tensor& Optimizer::state(std::string_view name) {
  for (auto& [n, t] : state_)
    if (n == name) return t;
  DS_CHECK(false, "optimizer {} has no state '{}'", type(), name);
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

std::unique_ptr<Optimizer> make_optimizer(std::string_view type, const ModelLayout& layout, Device dev,
                                          int64_t begin, int64_t end) {
  const std::optional<OptimizerKind> kind = optimizer_kind(type);
  DS_USER_CHECK(kind.has_value(), "optimizer.type '{}' is not supported (dstrain implements {})", type,
                optimizer_types_text());
  switch (*kind) {
    case OptimizerKind::AdamW: return std::make_unique<AdamW>(layout, dev, begin, end);
  }
  DS_CHECK(false, "optimizer kind {} has no class", static_cast<int>(*kind));
  return nullptr;
}

}  // namespace ds
