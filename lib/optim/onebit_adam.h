// DeepSpeed's "OneBitAdam" (runtime/fp16/onebit/adam.py, with the engine's
// switch of the gradient all-reduce), at ZeRO stage 0 on the CPU backend and
// on GPUs (the update is optim_step's, the exchange runs over NCCL there):
//   - the first step of a process (and of a resumed one) only initialises:
//     it counts the step and, with several data-parallel ranks, replaces
//     exp_avg by its 1-bit compressed mean (zeros on a fresh start), as
//     DeepSpeed's initialisation call does; the weights do not move;
//   - warm-up (until the step count reaches freeze_step): the gradients are
//     all-reduced as for Adam, m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
//     u = m / (sqrt(v) + eps) (no bias correction, whatever bias_correction
//     says), u += wd p where the parameter decays, p -= lr u;
//   - compressed (from the step after the one that reached freeze_step): v is
//     frozen, the gradients stay local (the trainer skips their all-reduce:
//     gradients_stay_local()), m = b1 m + (1 - b1) g with the rank's own g,
//     then each parameter tensor's m is replaced by its 1-bit compressed mean
//     over the data-parallel ranks (lib/optim/onebit_exchange.h, error feedback kept per
//     tensor), u and p as in warm-up.
// Compression is per parameter tensor of the rank's layout (DeepSpeed's fp32
// path), or per parameter group under fp16 (OptimizerSpec::
// compress_param_groups: DeepSpeed's fp16 wrapper flattens each group into
// one tensor). The shared part: onebit_family.h.
#pragma once
#include "lib/optim/onebit_family.h"

namespace ds {

class OneBitAdam final : public OneBitFamily {
 public:
  OneBitAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end);

  const char* type() const override { return "OneBitAdam"; }
  std::vector<OptimizerStateSpec> state_specs() const override {
    return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}};
  }
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  void set_step_count(int64_t n) override;

 private:
  OptimizerSpec spec_;
};

}  // namespace ds
