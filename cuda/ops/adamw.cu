// AdamW step over a parameter range: fp32 master weights and moments, the
// gradient in f32/bf16/f16, optional write-back of the updated weights to a
// bf16/f16 model copy. Decoupled weight decay; bias corrections from the host
// (adamw_terms). The per-step values come as kernel arguments or from a
// step-scalars block in device memory, read when the kernel runs (a CUDA
// graph replays the launch); both go through the same arithmetic. The gate
// that fills the block's grad scale and skip flag from the step's statistics
// (step_gate) is the one-thread kernel at the end.
// One launch covers a whole flat buffer: AdamWArgs.segments lists the
// parameter ranges and which of them decay (looked up per vector by binary
// search, then a cursor), so the optimizer step is one kernel, not one per
// tensor.
// With sr_seed != 0 a bf16 model copy is stochastically rounded: the low 16
// bits of sr_bits(seed, i) are added to the f32 bit pattern before truncation,
// exactly as lib/cpu/optim.cpp does (same bits on both backends).
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

// splitmix64 finalizer of (seed, index); the same function is in
// lib/cpu/optim.cpp (keep both identical: the GPU test compares the bits).
__device__ __forceinline__ uint32_t sr_bits(uint64_t seed, uint64_t i) {
  uint64_t x = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint32_t(x >> 48);  // 16 random bits
}

// f32 -> bf16, rounding up with probability (dropped bits) / 2^16. NaN keeps
// the round-to-nearest path; inf has zero low bits, so it stays inf.
__device__ __forceinline__ bf16 bf16_stochastic(float w, uint64_t seed, uint64_t i) {
  if (isnan(w)) return __float2bfloat16_rn(w);
  uint32_t u = __float_as_uint(w) + sr_bits(seed, i);
  return __ushort_as_bfloat16(static_cast<unsigned short>(u >> 16));
}

struct AdamWParams {
  float* param;        // (n) f32 master
  AnyPtr grad;         // (n)
  float* m;            // (n) f32
  float* v;            // (n) f32
  AnyPtr param_lowp;   // (n) or null
  const int64_t* seg;  // (S, 3) {begin, end, decay} or null (all of [0, n), decay)
  int64_t S;
  VecPlan pl;          // over [0, n)
  float beta1, beta2, eps;
  AdamWTerms t;        // lr, weight decay, lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step)
  float grad_scale;
  const float* scalars;  // (AdamWSlot::Count) or null: the per-step values instead of t and grad_scale
  uint64_t sr_seed;    // != 0 and param_lowp bf16: stochastic rounding
};

// The per-step values every element of one launch uses.
struct StepValues {
  float lr, weight_decay, grad_scale, step_size, inv_sqrt_bc2;
};
__device__ __forceinline__ StepValues step_values(const AdamWParams& p) {
  if (!p.scalars) return {p.t.lr, p.t.weight_decay, p.grad_scale, p.t.step_size, p.t.inv_sqrt_bc2};
  const float* s = p.scalars;
  return {s[AdamWSlot::Lr], s[AdamWSlot::WeightDecay], s[AdamWSlot::GradScale], s[AdamWSlot::StepSize],
          s[AdamWSlot::InvSqrtBc2]};
}

constexpr int kV = 4;  // elements per vector: 16 bytes of the f32 state

// Updates m, v and returns the new weight (PyTorch's form: decay first, then
// the bias-corrected Adam step). `wd` is the step's weight decay or 0.
__device__ __forceinline__ float adam_update(const AdamWParams& p, const StepValues& sv, float g, float& m,
                                             float& v, float w, float wd) {
  g *= sv.grad_scale;
  m = p.beta1 * m + (1.0f - p.beta1) * g;
  v = p.beta2 * v + (1.0f - p.beta2) * g * g;
  w -= sv.lr * wd * w;
  w -= sv.step_size * m / (sqrtf(v) * sv.inv_sqrt_bc2 + p.eps);
  return w;
}

__device__ __forceinline__ void store_lowp(const AdamWParams& p, int64_t i, float w) {
  if (p.sr_seed && p.param_lowp.t == FType::BF16)
    static_cast<bf16*>(p.param_lowp.p)[i] = bf16_stochastic(w, p.sr_seed, uint64_t(i));
  else if (p.param_lowp.p)
    store(p.param_lowp, i, w);
}

// Weight decay of element i (the step's or 0), or -1 when i is in no segment.
// `s` is a segment cursor: the first segment whose end is > the last index
// asked; indices must be asked in increasing order.
__device__ __forceinline__ float decay_of(const AdamWParams& p, float weight_decay, int64_t i, int64_t& s) {
  if (!p.seg) return weight_decay;
  while (s < p.S && p.seg[3 * s + 1] <= i) ++s;
  if (s == p.S || p.seg[3 * s] > i) return -1.f;
  return p.seg[3 * s + 2] ? weight_decay : 0.f;
}
// First segment whose end is > i (binary search over the sorted ends).
__device__ __forceinline__ int64_t first_segment(const AdamWParams& p, int64_t i) {
  if (!p.seg) return 0;
  int64_t lo = 0, hi = p.S;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (p.seg[3 * mid + 1] <= i) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ void adamw_scalar(const AdamWParams& p, const StepValues& sv, int64_t i, float wd) {
  float m = p.m[i], v = p.v[i];
  const float w = adam_update(p, sv, load(p.grad, i), m, v, p.param[i], wd);
  p.m[i] = m;
  p.v[i] = v;
  p.param[i] = w;
  store_lowp(p, i, w);
}

// One launch over the whole range: 16-byte vectors of the f32 state (the
// gradient and the low-precision copy in their own widths); a vector that
// leaves a segment, and the plan's head and tail, go element by element.
// With a scalars block whose skip flag is set, no thread writes anything.
__global__ void adamw_kernel(AdamWParams p) {
  if (p.scalars && p.scalars[AdamWSlot::Skip] != 0.f) return;
  const StepValues sv = step_values(p);
  vec_loop<kV>(
      p.pl,
      [&](int64_t i) {
        int64_t s = first_segment(p, i);
        float wd[kV];
        bool whole = true;
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          wd[k] = decay_of(p, sv.weight_decay, i + k, s);
          whole = whole && wd[k] >= 0.f;
        }
        if (!whole) {
#pragma unroll
          for (int k = 0; k < kV; ++k)
            if (wd[k] >= 0.f) adamw_scalar(p, sv, i + k, wd[k]);
          return;
        }
        float g[kV], m[kV], v[kV], w[kV];
        load_any<kV>(p.grad, i, g);
        load_f<kV>(p.m, i, m);
        load_f<kV>(p.v, i, v);
        load_f<kV>(p.param, i, w);
#pragma unroll
        for (int k = 0; k < kV; ++k) w[k] = adam_update(p, sv, g[k], m[k], v[k], w[k], wd[k]);
        store_f<kV>(p.m, i, m);
        store_f<kV>(p.v, i, v);
        store_f<kV>(p.param, i, w);
        if (p.sr_seed && p.param_lowp.t == FType::BF16) {
          Packed<bf16, kV> o;
#pragma unroll
          for (int k = 0; k < kV; ++k) o.v[k] = bf16_stochastic(w[k], p.sr_seed, uint64_t(i + k));
          store_vec<kV>(static_cast<bf16*>(p.param_lowp.p), i, o);
        } else if (p.param_lowp.p) {
          store_any<kV>(p.param_lowp, i, w);
        }
      },
      [&](int64_t i) {
        int64_t s = first_segment(p, i);
        const float wd = decay_of(p, sv.weight_decay, i, s);
        if (wd >= 0.f) adamw_scalar(p, sv, i, wd);
      });
}

// gate_step on the statistics, one thread (the same rule and arithmetic as
// the host's, lib/ops/step_scalars.h).
__global__ void step_gate_kernel(float* scalars, const float* stats, double loss_scale, bool scale_in_block,
                                 float max_norm, SkipRule rule) {
  if (scale_in_block) loss_scale = static_cast<double>(scalars[AdamWSlot::LossScale]);
  const StepGate g = gate_step(stats[0], stats[1], stats[2], loss_scale, max_norm, rule);
  scalars[AdamWSlot::GradScale] = g.grad_scale;
  scalars[AdamWSlot::Skip] = g.skip ? 1.f : 0.f;
}

}  // namespace

void adamw_step(const AdamWArgs& a, const Stream& s) {
  int64_t n = a.param.numel();
  if (n == 0) return;
  const AnyPtr grad = any_ptr(a.grad), lowp = any_ptr(a.param_lowp);
  VecPlan pl = plan_vec(n, kV, {{a.param.raw(), 4}, {a.m.raw(), 4}, {a.v.raw(), 4},
                                {grad.p, elem_bytes(grad)}, {lowp.p, elem_bytes(lowp)}});
  const bool seg = a.segments.defined(), block = a.scalars.defined();
  AdamWParams p{a.param.data<float>(), grad, a.m.data<float>(), a.v.data<float>(), lowp,
                seg ? a.segments.data<int64_t>() : nullptr, seg ? a.segments.size(0) : 0, pl,
                a.beta1, a.beta2, a.eps,
                block ? AdamWTerms{} : adamw_terms(a.lr, a.weight_decay, a.beta1, a.beta2, a.step),
                a.grad_scale, block ? a.scalars.data<float>() : nullptr, a.sr_seed};
  adamw_kernel<<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

void step_gate(const StepGateArgs& a, const Stream& s) {
  step_gate_kernel<<<1, 1, 0, stream_of(s)>>>(a.scalars.data<float>(), a.stats.data<float>(), a.loss_scale,
                                               a.scale_in_block, a.max_norm, a.rule);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
