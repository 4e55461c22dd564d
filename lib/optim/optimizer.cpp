// The optimizer base (named state over an owned range) and the registry of
// DeepSpeed optimizer types. A new optimizer adds one row to kRegistry.
#include "lib/optim/optimizer.h"

#include <algorithm>
#include <cctype>

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

namespace {

using Factory = std::unique_ptr<Optimizer> (*)(const ModelLayout&, Device, int64_t, int64_t);

template <class T>
std::unique_ptr<Optimizer> make(const ModelLayout& layout, Device dev, int64_t begin, int64_t end) {
  return std::make_unique<T>(layout, dev, begin, end);
}

struct Registered {
  const char* type;  // DeepSpeed's spelling
  Factory factory;
};

// DeepSpeed's "Adam" with its default adam_w_mode is AdamW (decoupled weight decay).
constexpr Registered kRegistry[] = {
    {"Adam", make<AdamW>},
    {"AdamW", make<AdamW>},
};

bool same_type(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::string canonical_optimizer_type(std::string_view type) {
  for (const Registered& r : kRegistry)
    if (same_type(r.type, type)) return r.type;
  return "";
}

std::string optimizer_types_text() {
  std::string s;
  const size_t n = std::size(kRegistry);
  for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " and " : ", ") + kRegistry[i].type;
  return s;
}

std::unique_ptr<Optimizer> make_optimizer(std::string_view type, const ModelLayout& layout, Device dev,
                                          int64_t begin, int64_t end) {
  for (const Registered& r : kRegistry)
    if (same_type(r.type, type)) return r.factory(layout, dev, begin, end);
  DS_USER_ERROR("optimizer.type '{}' is not supported (dstrain implements {})", type, optimizer_types_text());
}

}  // namespace ds
