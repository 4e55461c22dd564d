// AdamW over a flat parameter buffer: fp32 master weights and Adam moments
// laid out like the parameters (ModelLayout), no weight decay on biases and
// norm weights. With ZeRO, a rank owns the sub-range [begin, end) of the flat
// buffer and its moments cover only that range.
#pragma once
#include <cstdint>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/ops/op_args.h"
#include "lib/ops/step_scalars.h"

namespace ds {

struct AdamWHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
};

class AdamW {
 public:
  // Owns moments for elements [begin, end) of the layout's flat buffer.
  AdamW(const ModelLayout& layout, Device dev, int64_t begin, int64_t end);

  // params/grads: tensors covering [begin, end) of the flat buffer.
  // grad_scale multiplies every gradient first (clipping / unscaling).
  // params_lowp (same range, bf16/f16, or undefined) receives the updated
  // weights in the same pass (the fused op's low-precision copy).
  void step(const Tensor& params, const Tensor& grads, const AdamWHyper& h, float grad_scale,
            const Stream& s = Stream{}, const Tensor& params_lowp = Tensor());
  // The same update with its per-step values in `scalars` ((AdamWSlot::Count)
  // f32 on the moments' device, lib/ops/step_scalars.h), read when the kernel
  // runs: nothing when its skip flag is set. h gives the betas and eps only.
  // The step count does not move: the host learns whether the step was
  // applied from its read after the step, then calls count_step().
  void step_gated(const Tensor& params, const Tensor& grads, const AdamWHyper& h, const Tensor& scalars,
                  const Stream& s = Stream{}, const Tensor& params_lowp = Tensor());
  // The values the host writes into the block for the next step (step_count() + 1).
  AdamWTerms next_terms(const AdamWHyper& h) const {
    return adamw_terms(h.lr, h.weight_decay, h.beta1, h.beta2, step_ + 1);
  }
  void count_step() { ++step_; }

  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  int64_t step_count() const { return step_; }  // applied steps
  void set_step_count(int64_t s) { step_ = s; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  AdamWArgs args(const Tensor& params, const Tensor& grads, const AdamWHyper& h, const Tensor& params_lowp) const;
  const ModelLayout* layout_;
  int64_t begin_, end_;
  int64_t step_ = 0;
  Tensor m_, v_;
  Tensor segments_;  // (S, 3) i64 {begin, end, decay} of the owned range, on the moments' device
};

// Global L2 norm of a gradient buffer (sum of squares on the device, one sync).
double grad_sum_squares(const Tensor& grads, const Stream& s = Stream{});
// clip_coefficient and the step's gate: lib/ops/step_scalars.h.

}  // namespace ds
