// The element-wise update rules of the optimizers besides the fused AdamW op
// (lib/optim: Adam with L2 decay, AdamW without bias correction, SGD, Adagrad,
// Lion, and Lamb's two passes), once for the host and the device: the CPU
// kernel (lib/cpu/optim_step.cpp) and the CUDA kernel (cuda/ops/optim_step.cu)
// call these functions, so both apply the same arithmetic. Formulas follow
// DeepSpeed's kernels and torch.optim (docs/config.md, "Optimizer"):
//   AdamL2     g += wd p; m, v as Adam; p -= step_size m / (sqrt(v) inv_sqrt_bc2 + eps)   (torch.optim.Adam)
//   AdamW      p -= lr wd p; then the same Adam step                                  (FusedAdam, adam_w_mode)
//   Sgd        g += wd p; buf = first ? g : mu buf + (1 - dampening) g;
//              g = nesterov ? g + mu buf : buf; p -= lr g                              (torch.optim.SGD)
//   Adagrad    g += wd p; sum += g^2; p -= lr g / (sqrt(sum) + eps)   (lr decayed)    (torch.optim.Adagrad)
//   Lion       c = b1 m + (1 - b1) g; p = p (1 - lr wd) + (c > 0 ? -lr : lr);
//              m = b2 m + (1 - b2) g                                                  (FusedLion)
//   LambMoments m, v as Adam; u = m / (sqrt(v) + eps) + wd p; returns u (for ||u||)   (FusedLamb, pass 1)
//   LambApply   u again from m, v, p; p -= step_size coeff u                         (FusedLamb, pass 2)
//   OneBitMoments  m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p unchanged   (1-bit Adam's warm-up)
//   OneBitMomentum m = b1 m + (1 - b1) g; v, p unchanged                         (its compressed phase)
//   OneBitApply    u = m / (sqrt(v) + eps) (+ wd p); p += -lr u (no bias correction; no gradient);
//                  with an accumulator a (0/1 Adam's local steps) a += -lr u too
//   ZeroOneUnwind  p -= a; a *= sqrt(v) + eps                 (0/1 Adam's synchronisation, before the exchange)
//   ZeroOneSync    m = -(a / L) when L = step_size != 0; p += a / (sqrt(v) + eps); a = 0   (after it)
//   OneBitLambMomentum  prev = m; m = (b1 m + (1 - b1) g) c      (1-bit Lamb's compressed phase, before the
//                       exchange; c the segment's momentum scale)
//   OneBitLambFresh     m /= c; h = (m - b1 prev) / (1 - b1); w = b2 w + (1 - b2) h^2 (the fresh variance);
//                       u0 = m / (sqrt(v) + eps); u = u0 (+ wd p); returns max (sqrt(v) + eps) / (sqrt(w) + eps),
//                       sum u0^2, sum u^2 per segment (after the exchange; p unchanged)
// g is the gradient times grad_scale (clip coefficient / loss scale) in every rule.
#pragma once
#include <cmath>
#include <cstdint>

#include "lib/ops/host_device.h"

namespace ds {

enum class OptimRule : uint8_t {
  AdamL2,
  AdamW,
  Sgd,
  Adagrad,
  Lion,
  LambMoments,
  LambApply,
  OneBitMoments,
  OneBitMomentum,
  OneBitApply,
  ZeroOneUnwind,
  ZeroOneSync,
  OneBitLambMomentum,
  OneBitLambFresh
};

// The per-call values of a rule (the host derives them once per step).
struct OptimTerms {
  float lr = 0;            // the step's learning rate (Adagrad: already decayed)
  float weight_decay = 0;  // of the parameters that decay (segments say which)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float grad_scale = 1;    // every gradient is multiplied by it first
  float step_size = 0;     // Adam: lr / (1 - beta1^t); Lamb: lr sqrt(1 - beta2^t) / (1 - beta1^t); lr without
                           // bias correction
  float inv_sqrt_bc2 = 1;  // Adam: 1 / sqrt(1 - beta2^t); 1 without bias correction
  float momentum = 0, dampening = 0;  // SGD
  bool nesterov = false;              // SGD
  bool first = false;                 // SGD: the first step (the buffer starts as the gradient)
  bool eps_inside_sqrt = false;       // Lamb: sqrt(v + eps)
};

// The terms every rule shares, from the step's values (the StepHyper fields
// passed one by one, so that this header stays free of lib/optim).
inline OptimTerms base_optim_terms(float lr, float weight_decay, float beta1, float beta2, float eps,
                                   float grad_scale) {
  OptimTerms t;
  t.lr = lr;
  t.weight_decay = weight_decay;
  t.beta1 = beta1;
  t.beta2 = beta2;
  t.eps = eps;
  t.grad_scale = grad_scale;
  return t;
}

namespace optim_rule {

DS_HOST_DEVICE float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

DS_HOST_DEVICE void adam(const OptimTerms& t, bool l2, float g, float& m, float& v, float& p, float wd) {
  g *= t.grad_scale;
  if (l2) g += wd * p;
  else p -= t.lr * wd * p;
  m = t.beta1 * m + (1.f - t.beta1) * g;
  v = t.beta2 * v + (1.f - t.beta2) * g * g;
  p -= t.step_size * m / (sqrt_f(v) * t.inv_sqrt_bc2 + t.eps);
}

// buf is unused (and may alias anything) when t.momentum is 0.
DS_HOST_DEVICE void sgd(const OptimTerms& t, float g, float& buf, float& p, float wd) {
  g = g * t.grad_scale + wd * p;
  if (t.momentum != 0.f) {
    buf = t.first ? g : t.momentum * buf + (1.f - t.dampening) * g;
    g = t.nesterov ? g + t.momentum * buf : buf;
  }
  p -= t.lr * g;
}

DS_HOST_DEVICE void adagrad(const OptimTerms& t, float g, float& sum, float& p, float wd) {
  g = g * t.grad_scale + wd * p;
  sum += g * g;
  p -= t.lr * g / (sqrt_f(sum) + t.eps);
}

DS_HOST_DEVICE float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The step's sign is chosen first and the decayed weight and the step are
// fused explicitly, so every code path (vector body, scalar remainder) rounds
// alike.
DS_HOST_DEVICE void lion(const OptimTerms& t, float g, float& m, float& p, float wd) {
  g *= t.grad_scale;
  const float c = t.beta1 * m + (1.f - t.beta1) * g;
  const float step = c > 0.f ? -t.lr : t.lr;
  p = fma_f(p, 1.f - t.lr * wd, step);
  m = t.beta2 * m + (1.f - t.beta2) * g;
}

DS_HOST_DEVICE float lamb_update(const OptimTerms& t, float m, float v, float p, float wd) {
  const float denom = t.eps_inside_sqrt ? sqrt_f(v + t.eps) : sqrt_f(v) + t.eps;
  return m / denom + wd * p;
}

DS_HOST_DEVICE float lamb_moments(const OptimTerms& t, float g, float& m, float& v, float p, float wd) {
  g *= t.grad_scale;
  m = t.beta1 * m + (1.f - t.beta1) * g;
  v = t.beta2 * v + (1.f - t.beta2) * g * g;
  return lamb_update(t, m, v, p, wd);
}

DS_HOST_DEVICE void lamb_apply(const OptimTerms& t, float m, float v, float& p, float wd, float coeff) {
  p -= t.step_size * coeff * lamb_update(t, m, v, p, wd);
}

// 1-bit Adam (DeepSpeed's runtime/fp16/onebit/adam.py): the moments (v only
// before freeze_step), then the update without bias correction.
DS_HOST_DEVICE void onebit_moments(const OptimTerms& t, float g, float& m, float* v) {
  g *= t.grad_scale;
  m = m * t.beta1 + (1.f - t.beta1) * g;
  if (v) *v = *v * t.beta2 + (1.f - t.beta2) * g * g;
}

DS_HOST_DEVICE void onebit_apply(const OptimTerms& t, float m, float v, float& p, float wd, float* acc) {
  float u = m / (sqrt_f(v) + t.eps);
  if (wd > 0.f) u += wd * p;
  p += -t.lr * u;
  if (acc) *acc += -t.lr * u;
}

// 0/1 Adam (DeepSpeed's runtime/fp16/onebit/zoadam.py) at a synchronisation
// of its local steps: the accumulated updates a are undone and scaled by the
// preconditioner for the exchange, then the exchanged mean sets the momentum
// (over the learning rates' sum L, kept when L is 0) and is applied.
DS_HOST_DEVICE void zero_one_unwind(const OptimTerms& t, float v, float& p, float& a) {
  p -= a;
  a *= sqrt_f(v) + t.eps;
}

DS_HOST_DEVICE void zero_one_sync(const OptimTerms& t, float& m, float v, float& p, float& a) {
  if (t.step_size != 0.f) m = -(a / t.step_size);
  p += a / (sqrt_f(v) + t.eps);
  a = 0.f;
}

// 1-bit Lamb (DeepSpeed's runtime/fp16/onebit/lamb.py) after freeze_step:
// the momentum with the rank's own gradient, kept as it was (prev) and
// scaled by the segment's scale c for the exchange of the whole range.
DS_HOST_DEVICE void onebit_lamb_momentum(const OptimTerms& t, float g, float& m, float& prev, float c) {
  prev = m;
  g *= t.grad_scale;
  m = (m * t.beta1 + (1.f - t.beta1) * g) * c;
}

// After the exchange: the momentum unscaled, the gradient it implies updates
// the fresh variance w (v stays frozen), and the values the segment's factor
// is taken from: the ratio of the frozen to the fresh denominator, u0 and u.
struct OneBitLambTerms {
  float ratio, u0, u;
};
DS_HOST_DEVICE OneBitLambTerms onebit_lamb_fresh(const OptimTerms& t, float& m, float prev, float v, float& w,
                                                 float p, float wd, float c) {
  m /= c;
  const float h = (m - prev * t.beta1) / (1.f - t.beta1);
  w = w * t.beta2 + (1.f - t.beta2) * h * h;
  const float denom = sqrt_f(v) + t.eps;
  const float u0 = m / denom;
  return {denom / (sqrt_f(w) + t.eps), u0, wd > 0.f ? u0 + wd * p : u0};
}

// Lamb's trust ratio of one tensor from its squared norms (FusedLamb): 1 when
// either norm is 0, else ||p|| / ||u|| clamped to [min_coeff, max_coeff].
DS_HOST_DEVICE float lamb_coeff(double p_sumsq, double u_sumsq, float min_coeff, float max_coeff) {
  const float w = sqrt_f(static_cast<float>(p_sumsq)), u = sqrt_f(static_cast<float>(u_sumsq));
  if (w == 0.f || u == 0.f) return 1.f;
  float c = w / u;
  if (c > max_coeff) c = max_coeff;
  if (c < min_coeff) c = min_coeff;
  return c;
}

}  // namespace optim_rule
}  // namespace ds
