// AdamW step on one parameter tensor: fp32 master weights and moments, the
// gradient in f32/bf16/f16, optional write-back of the updated weights to a
// bf16/f16 model copy. Decoupled weight decay; bias corrections from the host.
// With sr_seed != 0 a bf16 model copy is stochastically rounded: the low 16
// bits of sr_bits(seed, i) are added to the f32 bit pattern before truncation,
// exactly as lib/cpu/optim.cpp does (same bits on both backends).
#include "cuda/core/common.cuh"
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
  int64_t n;
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  uint64_t sr_seed;    // != 0 and param_lowp bf16: stochastic rounding
};

__global__ void adamw_kernel(AdamWParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g = load(p.grad, i) * p.grad_scale;
    float m = p.beta1 * p.m[i] + (1.0f - p.beta1) * g;
    float v = p.beta2 * p.v[i] + (1.0f - p.beta2) * g * g;
    p.m[i] = m;
    p.v[i] = v;
    // PyTorch's form: decay first, then the bias-corrected Adam step.
    float w = p.param[i];
    w -= p.lr * p.weight_decay * w;
    w -= p.step_size * m / (sqrtf(v) * p.inv_sqrt_bc2 + p.eps);
    p.param[i] = w;
    if (p.sr_seed && p.param_lowp.t == FType::BF16)
      static_cast<bf16*>(p.param_lowp.p)[i] = bf16_stochastic(w, p.sr_seed, uint64_t(i));
    else if (p.param_lowp.p)
      store(p.param_lowp, i, w);
  }
}

}  // namespace

void adamw_step(const AdamWArgs& a, const Stream& s) {
  int64_t n = a.param.numel();
  if (n == 0) return;
  AdamWParams p{a.param.data<float>(), any_ptr(a.grad), a.m.data<float>(), a.v.data<float>(),
                any_ptr(a.param_lowp), n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                a.grad_scale,
                float(a.lr / (1.0 - std::pow(double(a.beta1), double(a.step)))),
                float(1.0 / std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step)))),
                a.sr_seed};
  adamw_kernel<<<grid_for(n, 256), 256, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
