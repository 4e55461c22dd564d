// The element-wise optimizer rules (lib/ops/optim_rules.h) on the CPU: one
// OpenMP pass per segment over kChunk-sized pieces, the loop body being the
// shared rule, vectorised by the compiler. Lamb's and 1-bit Lamb's
// per-segment sums of squares are reduced in double per chunk and combined in
// chunk order (maxima per chunk too), so they are bit-identical for any
// thread count.
#include <algorithm>
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

void store_lowp(const Tensor& lowp, const float* p, int64_t base, int64_t b, int64_t e) {
  if (!lowp.defined()) return;
  uint16_t* d = lowp.data<uint16_t>() + base;
  if (lowp.dtype() == DType::BF16)
    for (int64_t i = b; i < e; ++i) d[i] = f32_to_bf16(p[i]);
  else
    for (int64_t i = b; i < e; ++i) d[i] = f32_to_f16(p[i]);
}

// Elements [base, base + n) with weight decay wd; stats: the segment's row of
// seg_stats (LambMoments: its two sums; LambApply, OneBitLambMomentum: its
// coefficient; OneBitLambFresh: its scale, then the maximum and two sums).
void run_segment(const OptimStepArgs& a, int64_t base, int64_t n, float wd, float* stats) {
  namespace R = optim_rule;
  const OptimTerms t = a.t;
  float* p = a.param.data<float>() + base;                                  // (n)
  const float* g = a.grad.defined() ? a.grad.data<float>() + base : nullptr;  // (n)
  float* s1 = a.s1.defined() ? a.s1.data<float>() + base : nullptr;        // (n)
  float* s2 = a.s2.defined() ? a.s2.data<float>() + base : nullptr;        // (n)
  float* s3 = a.s3.defined() ? a.s3.data<float>() + base : nullptr;        // (n)
  float* prev = a.prev.defined() ? a.prev.data<float>() + base : nullptr;  // (n)
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  const int width = a.rule == OptimRule::LambMoments ? 2 : a.rule == OptimRule::OneBitLambFresh ? 3 : 0;
  double* part = width ? thread_scratch_f64(static_cast<size_t>(width * nchunks)) : nullptr;
  const float coeff = stats && a.rule != OptimRule::LambMoments ? stats[0] : 1.f;
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    switch (a.rule) {
      case OptimRule::AdamL2:
      case OptimRule::AdamW: {
        const bool l2 = a.rule == OptimRule::AdamL2;
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::adam(t, l2, g[i], s1[i], s2[i], p[i], wd);
        break;
      }
      case OptimRule::Sgd:
        if (s1) {
#pragma omp simd
          for (int64_t i = b; i < e; ++i) R::sgd(t, g[i], s1[i], p[i], wd);
        } else {
          float unused = 0;
          for (int64_t i = b; i < e; ++i) R::sgd(t, g[i], unused, p[i], wd);
        }
        break;
      case OptimRule::Adagrad:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::adagrad(t, g[i], s1[i], p[i], wd);
        break;
      case OptimRule::Lion:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::lion(t, g[i], s1[i], p[i], wd);
        break;
      case OptimRule::LambMoments: {
        double sp = 0, su = 0;
#pragma omp simd reduction(+ : sp, su)
        for (int64_t i = b; i < e; ++i) {
          const float u = R::lamb_moments(t, g[i], s1[i], s2[i], p[i], wd);
          sp += static_cast<double>(p[i]) * p[i];
          su += static_cast<double>(u) * u;
        }
        part[2 * (b / kChunk)] = sp;
        part[2 * (b / kChunk) + 1] = su;
        break;
      }
      case OptimRule::LambApply:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::lamb_apply(t, s1[i], s2[i], p[i], wd, coeff);
        break;
      case OptimRule::OneBitMoments:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::onebit_moments(t, g[i], s1[i], &s2[i]);
        break;
      case OptimRule::OneBitMomentum:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::onebit_moments(t, g[i], s1[i], nullptr);
        break;
      case OptimRule::OneBitApply:
        if (s3) {
#pragma omp simd
          for (int64_t i = b; i < e; ++i) R::onebit_apply(t, s1[i], s2[i], p[i], wd, &s3[i]);
        } else {
#pragma omp simd
          for (int64_t i = b; i < e; ++i) R::onebit_apply(t, s1[i], s2[i], p[i], wd, nullptr);
        }
        break;
      case OptimRule::ZeroOneUnwind:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::zero_one_unwind(t, s2[i], p[i], s3[i]);
        break;
      case OptimRule::ZeroOneSync:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::zero_one_sync(t, s1[i], s2[i], p[i], s3[i]);
        break;
      case OptimRule::OneBitLambMomentum:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) R::onebit_lamb_momentum(t, g[i], s1[i], prev[i], coeff);
        break;
      case OptimRule::OneBitLambFresh: {
        float mx = 0.f;
        double s0 = 0, su = 0;
        for (int64_t i = b; i < e; ++i) {
          const R::OneBitLambTerms x = R::onebit_lamb_fresh(t, s1[i], prev[i], s2[i], s3[i], p[i], wd, coeff);
          mx = std::max(mx, x.ratio);
          s0 += static_cast<double>(x.u0) * x.u0;
          su += static_cast<double>(x.u) * x.u;
        }
        part[3 * (b / kChunk)] = mx;
        part[3 * (b / kChunk) + 1] = s0;
        part[3 * (b / kChunk) + 2] = su;
        break;
      }
    }
    store_lowp(a.param_lowp, p, base, b, e);
  });
  if (a.rule == OptimRule::LambMoments) {
    double sp = 0, su = 0;
    for (int64_t c = 0; c < nchunks; ++c) sp += part[2 * c], su += part[2 * c + 1];
    stats[0] = static_cast<float>(sp);
    stats[1] = static_cast<float>(su);
  } else if (a.rule == OptimRule::OneBitLambFresh) {
    double mx = 0, s0 = 0, su = 0;
    for (int64_t c = 0; c < nchunks; ++c) mx = std::max(mx, part[3 * c]), s0 += part[3 * c + 1], su += part[3 * c + 2];
    stats[1] = static_cast<float>(mx);
    stats[2] = static_cast<float>(s0);
    stats[3] = static_cast<float>(su);
  }
}

}  // namespace

void optim_step(const OptimStepArgs& a, const Stream&) {
  const int64_t* seg = a.segments.data<int64_t>();  // (S, 3) {begin, end, decay}
  float* stats = a.seg_stats.defined() ? a.seg_stats.data<float>() : nullptr;
  const int stride = a.rule == OptimRule::LambMoments ? 2 : a.rule == OptimRule::OneBitLambFresh ? 4 : 1;
  for (int64_t s = 0; s < a.segments.size(0); ++s)
    run_segment(a, seg[3 * s], seg[3 * s + 1] - seg[3 * s], seg[3 * s + 2] ? a.t.weight_decay : 0.f,
                stats ? stats + stride * s : nullptr);
}

}  // namespace ds::cpu
