// DeepSpeed's "ZeroOneAdam" (0/1 Adam, runtime/fp16/onebit/zoadam.py, with
// the engine's switch of the gradient all-reduce), at ZeRO stage 0 on the CPU
// backend and on GPUs (optim_step's 1-bit and ZeroOne rules; the exchange over
// NCCL there). No bias correction; u = m / (sqrt(v) + eps) + wd p (wd where the
// parameter decays); p -= lr u.
//   - The first step of a process only initialises (counts the step; the
//     weights do not move). The interval counters start at 1 and 0.
//   - Variance phase (until the step count passes var_freeze_step): on a
//     step whose count is a multiple of the variance interval the gradients
//     are all-reduced and m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2;
//     on the others the rank's own gradient goes through the 1-bit exchange
//     (lib/optim/onebit_exchange.h, per parameter tensor) and only m moves, with that
//     compressed mean (one rank: m does not move). After every variance step
//     a counter advances; at var_update_scaler the interval doubles.
//   - Local-step phase (from the step after the one whose count passes
//     var_freeze_step; the errors are zeroed then): v is frozen, the
//     gradients stay local, m = b1 m + (1 - b1) g with the rank's own g, the
//     weights take the local update and an accumulator a collects -lr u and
//     the learning rates' sum L. On a step whose count is a multiple of the
//     local-step interval the ranks synchronise: the local updates are
//     undone (p -= a), a *= sqrt(v) + eps, a is replaced by its 1-bit
//     compressed mean, m = -a / L, p += a / (sqrt(v) + eps), a = 0, L = 0.
//     Every local step advances a counter; at local_step_scaler the interval
//     doubles, up to local_step_clipper.
// Between synchronisations the ranks' weights differ (each took its own
// updates); every synchronisation makes them equal again. States exp_avg,
// exp_avg_sq; the accumulator, the counters and the errors are not saved
// (DeepSpeed drops them on load). A resumed process initialises again and
// restarts the counters, as DeepSpeed's; its first update is a variance step
// on all-reduced gradients (DeepSpeed's engine leaves that step's gradients
// local when the checkpoint was past var_freeze_step, which makes the
// ranks' weights drift apart for good; dstrain all-reduces them).
#pragma once
#include "lib/ops/optim_rules.h"
#include "lib/optim/onebit_family.h"

namespace ds {

class ZeroOneAdam final : public OneBitFamily {
 public:
  ZeroOneAdam(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end);

  const char* type() const override { return "ZeroOneAdam"; }
  std::vector<OptimizerStateSpec> state_specs() const override {
    return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}};
  }
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  void set_step_count(int64_t n) override;

 private:
  void variance_step(const StepTensors& t, const StepHyper& h, float grad_scale);
  void local_step(const StepTensors& t, const StepHyper& h, float grad_scale);
  void run(OptimRule rule, const StepTensors& t, const Tensor& grad, const Tensor& acc, const StepHyper& h,
           float grad_scale, float lr_sum = 0.f);
  OptimizerSpec spec_;
  Tensor acc_;  // DeepSpeed's momentum_accumulator (the compressed gradient before the freeze), on the state's device
  bool frozen_ = false;     // the local-step phase
  int64_t var_interval_ = 1, var_counter_ = 0, local_interval_ = 1, local_counter_ = 0;
  double lrs_ = 0;          // the learning rates summed since the last synchronisation
};

}  // namespace ds
