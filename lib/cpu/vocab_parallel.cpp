// Vocab-parallel softmax cross-entropy on the CPU, one phase per call (see
// VocabParallelCEArgs): local row max, local sum of exp + owned target logit,
// then loss and gradient from the all-reduced statistics. Rows are independent
// and each is computed by one thread in column order (deterministic).
#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

struct VocabCEView {
  const float* logits;     // (N, Vl)
  const int32_t* targets;  // (N)
  int64_t N, Vl, real;     // real: local columns below the global V
};

// The view of a validated call (lib/ops/op_validate.cpp).
VocabCEView vocab_ce_view(const VocabParallelCEArgs& a) {
  VocabCEView v{a.logits.data<float>(), a.targets.data<int32_t>(), rows_of(a.logits), a.logits.size(-1), 0};
  v.real = std::clamp<int64_t>(a.V - a.vocab_start, 0, v.Vl);
  return v;
}

void vocab_ce_finish(const VocabParallelCEArgs& a, const VocabCEView& v) {
  const bool with_grad = a.dlogits.defined();
  const float* mx = a.rowmax.data<float>();  // (N)
  const float* st = a.stats.data<float>();   // (2, N)
  float* losses = a.losses.data<float>();    // (N)
  float* dl = with_grad ? a.dlogits.data<float>() : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < v.N; ++n) {
    const int32_t tgt = v.targets[n];
    const double lse = static_cast<double>(mx[n]) + std::log(static_cast<double>(st[n]));
    losses[n] = tgt < 0 ? 0.f : static_cast<float>(lse - st[v.N + n]);
    if (!dl) continue;
    const float* x = v.logits + n * v.Vl;
    float* dx = dl + n * v.Vl;
    const int64_t local_tgt = static_cast<int64_t>(tgt) - a.vocab_start;
    for (int64_t j = 0; j < v.Vl; ++j) {
      float g = 0.f;
      if (tgt >= 0 && j < v.real) {
        const float p = static_cast<float>(std::exp(static_cast<double>(x[j]) - lse));
        g = a.dloss * (p - (j == local_tgt ? 1.f : 0.f));
      }
      dx[j] = g;
    }
  }
}

}  // namespace

void vocab_parallel_cross_entropy(const VocabParallelCEArgs& a, const Stream&) {
  const char* op = "vocab_parallel_cross_entropy";
  const VocabCEView v = vocab_ce_view(a);
  for (int64_t n = 0; n < v.N; ++n)
    DS_CHECK(v.targets[n] < a.V, "{}: target {} at row {} is >= V={}", op, v.targets[n], n, a.V);
  float* mx = a.rowmax.data<float>();  // (N)
  if (a.phase == VocabCEPhase::Max) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < v.N; ++n) {
      const float* x = v.logits + n * v.Vl;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < v.real; ++j) m = std::max(m, x[j]);
      mx[n] = m;
    }
    return;
  }
  if (a.phase == VocabCEPhase::Stats) {
    float* st = a.stats.data<float>();  // (2, N): sum of exp, target logit
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < v.N; ++n) {
      const float* x = v.logits + n * v.Vl;
      double s = 0;
      for (int64_t j = 0; j < v.real; ++j) s += std::exp(static_cast<double>(x[j]) - mx[n]);
      st[n] = static_cast<float>(s);
      const int64_t t = static_cast<int64_t>(v.targets[n]) - a.vocab_start;
      st[v.N + n] = v.targets[n] >= 0 && t >= 0 && t < v.real ? x[t] : 0.f;
    }
    return;
  }
  vocab_ce_finish(a, v);
}

}  // namespace ds::cpu
