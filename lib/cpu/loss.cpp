// Fused softmax + cross-entropy over the padded vocabulary on the CPU.
// Columns >= V are padding: excluded from the softmax, zero gradient. Rows whose
// target is < 0 are ignored (loss 0, zero gradient). dlogits may alias logits:
// each row is fully read for its statistics before it is overwritten.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {

namespace {

struct CeDims {
  int64_t Vp, N, V;
  float dloss;
};

CeDims ce_dims(const CrossEntropyArgs& a) {
  const CeDims d{a.logits.size(-1), rows_of(a.logits), a.V,
                 a.dloss_scale.defined() ? a.dloss * a.dloss_scale.data<float>()[0] : a.dloss};
  const int32_t* targets = a.targets.data<int32_t>();  // (N)
  for (int64_t n = 0; n < d.N; ++n)
    DS_CHECK(targets[n] < d.V, "cross_entropy: target {} at row {} is >= V={}", targets[n], n, d.V);
  return d;
}

// One row: its loss, and with dx its gradient (dx may be x).
float ce_row(const float* x, float* dx, int32_t tgt, const CeDims& d) {
  if (tgt < 0) {
    if (dx) std::memset(dx, 0, d.Vp * sizeof(float));
    return 0.f;
  }
  const float mx = row_max(x, d.V);
  const double sum = sum_exp(x, d.V, mx);
  const double lse = mx + std::log(sum);
  const float loss = static_cast<float>(lse - x[tgt]);
  if (!dx) return loss;
  const float lse_f = static_cast<float>(lse), dloss = d.dloss;
#pragma omp simd
  for (int64_t j = 0; j < d.V; ++j) {
    const float p = fast_exp(x[j] - lse_f);
    dx[j] = dloss * (p - (j == tgt ? 1.f : 0.f));
  }
  for (int64_t j = d.V; j < d.Vp; ++j) dx[j] = 0.f;
  return loss;
}

}  // namespace

void cross_entropy(const CrossEntropyArgs& a, const Stream&) {
  const CeDims d = ce_dims(a);
  const int32_t* targets = a.targets.data<int32_t>();  // (N)
  const float* logits = a.logits.data<float>();        // (N, Vp)
  float* losses = a.losses.data<float>();              // (N)
  float* dlogits = a.dlogits.defined() ? a.dlogits.data<float>() : nullptr;  // (N, Vp)
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n)
    losses[n] = ce_row(logits + n * d.Vp, dlogits ? dlogits + n * d.Vp : nullptr, targets[n], d);
}

// bf16 logits (and dlogits) as they are: each row upcast into a per-thread f32
// row, the f32 row computation, the gradient rounded back. Bit-identical to
// the emulation, without its whole-tensor f32 copy (N x Vp floats).
bool lowp::cross_entropy(const CrossEntropyArgs& a, const Stream&) {
  if (a.logits.dtype() != DType::BF16 || (a.dlogits.defined() && a.dlogits.dtype() != DType::BF16)) return false;
  const CeDims d = ce_dims(a);
  const int32_t* targets = a.targets.data<int32_t>();  // (N)
  const uint16_t* logits = a.logits.data<uint16_t>();  // (N, Vp)
  float* losses = a.losses.data<float>();              // (N)
  uint16_t* dlogits = a.dlogits.defined() ? a.dlogits.data<uint16_t>() : nullptr;  // (N, Vp)
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) {
    float* row = thread_scratch(static_cast<size_t>(d.Vp), 0);
    const uint16_t* x = logits + n * d.Vp;
#pragma omp simd
    for (int64_t j = 0; j < d.Vp; ++j) row[j] = bf16_to_f32(x[j]);
    losses[n] = ce_row(row, dlogits ? row : nullptr, targets[n], d);
    if (!dlogits) continue;
    uint16_t* dx = dlogits + n * d.Vp;
#pragma omp simd
    for (int64_t j = 0; j < d.Vp; ++j) dx[j] = f32_to_bf16(row[j]);
  }
  return true;
}

// In row order, in double. Also the host loss (GptModel::mean_loss).
void masked_mean(const MaskedMeanArgs& a, const Stream&) {
  const float* losses = a.losses.data<float>();     // (N)
  const int32_t* targets = a.targets.data<int32_t>();  // (N)
  const int64_t n = a.losses.numel();
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    sum += losses[i];
    ++count;
  }
  if (count == 0) return;
  const float mean = static_cast<float>(sum / static_cast<double>(count));
  float* out = a.out.data<float>();
  out[0] = static_cast<float>(static_cast<double>(out[0]) + static_cast<double>(a.weight) * mean);
}

}  // namespace ds::cpu

namespace ds::cpu {

// Knowledge distillation: per row, the log-sum-exps of both scaled rows
// first (every read of `teacher` before dlogits, which may alias it, is
// written), then KL(p_t || p_s) in double and the gradient.
void kd_loss(const KdLossArgs& a, const Stream&) {
  const int64_t Vp = a.logits.size(-1), N = rows_of(a.logits), V = a.V;
  const float* xs = a.logits.data<float>();   // (N, Vp)
  const float* xt = a.teacher.data<float>();  // (N, Vp)
  float* losses = a.losses.data<float>();     // (N)
  float* dlogits = a.dlogits.defined() ? a.dlogits.data<float>() : nullptr;  // (N, Vp)
  const float inv = 1.0f / a.temp;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* s = xs + n * Vp;
    const float* t = xt + n * Vp;
    float ms = -INFINITY, mt = -INFINITY;
    for (int64_t j = 0; j < V; ++j) {
      ms = std::max(ms, s[j] * inv);
      mt = std::max(mt, t[j] * inv);
    }
    double ss = 0, st = 0;
    for (int64_t j = 0; j < V; ++j) {
      ss += std::exp(static_cast<double>(s[j] * inv - ms));
      st += std::exp(static_cast<double>(t[j] * inv - mt));
    }
    const double lse_s = ms + std::log(ss), lse_t = mt + std::log(st);
    double kl = 0;
    float* d = dlogits ? dlogits + n * Vp : nullptr;
    for (int64_t j = 0; j < V; ++j) {
      const double lt = t[j] * inv - lse_t, ls = s[j] * inv - lse_s;
      const double pt = std::exp(lt);
      if (pt > 0) kl += pt * (lt - ls);  // xlogy: a zero probability adds 0
      if (d) d[j] = static_cast<float>(a.dscale * (std::exp(ls) - pt));
    }
    if (d)
      for (int64_t j = V; j < Vp; ++j) d[j] = 0.f;
    losses[n] = static_cast<float>(kl);
  }
}

}  // namespace ds::cpu
