// Element-wise optimizers over the flat layout (elementwise.h): the rule's
// per-step values on the host, then one optim_step call.
#include "lib/optim/elementwise.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

OptimRule rule_of(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamL2: return OptimRule::AdamL2;
    case OptimizerKind::AdamW: return OptimRule::AdamW;
    case OptimizerKind::SGD: return OptimRule::Sgd;
    case OptimizerKind::Adagrad: return OptimRule::Adagrad;
    case OptimizerKind::Lion: return OptimRule::Lion;
    case OptimizerKind::Lamb:
    case OptimizerKind::OneBitAdam:
    case OptimizerKind::ZeroOneAdam:
    case OptimizerKind::OneBitLamb: break;
  }
  DS_CHECK(false, "optimizer kind {} is not element-wise", optimizer_kind_name(k));
  return OptimRule::Sgd;
}

}  // namespace

ElementwiseOptimizer::ElementwiseOptimizer(OptimizerKind kind, const OptimizerSpec& spec, const ModelLayout& layout,
                                           Device dev, int64_t begin, int64_t end, StateHome home)
    : Optimizer(layout, begin, end), kind_(kind), spec_(spec), rule_(rule_of(kind)) {
  allocate_state(dev, home);
  if (home == StateHome::Own && initial_state_value(0) != 0.f && end > begin) {
    Tensor host = Tensor::empty({end - begin}, DType::F32);
    std::fill(host.data<float>(), host.data<float>() + host.numel(), spec.initial_accumulator_value);
    state("sum").copy_from(host);
  }
  segments_ = segment_table(segments_in(begin, end), dev);
}

float ElementwiseOptimizer::initial_state_value(size_t i) const {
  return kind_ == OptimizerKind::Adagrad && i == 0 ? spec_.initial_accumulator_value : 0.f;
}

std::vector<OptimizerStateSpec> ElementwiseOptimizer::state_specs() const {
  switch (kind_) {
    case OptimizerKind::SGD:
      if (spec_.momentum == 0.f) return {};
      return {{"momentum_buffer", DType::F32}};
    case OptimizerKind::Adagrad: return {{"sum", DType::F32, true}};
    case OptimizerKind::Lion: return {{"exp_avg", DType::F32}};
    default: return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}};
  }
}

OptimTerms ElementwiseOptimizer::terms(const StepHyper& h, float grad_scale) const {
  OptimTerms t = base_optim_terms(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, grad_scale);
  const int64_t n = step_;  // 1-based: the step being taken
  if (rule_ == OptimRule::AdamL2 || rule_ == OptimRule::AdamW) {
    const AdamWTerms a = adamw_terms(h.lr, h.weight_decay, h.beta1, h.beta2, n);
    t.step_size = spec_.bias_correction ? a.step_size : h.lr;
    t.inv_sqrt_bc2 = spec_.bias_correction ? a.inv_sqrt_bc2 : 1.f;
  } else if (rule_ == OptimRule::Sgd) {
    t.momentum = spec_.momentum;
    t.dampening = spec_.dampening;
    t.nesterov = spec_.nesterov;
    t.first = n == 1;
  } else if (rule_ == OptimRule::Adagrad) {  // torch: clr = lr / (1 + (step - 1) lr_decay)
    t.lr = static_cast<float>(static_cast<double>(h.lr) /
                              (1.0 + static_cast<double>(n - 1) * static_cast<double>(spec_.lr_decay)));
  }
  return t;
}

void ElementwiseOptimizer::run(const StepTensors& t, const Tensor& s1, const Tensor& s2, const Tensor& segments,
                               const StepHyper& h, float grad_scale, const Stream& s) const {
  if (!segments.defined()) return;  // no parameter in the range
  OptimStepArgs a{.param = t.params, .grad = t.grads, .s1 = s1, .s2 = s2, .param_lowp = t.params_lowp,
                  .segments = segments, .seg_stats = Tensor(), .rule = rule_, .t = terms(h, grad_scale)};
  ops::optim_step(a, s);
}

void ElementwiseOptimizer::step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s) {
  DS_CHECK(!state_elsewhere(), "{}: a whole-range step with the state elsewhere (step_part only)", type());
  check_range(t, end() - begin(), "step");
  ++step_;
  const std::vector<OptimizerStateSpec> specs = state_specs();
  const Tensor s1 = specs.size() > 0 ? state(specs[0].name) : Tensor();
  const Tensor s2 = specs.size() > 1 ? state(specs[1].name) : Tensor();
  run(t, s1, s2, segments_, h, grad_scale, s);
}

bool ElementwiseOptimizer::step_part(int64_t lo, int64_t hi, const StepTensors& t, const StepHyper& h,
                                     float grad_scale) {
  DS_CHECK(0 <= lo && lo <= hi && hi <= end() - begin(), "{} part [{}, {}) of a range of {}", type(), lo, hi,
           end() - begin());
  check_range(t, hi - lo, "part");
  const std::vector<OptimizerStateSpec> specs = state_specs();
  const Tensor s1 = specs.size() > 0 ? part_state(t, 0, lo, hi) : Tensor();
  const Tensor s2 = specs.size() > 1 ? part_state(t, 1, lo, hi) : Tensor();
  run(t, s1, s2, segment_table(segments_in(begin() + lo, begin() + hi), t.params.device()), h, grad_scale,
      Stream{});
  return true;
}

}  // namespace ds
