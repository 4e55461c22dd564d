// AdamW over a flat parameter buffer: fp32 master weights and Adam moments
// ("exp_avg", "exp_avg_sq") laid out like the parameters (ModelLayout), no
// weight decay on biases and norm weights. With ZeRO, a rank owns the
// sub-range [begin, end) of the flat buffer and its moments cover only that
// range. DeepSpeed's "Adam" (adam_w_mode true) and "AdamW" in the registry
// (lib/optim/optimizer.h).
#pragma once
#include <cstdint>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/ops/op_args.h"
#include "lib/optim/optimizer.h"

namespace ds {

class AdamW final : public Optimizer {
 public:
  // Owns moments for elements [begin, end) of the layout's flat buffer.
  // StateHome::Elsewhere: no moments here; only step_part, with them handed in.
  AdamW(const ModelLayout& layout, Device dev, int64_t begin, int64_t end, StateHome home = StateHome::Own);

  const char* type() const override { return "AdamW"; }
  std::vector<OptimizerStateSpec> state_specs() const override {
    return {{"exp_avg", DType::F32}, {"exp_avg_sq", DType::F32, true}};
  }
  // One fused op call over the range; t.params_lowp (bf16/f16) receives the
  // updated weights in the same pass.
  void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) override;
  // One op call per parameter cut at the part's bounds: the update is
  // element-wise, so the pieces give the bits of the whole.
  bool step_part(int64_t lo, int64_t hi, const StepTensors& t, const StepHyper& h, float grad_scale) override;
  // Tensors with a learning-rate scale (ParamSpec::lr_scale, LoRA) update one
  // op call each, at lr x scale (0: not at all); no device-gated step then.
  bool has_gated_step() const override { return !scaled_; }
  void step_gated(const StepTensors& t, const StepHyper& h, const Tensor& scalars,
                  const Stream& s = Stream{}) override;
  AdamWTerms next_terms(const StepHyper& h) const override {
    return adamw_terms(h.lr, h.weight_decay, h.beta1, h.beta2, step_ + 1);
  }

  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  AdamWArgs args(const StepTensors& t, const StepHyper& h) const;
  Tensor m_, v_;     // the named states "exp_avg" and "exp_avg_sq"
  Tensor segments_;  // (S, 3) i64 {begin, end, decay} of the owned range, on the moments' device
  bool scaled_ = false;  // some tensor's lr_scale is not 1
  // The per-parameter update of [lo, hi) of the range (t: that part's tensors).
  void step_params(int64_t lo, int64_t hi, const StepTensors& t, const Tensor& m, const Tensor& v,
                   const StepHyper& h, float grad_scale);
};

// Global L2 norm of a gradient buffer (sum of squares on the device, one sync).
double grad_sum_squares(const Tensor& grads, const Stream& s = Stream{});
// clip_coefficient and the step's gate: lib/ops/step_scalars.h.

}  // namespace ds
