// DeepSpeed's "Lamb" (FusedLamb): Adam's moments, the update
// u = m / (sqrt(v) + eps) + wd p (no bias correction inside u; with
// eps_inside_sqrt, sqrt(v + eps)), and per parameter tensor the trust ratio
// ||p|| / ||u|| (1 when either is 0) clamped to [min_coeff, max_coeff], then
// p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * ratio * u (lr alone without
// bias_correction). States exp_avg, exp_avg_sq.
//
// "Per tensor" is the parameter tensor this rank's model holds: under ZeRO a
// tensor is split across the data-parallel ranks' ranges, so each rank sums
// p^2 and u^2 over its part of every tensor and the partial sums are added
// over the group (Optimizer::set_shard_sum) before any ratio is taken: the
// ratios are those of the whole tensor, as without ZeRO. Under tensor
// parallelism each rank's slice is its own tensor (DeepSpeed and Megatron give
// the optimizer each rank's local parameters), so the ratio of a split weight
// is the slice's; replicated weights (norms, biases of row-parallel layers)
// have the same ratio on every tensor-parallel rank.
//
// Two passes of the optim_step op (LambMoments, LambApply) with one read of
// the per-tensor sums to the host in between; no update in parts (offload
// refuses it) and no device-gated step (--cuda-graph refuses it).
#pragma once
#include "lib/ops/optim_rules.h"
#include "lib/optim/optimizer.h"

namespace ds {

class Lamb final : public Optimizer {
 public:
  Lamb(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end);

  const char* type() const override { return "Lamb"; }
  std::vector<OptimizerStateSpec> state_specs() const override {
    return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}};
  }
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  bool step_part(int64_t, int64_t, const StepTensors&, const StepHyper&, float) override { return false; }
  void step_empty_range() override;

  // The trust ratios of the last step, one per parameter of the layout
  // (DeepSpeed's get_lamb_coeffs; parameters outside the range: 1).
  const std::vector<float>& last_coeffs() const { return coeffs_; }

 private:
  OptimTerms terms(const StepHyper& h, float grad_scale) const;
  // (P, 2) f32 {sum p^2, sum u^2} per layout parameter on the state's device,
  // summed over the shards; the segments' rows filled from `seg_sums` (S, 2).
  std::vector<float> tensor_sums(const std::vector<float>& seg_sums);
  OptimizerSpec spec_;
  std::vector<Segment> segs_;
  Tensor segments_;  // (S, 3) i64 of the owned range, on the state's device
  Device dev_;
  std::vector<float> coeffs_;
};

}  // namespace ds
