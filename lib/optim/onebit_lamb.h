// DeepSpeed's "OneBitLamb" (1-bit Lamb, runtime/fp16/onebit/lamb.py, with the
// engine's switch of the gradient all-reduce), at ZeRO stage 0, on the CPU
// backend and on GPUs. Per parameter tensor k it keeps, besides its state
// tensors, the frozen trust ratio c_k (0 at first), the last factor f_k (1)
// and, from the compression stage on, a momentum scale s_k.
//   - The first step of a process only initialises: it counts the step and,
//     with several data-parallel ranks, replaces exp_avg by its 1-bit
//     compressed mean (fresh errors, dropped after); the weights do not move.
//   - Warm-up (until the step count reaches freeze_step; the gradients are
//     all-reduced): Lamb without bias correction, m = b1 m + (1 - b1) g,
//     v = b2 v + (1 - b2) g^2, u = m / (sqrt(v) + eps) + wd p, the ratio
//     r = clamp(||p|| / ||u||, min_coeff, max_coeff) (1 when a norm is 0),
//     c_k = coeff_beta c_k + (1 - coeff_beta) r when r != 1, p -= lr r u. At
//     the step that reaches freeze_step, exp_avg_sq_fresh = v.
//   - Compression stage (from the next step; the gradients stay local): at
//     its first step s_k = mean_j(rms(m_j)) / rms(m_k) (1 for a tensor whose
//     momentum is all zero). Each step: m_old = m; m = (b1 m + (1 - b1) g) s_k
//     with the rank's own g; the whole range's m goes through the 1-bit
//     exchange as one tensor (lib/optim/onebit_exchange.h); m /= s_k; the gradient it
//     implies, h = (m - b1 m_old) / (1 - b1), updates
//     exp_avg_sq_fresh w = b2 w + (1 - b2) h^2 while v stays frozen;
//     u0 = m / (sqrt(v) + eps), u = u0 + wd p; the factor
//     f = max((sqrt(v) + eps) / (sqrt(w) + eps)) over the tensor, with decay
//     f = f q + 1 - q where q = min(1, ||u0|| / ||u||); f clamped to
//     [factor_min, factor_max], then to within factor_threshold of f_k;
//     f_k = f; p -= lr c_k f u.
// The element-wise work is optim_step's rules (LambMoments and LambApply in
// the warm-up; OneBitLambMomentum, OneBitLambFresh and LambApply after it),
// run where the state lives; the per-tensor values (norms, maxima) come back
// to the host once or twice a step, where the ratios and factors are decided,
// as DeepSpeed's .item() calls do.
// States exp_avg, exp_avg_sq, exp_avg_sq_fresh. A checkpoint of the
// compression stage also keeps c_k, f_k and s_k (s_k once computed;
// saved_scalars; it resumes
// into the same tensor and pipeline layout only); one of the warm-up resets
// them, as DeepSpeed's load does. A resumed process initialises again, then
// continues in the stage its step count says (DeepSpeed's resumed process
// makes one uncompressed step on local gradients first, which leaves the
// ranks' weights apart; dstrain does not).
#pragma once
#include "lib/ops/optim_rules.h"
#include "lib/optim/onebit_family.h"

namespace ds {

class OneBitLamb final : public OneBitFamily {
 public:
  OneBitLamb(const OptimizerSpec& spec, const ModelLayout& layout, Device dev, int64_t begin, int64_t end);

  const char* type() const override { return "OneBitLamb"; }
  std::vector<OptimizerStateSpec> state_specs() const override {
    return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}, {"exp_avg_sq_fresh", DType::F32, true}};
  }
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  void set_step_count(int64_t n) override;
  std::string saved_scalars() const override;
  void load_scalars(const std::string& json) override;

  // The trust ratios of the last step, one per segment of the range (DeepSpeed's get_lamb_coeffs).
  const std::vector<double>& last_coeffs() const { return coeffs_; }

 private:
  void warmup_step(const StepTensors& t, const StepHyper& h, const OptimTerms& terms, const Stream& s);
  void compressed_step(const StepTensors& t, const StepHyper& h, const OptimTerms& terms, const Stream& s);
  // p -= c_k u per segment k (LambApply with step size 1), c_k = lr coeffs_[k] rounded once to f32.
  void apply(const StepTensors& t, const StepHyper& h, const OptimTerms& terms, const Stream& s);
  // The per-segment f32 values `x` (S x width) on the state's device, and back.
  Tensor to_state_device(const std::vector<float>& x, int64_t width) const;
  std::vector<float> to_host(const Tensor& x) const;
  void reset_scalars();
  OptimizerSpec spec_;
  Device dev_;
  bool frozen_ = false;  // the compression stage
  std::vector<double> coeff_freeze_, last_factor_, scaling_, coeffs_;  // per segment
  bool have_scaling_ = false;
  Tensor m_old_;  // the momentum before a compressed step, on the state's device
};

}  // namespace ds
