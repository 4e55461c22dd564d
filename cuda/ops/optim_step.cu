// The element-wise optimizer rules (lib/ops/optim_rules.h, shared with the
// CPU kernel) on the GPU: one launch per call, blockIdx.y picks the segment
// (a parameter's part of the range) and the blocks along x stride over it.
// Lamb's first pass adds each segment's {sum p^2, sum u^2} into seg_stats
// (block sums, then float atomics: the order of the additions varies from run
// to run); its second pass reads each segment's trust ratio from seg_stats.
// 1-bit Lamb's OneBitLambFresh reads column 0 of its (S, 4) seg_stats and adds
// the maximum (an integer atomicMax on the non-negative floats' bits) and two
// sums into columns 1-3, zeroed first.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

struct OptimStepParams {
  float* param;        // (n) f32 master
  AnyPtr grad;         // (n) or null (LambApply)
  float* s1;           // (n) f32 or null
  float* s2;           // (n) f32 or null
  float* s3;           // (n) f32 or null (0/1 Adam's accumulator, 1-bit Lamb's fresh variance)
  float* prev;         // (n) f32 or null (1-bit Lamb's momentum before the step)
  AnyPtr param_lowp;   // (n) or null
  const int64_t* seg;  // (S, 3) {begin, end, decay}
  float* stats;        // LambMoments (S, 2) +=; LambApply, OneBitLambMomentum (S); OneBitLambFresh (S, 4); else null
  OptimRule rule;
  OptimTerms t;
};

__device__ __forceinline__ float block_sum(float v, float* shared) {  // shared: (32)
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? shared[lane] : 0.f;
  if (warp == 0) v = warp_sum(v);
  return v;  // valid in thread 0
}

__device__ __forceinline__ float block_max(float v, float* shared) {  // shared: (32); v >= 0
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? shared[lane] : 0.f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;  // valid in thread 0
}

__global__ void optim_step_kernel(OptimStepParams p) {
  namespace R = optim_rule;
  const int64_t s = blockIdx.y;
  const int64_t lo = p.seg[3 * s], hi = p.seg[3 * s + 1];
  const float wd = p.seg[3 * s + 2] ? p.t.weight_decay : 0.f;
  const OptimTerms& t = p.t;
  float sp = 0.f, su = 0.f, mx = 0.f;  // LambMoments: sp = sum p^2; OneBitLambFresh: sp = sum u0^2
  float unused = 0.f;
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    float w = p.param[i];
    const float g = p.grad.p ? load(p.grad, i) : 0.f;
    switch (p.rule) {
      case OptimRule::AdamL2:
      case OptimRule::AdamW: R::adam(t, p.rule == OptimRule::AdamL2, g, p.s1[i], p.s2[i], w, wd); break;
      case OptimRule::Sgd: R::sgd(t, g, p.s1 ? p.s1[i] : unused, w, wd); break;
      case OptimRule::Adagrad: R::adagrad(t, g, p.s1[i], w, wd); break;
      case OptimRule::Lion: R::lion(t, g, p.s1[i], w, wd); break;
      case OptimRule::LambMoments: {
        const float u = R::lamb_moments(t, g, p.s1[i], p.s2[i], w, wd);
        sp += w * w;
        su += u * u;
        break;
      }
      case OptimRule::LambApply: R::lamb_apply(t, p.s1[i], p.s2[i], w, wd, p.stats[s]); break;
      case OptimRule::OneBitMoments: R::onebit_moments(t, g, p.s1[i], &p.s2[i]); break;
      case OptimRule::OneBitMomentum: R::onebit_moments(t, g, p.s1[i], nullptr); break;
      case OptimRule::OneBitApply: R::onebit_apply(t, p.s1[i], p.s2[i], w, wd, p.s3 ? &p.s3[i] : nullptr); break;
      case OptimRule::ZeroOneUnwind: R::zero_one_unwind(t, p.s2[i], w, p.s3[i]); break;
      case OptimRule::ZeroOneSync: R::zero_one_sync(t, p.s1[i], p.s2[i], w, p.s3[i]); break;
      case OptimRule::OneBitLambMomentum: R::onebit_lamb_momentum(t, g, p.s1[i], p.prev[i], p.stats[s]); break;
      case OptimRule::OneBitLambFresh: {
        const R::OneBitLambTerms x =
            R::onebit_lamb_fresh(t, p.s1[i], p.prev[i], p.s2[i], p.s3[i], w, wd, p.stats[4 * s]);
        mx = fmaxf(mx, x.ratio);
        sp += x.u0 * x.u0;
        su += x.u * x.u;
        break;
      }
    }
    p.param[i] = w;
    if (p.param_lowp.p) store(p.param_lowp, i, w);
  }
  if (p.rule != OptimRule::LambMoments && p.rule != OptimRule::OneBitLambFresh) return;
  __shared__ float shared[32];
  sp = block_sum(sp, shared);
  __syncthreads();
  su = block_sum(su, shared);
  if (p.rule == OptimRule::LambMoments) {
    if (threadIdx.x == 0) {
      atomicAdd(&p.stats[2 * s], sp);
      atomicAdd(&p.stats[2 * s + 1], su);
    }
    return;
  }
  __syncthreads();
  mx = block_max(mx, shared);
  if (threadIdx.x == 0) {
    atomicMax(reinterpret_cast<int*>(&p.stats[4 * s + 1]), __float_as_int(mx));
    atomicAdd(&p.stats[4 * s + 2], sp);
    atomicAdd(&p.stats[4 * s + 3], su);
  }
}

}  // namespace

void optim_step(const OptimStepArgs& a, const Stream& s) {
  const int64_t S = a.segments.size(0);
  if (S == 0 || a.param.numel() == 0) return;
  DS_CUDA_REQUIRE(S <= 65535, "optim_step: " + std::to_string(S) + " segments, at most 65535 per call");
  if (a.rule == OptimRule::LambMoments)
    DS_CUDA_CHECK(cudaMemsetAsync(a.seg_stats.raw(), 0, a.seg_stats.nbytes(), stream_of(s)));
  if (a.rule == OptimRule::OneBitLambFresh)  // columns 1-3 of each row
    DS_CUDA_CHECK(cudaMemset2DAsync(a.seg_stats.data<float>() + 1, 4 * sizeof(float), 0, 3 * sizeof(float),
                                    static_cast<size_t>(S), stream_of(s)));
  OptimStepParams p{a.param.data<float>(),
                    any_ptr(a.grad),
                    a.s1.defined() ? a.s1.data<float>() : nullptr,
                    a.s2.defined() ? a.s2.data<float>() : nullptr,
                    a.s3.defined() ? a.s3.data<float>() : nullptr,
                    a.prev.defined() ? a.prev.data<float>() : nullptr,
                    any_ptr(a.param_lowp),
                    a.segments.data<int64_t>(),
                    a.seg_stats.defined() ? a.seg_stats.data<float>() : nullptr,
                    a.rule,
                    a.t};
  // Enough blocks along x for the largest parameter of a typical range; the
  // blocks stride over longer segments.
  const unsigned bx = grid_for(a.param.numel() / S + 1, 256, 1024);
  optim_step_kernel<<<dim3(bx, unsigned(S)), 256, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
