// Mixture-of-Experts ops on the CPU: the gate (DeepSpeed's top1gating,
// top2gating and topkgating in the compact (expert, slot, weight) form of
// lib/ops/op_args.h) with its backward, and the dispatch/combine copies
// between token rows and expert buffers. The reference of the CUDA kernels.
// Deterministic: tokens are processed in parallel where each writes only its
// own rows, experts in parallel where each scans the tokens in order, and
// every sum runs in a fixed order in double.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "lib/cpu/cpu_util.h"
#include "lib/ops/moe_noise.h"
#include "lib/cpu/cpu_ops.h"

namespace ds::cpu {
namespace {

struct GateDims {
  int64_t N, E, K;
};

// Row n of gates = softmax(logits[n]) and its choices expert[n, :].
void gate_token(const MoeGateArgs& a, const GateDims& d, int64_t n, uint64_t gumbel_key) {
  const float* l = a.logits.data<float>() + n * d.E;
  float* g = a.gates.data<float>() + n * d.E;
  int32_t* ex = a.expert.data<int32_t>() + n * d.K;
  float mx = l[0];
  for (int64_t e = 1; e < d.E; ++e) mx = std::max(mx, l[e]);
  double sum = 0;
  for (int64_t e = 0; e < d.E; ++e) sum += std::exp(double(l[e]) - double(mx));
  for (int64_t e = 0; e < d.E; ++e) g[e] = float(std::exp(double(l[e]) - double(mx)) / sum);
  // The first maximum of a score; the noise (if any) is added in double.
  auto argmax = [&](bool noise, int64_t skip) {
    int64_t best = -1;
    double bv = 0;
    for (int64_t e = 0; e < d.E; ++e) {
      if (e == skip) continue;
      const double v =
          noise ? double(l[e]) + moe_gumbel(moe_noise_bits(gumbel_key, moe_token_order(n, d.N, a.seq), e)) : double(l[e]);
      if (best < 0 || v > bv) best = e, bv = v;
    }
    return static_cast<int32_t>(best);
  };
  if (d.K == 1) {
    // Softmax is monotone: the argmax of the logits is the argmax of the gates
    // (DeepSpeed's), without depending on how a backend rounds exp.
    ex[0] = argmax(a.rsample, -1);
  } else if (d.K == 2) {
    ex[0] = argmax(false, -1);
    ex[1] = argmax(a.second_sampling, ex[0]);
  } else {
    // The top K logits, larger first, ties to the lower expert.
    int64_t m = 0;
    for (int64_t e = 0; e < d.E; ++e) {
      int64_t i = std::min(m, d.K - 1);
      if (m == d.K && !(l[e] > l[ex[i]])) continue;
      while (i > 0 && l[e] > l[ex[i - 1]]) ex[i] = ex[i - 1], --i;
      ex[i] = static_cast<int32_t>(e);
      m = std::min(m + 1, d.K);
    }
  }
}

// The capacity-th largest of `keys` (keys distinct, capacity < keys.size()).
uint64_t kth_largest(std::vector<uint64_t> keys, int64_t capacity) {
  std::nth_element(keys.begin(), keys.begin() + (capacity - 1), keys.end(), std::greater<>());
  return keys[capacity - 1];
}

// Counts and slots of expert e; returns the choices of e that the aux loss's
// ce counts (first choices for K <= 2, all for K > 2: before dropping).
int64_t gate_expert(const MoeGateArgs& a, const GateDims& d, int64_t e, uint64_t rts_key) {
  const int32_t* ex = a.expert.data<int32_t>();
  int32_t* slot = a.slot.data<int32_t>();
  const int64_t cap = a.capacity;
  std::vector<int64_t> idx;  // flat (n * K + j) of e's choices, token order
  for (int64_t t = 0; t < d.N; ++t) {
    const int64_t n = moe_token_row(t, d.N, a.seq);
    for (int64_t j = 0; j < d.K; ++j)
      if (ex[n * d.K + j] == e) idx.push_back(n * d.K + j);
  }
  auto order = [&](int64_t n) { return moe_token_order(n, d.N, a.seq); };
  a.counts.data<int32_t>()[e] = static_cast<int32_t>(idx.size());
  const int64_t count = static_cast<int64_t>(idx.size());
  if (d.K == 2) {
    // First choices take rows 0.., second choices follow all first ones;
    // a choice whose row is past the capacity is dropped.
    int64_t firsts = 0;
    for (int64_t i : idx) firsts += i % 2 == 0;
    int64_t r1 = 0, r2 = firsts;
    for (int64_t i : idx) {
      const int64_t r = i % 2 == 0 ? r1++ : r2++;
      slot[i] = cap == 0 || r < cap ? static_cast<int32_t>(r) : -1;
    }
    return firsts;
  }
  // K = 1 and K > 2: which choices are kept, then rows in token order.
  std::vector<char> keep(idx.size(), 1);
  if (cap > 0 && d.K == 1 && count > cap) {
    if (a.rts) {  // the `cap` largest uniform draws
      std::vector<uint64_t> keys(idx.size());
      for (size_t i = 0; i < idx.size(); ++i) keys[i] = moe_rts_key(rts_key, order(idx[i]), e);
      const uint64_t t = kth_largest(keys, cap);
      for (size_t i = 0; i < idx.size(); ++i) keep[i] = keys[i] >= t;
    } else {  // the first `cap` by position
      for (size_t i = 0; i < idx.size(); ++i) keep[i] = int64_t(i) < cap;
    }
  } else if (cap > 0 && d.K > 2 && cap < d.N) {
    // Drop policy "probs", as DeepSpeed does it: the top `cap` of expert e's
    // column of topk_masked_gates over ALL tokens, which holds the chosen
    // logit for e's choosers and 0 for the others, then AND with e's choices.
    // A chooser whose logit is negative therefore loses its place to tokens
    // that did not choose e, and fewer than `cap` may be kept although more
    // chose e. Ties go to the lower token.
    const float* logits = a.logits.data<float>();
    std::vector<uint64_t> keys(d.N);
    for (int64_t n = 0; n < d.N; ++n) keys[n] = moe_key(moe_float_order(0.f), order(n));
    for (int64_t i : idx) keys[i / d.K] = moe_key(moe_float_order(logits[(i / d.K) * d.E + e]), order(i / d.K));
    const uint64_t t = kth_largest(keys, cap);
    for (size_t i = 0; i < idx.size(); ++i) keep[i] = keys[idx[i] / d.K] >= t;
  }
  int32_t r = 0;
  for (size_t i = 0; i < idx.size(); ++i) slot[idx[i]] = keep[i] ? r++ : -1;
  return count;
}

// Combine weights of token n: the kept gates (K = 1), renormalised over the
// kept choices with the sum clamped at f32 epsilon (K >= 2); 0 where dropped.
void gate_weights(const MoeGateArgs& a, const GateDims& d, int64_t n) {
  const float* g = a.gates.data<float>() + n * d.E;
  const int32_t* ex = a.expert.data<int32_t>() + n * d.K;
  const int32_t* sl = a.slot.data<int32_t>() + n * d.K;
  float* w = a.weight.data<float>() + n * d.K;
  double s = 0;
  for (int64_t j = 0; j < d.K; ++j) s += sl[j] >= 0 ? double(g[ex[j]]) : 0.0;
  const double denom = d.K == 1 ? 1.0 : std::max(s, double(FLT_EPSILON));
  for (int64_t j = 0; j < d.K; ++j) w[j] = sl[j] >= 0 ? float(double(g[ex[j]]) / denom) : 0.f;
}

// l_aux's weight of sum_e me_e * ce_e: E for top-1/top-2, E / K for top-k.
double aux_coef(int64_t E, int64_t K) { return K <= 2 ? double(E) : double(E) / double(K); }

// Ids read from memory the caller filled: expert in [0, E), slot in [-1, C).
void check_choices(const char* op, const Tensor& expert, const Tensor& slot, int64_t E, int64_t C) {
  const int32_t* ex = expert.data<int32_t>();
  const int32_t* sl = slot.data<int32_t>();
  for (int64_t i = 0; i < expert.numel(); ++i) {
    DS_CHECK(ex[i] >= 0 && ex[i] < E, "{}: expert[{}] = {} is outside [0, E={})", op, i, ex[i], E);
    DS_CHECK(sl[i] >= -1 && sl[i] < C, "{}: slot[{}] = {} is outside [-1, C={})", op, i, sl[i], C);
  }
}

}  // namespace

void moe_gate_forward(const MoeGateArgs& a, const Stream&) {
  const GateDims d{a.logits.size(0), a.logits.size(1), a.expert.size(1)};
  const uint64_t gumbel_key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Gumbel);
  const uint64_t rts_key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Rts);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) gate_token(a, d, n, gumbel_key);
  std::vector<int64_t> ce_count(d.E);
  std::vector<double> me(d.E);
  const float* g = a.gates.data<float>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t e = 0; e < d.E; ++e) {
    ce_count[e] = gate_expert(a, d, e, rts_key);
    double s = 0;
    for (int64_t n = 0; n < d.N; ++n) s += g[n * d.E + e];
    me[e] = s;
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) gate_weights(a, d, n);
  // l_aux = coef * sum_e mean_n(gates) * (choices before dropping) / N.
  double aux = 0;
  for (int64_t e = 0; e < d.E; ++e) aux += me[e] * double(ce_count[e]);
  a.aux.data<float>()[0] = d.N > 0 ? float(aux_coef(d.E, d.K) * aux / (double(d.N) * double(d.N))) : 0.f;
}

void moe_gate_backward(const MoeGateBwdArgs& a, const Stream&) {
  const int64_t N = a.gates.size(0), E = a.gates.size(1), K = a.expert.size(1);
  check_choices("moe_gate_backward", a.expert, a.slot, E, N * K);  // a slot is < N * K
  // d aux / d gates[n, e] = coef * ce_e / N, ce_e = (e's choices counted by
  // the forward's ce: first ones for K <= 2, all for K > 2) / N.
  const int32_t* ex = a.expert.data<int32_t>();
  const int64_t Kc = K <= 2 ? 1 : K;
  std::vector<double> daux_g(E, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < Kc; ++j) daux_g[ex[n * K + j]] += 1.0;
  const double scale = N > 0 ? double(a.daux) * aux_coef(E, K) / (double(N) * double(N)) : 0.0;
  for (double& v : daux_g) v *= scale;
  const float* gates = a.gates.data<float>();
  const float* dw = a.dweight.data<float>();
  const int32_t* slot = a.slot.data<int32_t>();
  float* dl = a.dlogits.data<float>();
#pragma omp parallel
  {
    std::vector<double> dg(E);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* g = gates + n * E;
      const int32_t* e = ex + n * K;
      const int32_t* s = slot + n * K;
      const float* w = dw + n * K;
      std::copy(daux_g.begin(), daux_g.end(), dg.begin());
      if (K == 1) {
        if (s[0] >= 0) dg[e[0]] += w[0];
      } else {
        // w_j = g_j / max(S, eps), S = sum of the kept gates.
        double S = 0, wsum = 0;
        for (int64_t j = 0; j < K; ++j) S += s[j] >= 0 ? double(g[e[j]]) : 0.0;
        const bool clamped = S < double(FLT_EPSILON);
        for (int64_t j = 0; j < K; ++j) wsum += s[j] >= 0 ? double(w[j]) * double(g[e[j]]) : 0.0;
        for (int64_t j = 0; j < K; ++j) {
          if (s[j] < 0) continue;
          dg[e[j]] += clamped ? double(w[j]) / double(FLT_EPSILON) : (double(w[j]) - wsum / S) / S;
        }
      }
      double dot = 0;
      for (int64_t k = 0; k < E; ++k) dot += double(g[k]) * dg[k];
      for (int64_t k = 0; k < E; ++k) dl[n * E + k] = float(double(g[k]) * (dg[k] - dot));
    }
  }
}

void moe_dispatch_forward(const MoeDispatchArgs& a, const Stream&) {
  const int64_t N = a.inp.size(0), D = a.inp.size(1), K = a.expert.size(1);
  const int64_t E = a.out.size(0), C = a.out.size(1);
  check_choices("moe_dispatch_forward", a.expert, a.slot, E, C);
  float* out = a.out.data<float>();
  std::fill(out, out + a.out.numel(), 0.f);
  const float* x = a.inp.data<float>();
  const int32_t* ex = a.expert.data<int32_t>();
  const int32_t* sl = a.slot.data<int32_t>();
  // Every kept choice owns its (e, s) row: no two tokens write one row.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (sl[n * K + j] >= 0)
        std::copy(x + n * D, x + (n + 1) * D, out + (ex[n * K + j] * C + sl[n * K + j]) * D);
}

void moe_dispatch_backward(const MoeDispatchBwdArgs& a, const Stream&) {
  const int64_t N = a.dinp.size(0), D = a.dinp.size(1), K = a.expert.size(1);
  const int64_t E = a.dout.size(0), C = a.dout.size(1);
  check_choices("moe_dispatch_backward", a.expert, a.slot, E, C);
  const float* dout = a.dout.data<float>();
  float* dx = a.dinp.data<float>();
  const int32_t* ex = a.expert.data<int32_t>();
  const int32_t* sl = a.slot.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = dx + n * D;
    std::fill(row, row + D, 0.f);
    for (int64_t j = 0; j < K; ++j) {
      if (sl[n * K + j] < 0) continue;
      const float* src = dout + (ex[n * K + j] * C + sl[n * K + j]) * D;
      for (int64_t i = 0; i < D; ++i) row[i] += src[i];
    }
  }
}

void moe_combine_forward(const MoeCombineArgs& a, const Stream&) {
  const int64_t N = a.out.size(0), D = a.out.size(1), K = a.expert.size(1);
  const int64_t E = a.inp.size(0), C = a.inp.size(1);
  check_choices("moe_combine_forward", a.expert, a.slot, E, C);
  const float* y = a.inp.data<float>();
  const float* w = a.weight.data<float>();
  float* out = a.out.data<float>();
  const int32_t* ex = a.expert.data<int32_t>();
  const int32_t* sl = a.slot.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = out + n * D;
    std::fill(row, row + D, 0.f);
    for (int64_t j = 0; j < K; ++j) {
      if (sl[n * K + j] < 0) continue;
      const float* src = y + (ex[n * K + j] * C + sl[n * K + j]) * D;
      const float wj = w[n * K + j];
      for (int64_t i = 0; i < D; ++i) row[i] += wj * src[i];
    }
  }
}

void moe_combine_backward(const MoeCombineBwdArgs& a, const Stream&) {
  const int64_t N = a.dout.size(0), D = a.dout.size(1), K = a.expert.size(1);
  const int64_t E = a.inp.size(0), C = a.inp.size(1);
  check_choices("moe_combine_backward", a.expert, a.slot, E, C);
  const float* y = a.inp.data<float>();
  const float* w = a.weight.data<float>();
  const float* dout = a.dout.data<float>();
  float* dy = a.dinp.data<float>();
  float* dw = a.dweight.data<float>();
  const int32_t* ex = a.expert.data<int32_t>();
  const int32_t* sl = a.slot.data<int32_t>();
  std::fill(dy, dy + a.dinp.numel(), 0.f);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = dout + n * D;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = n * K + j;
      if (sl[i] < 0) {
        dw[i] = 0.f;
        continue;
      }
      const int64_t row = (ex[i] * C + sl[i]) * D;
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += double(g[c]) * double(y[row + c]);
      dw[i] = float(dot);
      for (int64_t c = 0; c < D; ++c) dy[row + c] = w[i] * g[c];
    }
  }
}

namespace {

// softmax of a row's two coefficient logits, in double.
std::pair<double, double> mix_weights(const float* coef) {
  const double m = std::max(coef[0], coef[1]);
  const double e0 = std::exp(double(coef[0]) - m), e1 = std::exp(double(coef[1]) - m);
  return {e0 / (e0 + e1), e1 / (e0 + e1)};
}

}  // namespace

void moe_mix_forward(const MoeMixArgs& a, const Stream&) {
  const int64_t N = a.out.size(0), D = a.out.size(1);
  const float *moe = a.moe.data<float>(), *mlp = a.mlp.data<float>(), *coef = a.coef.data<float>();
  float* out = a.out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const auto [c0, c1] = mix_weights(coef + 2 * n);
    for (int64_t d = 0; d < D; ++d)
      out[n * D + d] = float(c0 * double(moe[n * D + d]) + c1 * double(mlp[n * D + d]));
  }
}

void moe_mix_backward(const MoeMixBwdArgs& a, const Stream&) {
  const int64_t N = a.dout.size(0), D = a.dout.size(1);
  const float *dout = a.dout.data<float>(), *moe = a.moe.data<float>(), *mlp = a.mlp.data<float>();
  const float* coef = a.coef.data<float>();
  float *dmoe = a.dmoe.data<float>(), *dmlp = a.dmlp.data<float>(), *dcoef = a.dcoef.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const auto [c0, c1] = mix_weights(coef + 2 * n);
    double g0 = 0, g1 = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double g = dout[n * D + d];
      g0 += g * double(moe[n * D + d]);
      g1 += g * double(mlp[n * D + d]);
      dmoe[n * D + d] = float(c0 * g);
      dmlp[n * D + d] = float(c1 * g);
    }
    const double dot = c0 * g0 + c1 * g1;
    dcoef[2 * n] = float(c0 * (g0 - dot));
    dcoef[2 * n + 1] = float(c1 * (g1 - dot));
  }
}

void moe_jitter(const MoeJitterArgs& a, const Stream&) {
  const int64_t N = a.inp.size(0), D = a.inp.size(1);
  const uint64_t key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Jitter);
  const float* x = a.inp.data<float>();
  float* y = a.out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) y[n * D + d] = x[n * D + d] * moe_jitter_factor(key, n, d, a.eps);
}

}  // namespace ds::cpu
