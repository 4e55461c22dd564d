// Mixture-of-Experts ops on CUDA: the gate (DeepSpeed's top-1/top-2/top-k
// gating in the compact (expert, slot, weight) form of lib/ops/op_args.h),
// its backward, and the dispatch/combine copies. lib/cpu/moe.cpp is the
// reference; both draw the same noise and compare the same integer keys
// (lib/ops/moe_noise.h), so choices, slots and counts agree exactly.
// The gate runs in four launches:
//  1. per token (one thread each): softmax in double, the K choices;
//  2. per expert (one block each): counts, the kept set, and the slots, a
//     block-wide prefix sum over the tokens in order. The tokens of one
//     expert are walked serially tile by tile and a kept set chosen by value
//     (top-1 RTS, top-k "probs") is found by a 64-step bitwise search of the
//     capacity-th largest key, each step a pass over the tokens: simple, and
//     cheap next to the experts' GEMMs at today's sizes (a sort-based
//     selection would be the next step);
//  3. per token: the combine weights;
//  4. one thread: l_aux from the per-expert sums of step 2, in expert order.
// Deterministic: block sums are fixed trees, nothing uses atomics.
#include <cub/block/block_scan.cuh>

#include <cfloat>

#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"
#include "lib/ops/moe_noise.h"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kTokenThreads = 128;
constexpr int kExpertThreads = 256;
constexpr int kRowThreads = 128;

struct GateParams {
  float* gates;          // (N, E)
  int32_t* expert;       // (N, K)
  int32_t* slot;         // (N, K)
  float* weight;         // (N, K)
  int32_t* counts;       // (E)
  const float* logits;   // (N, E)
  int64_t N, E, K, capacity;
  int64_t seq;  // the token order (moe_token_row)
  bool rts, rsample, second_sampling;
  uint64_t gumbel_key, rts_key;
};

// The first maximum of logits[e] (+ Gumbel noise in double), skipping `skip`.
__device__ int32_t argmax_logits(const GateParams& p, const float* l, int64_t n, bool noise, int64_t skip) {
  int64_t best = -1;
  double bv = 0;
  for (int64_t e = 0; e < p.E; ++e) {
    if (e == skip) continue;
    const double v =
        noise ? double(l[e]) + moe_gumbel(moe_noise_bits(p.gumbel_key, moe_token_order(n, p.N, p.seq), e)) : double(l[e]);
    if (best < 0 || v > bv) best = e, bv = v;
  }
  return int32_t(best);
}

__global__ void gate_token_kernel(GateParams p) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  const float* l = p.logits + n * p.E;
  float* g = p.gates + n * p.E;
  int32_t* ex = p.expert + n * p.K;
  float mx = l[0];
  for (int64_t e = 1; e < p.E; ++e) mx = fmaxf(mx, l[e]);
  double sum = 0;
  for (int64_t e = 0; e < p.E; ++e) sum += exp(double(l[e]) - double(mx));
  for (int64_t e = 0; e < p.E; ++e) g[e] = float(exp(double(l[e]) - double(mx)) / sum);
  if (p.K == 1) {
    ex[0] = argmax_logits(p, l, n, p.rsample, -1);
  } else if (p.K == 2) {
    ex[0] = argmax_logits(p, l, n, false, -1);
    ex[1] = argmax_logits(p, l, n, p.second_sampling, ex[0]);
  } else {  // the top K logits, larger first, ties to the lower expert
    int64_t m = 0;
    for (int64_t e = 0; e < p.E; ++e) {
      int64_t i = m < p.K - 1 ? m : p.K - 1;
      if (m == p.K && !(l[e] > l[ex[i]])) continue;
      while (i > 0 && l[e] > l[ex[i - 1]]) ex[i] = ex[i - 1], --i;
      ex[i] = int32_t(e);
      m = m + 1 < p.K ? m + 1 : p.K;
    }
  }
}

// Which of token n's choices is expert e (-1: none); K = 2 asks for choice `j2` only.
__device__ int64_t choice_of(const GateParams& p, int64_t n, int64_t e, int64_t j2) {
  if (p.K == 2) return p.expert[n * 2 + j2] == e ? j2 : -1;
  for (int64_t j = 0; j < p.K; ++j)
    if (p.expert[n * p.K + j] == e) return j;
  return -1;
}

// The selection key of token n for expert e, or false when n is no candidate:
// top-1 RTS ranks e's choosers by their uniform; top-k "probs" ranks every
// token by its topk_masked_gates entry (its logit if it chose e, else 0).
__device__ bool select_key(const GateParams& p, int64_t n, int64_t e, uint64_t& key) {
  const bool chose = choice_of(p, n, e, 0) >= 0;
  if (p.K == 1) {
    key = moe_rts_key(p.rts_key, moe_token_order(n, p.N, p.seq), e);
    return chose;
  }
  key = moe_key(moe_float_order(chose ? p.logits[n * p.E + e] : 0.f), moe_token_order(n, p.N, p.seq));
  return true;
}

// One block per expert: counts, kept set, slots; me_ce[e] = sum_n gates[n, e]
// times the choices of e that l_aux's ce counts.
__global__ void gate_expert_kernel(GateParams p, double* me_ce /* (E) */) {
  const int64_t e = blockIdx.x;
  const int tid = threadIdx.x;
  double cnt = 0, firsts = 0, gsum = 0;
  for (int64_t i = tid; i < p.N * p.K; i += kExpertThreads)
    if (p.expert[i] == e) cnt += 1, firsts += i % p.K == 0;
  for (int64_t n = tid; n < p.N; n += kExpertThreads) gsum += p.gates[n * p.E + e];
  cnt = block_sum(cnt);
  firsts = block_sum(firsts);
  gsum = block_sum(gsum);
  const int64_t count = int64_t(cnt), cap = p.capacity;
  if (tid == 0) {
    p.counts[e] = int32_t(count);
    me_ce[e] = gsum * (p.K > 2 ? cnt : firsts);
  }
  // The kept set by value: the keys >= T, T the cap-th largest, found bit by bit.
  const bool by_value = cap > 0 && ((p.K == 1 && p.rts && count > cap) || (p.K > 2 && cap < p.N));
  uint64_t T = 0;
  for (int bit = 63; by_value && bit >= 0; --bit) {
    const uint64_t cand = T | (1ull << bit);
    double above = 0;
    for (int64_t n = tid; n < p.N; n += kExpertThreads) {
      uint64_t k;
      if (select_key(p, n, e, k) && k >= cand) above += 1;
    }
    if (block_sum(above) >= double(cap)) T = cand;
  }
  // Rows in token order (K = 2: the first choices, then the second ones).
  using Scan = cub::BlockScan<int, kExpertThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int64_t run = 0;
  for (int64_t pass = 0; pass < (p.K == 2 ? 2 : 1); ++pass) {
    for (int64_t base = 0; base < p.N; base += kExpertThreads) {
      const int64_t n = base + tid < p.N ? moe_token_row(base + tid, p.N, p.seq) : p.N;
      const int64_t j = n < p.N ? choice_of(p, n, e, pass) : -1;
      int flag = 0;
      if (j >= 0) {
        uint64_t k = 0;
        flag = !by_value || (select_key(p, n, e, k) && k >= T);
      }
      int excl, total;
      Scan(tmp).ExclusiveSum(flag, excl, total);
      if (j >= 0) {
        const int64_t r = run + excl;
        const bool kept = by_value ? flag != 0 : cap == 0 || r < cap;
        p.slot[n * p.K + j] = kept ? int32_t(r) : -1;
      }
      run += total;
      __syncthreads();  // tmp is reused
    }
  }
}

__global__ void gate_weight_kernel(GateParams p) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  const float* g = p.gates + n * p.E;
  const int32_t* ex = p.expert + n * p.K;
  const int32_t* sl = p.slot + n * p.K;
  double s = 0;
  for (int64_t j = 0; j < p.K; ++j) s += sl[j] >= 0 ? double(g[ex[j]]) : 0.0;
  const double denom = p.K == 1 ? 1.0 : fmax(s, double(FLT_EPSILON));
  for (int64_t j = 0; j < p.K; ++j) p.weight[n * p.K + j] = sl[j] >= 0 ? float(double(g[ex[j]]) / denom) : 0.f;
}

// l_aux = coef * sum_e me_ce[e] / N^2, coef = E (K <= 2) or E / K.
__global__ void gate_aux_kernel(float* aux, const double* me_ce, int64_t N, int64_t E, int64_t K) {
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += me_ce[e];
  const double coef = K <= 2 ? double(E) : double(E) / double(K);
  aux[0] = N > 0 ? float(coef * s / (double(N) * double(N))) : 0.f;
}

// daux_g[e] = scale * (choices of e in the columns ce counts).
__global__ void gate_ce_kernel(double* daux_g, const int32_t* expert, int64_t N, int64_t K, double scale) {
  const int64_t e = blockIdx.x, Kc = K <= 2 ? 1 : K;
  double c = 0;
  for (int64_t i = threadIdx.x; i < N * Kc; i += kExpertThreads) c += expert[(i / Kc) * K + i % Kc] == e;
  c = block_sum(c);
  if (threadIdx.x == 0) daux_g[e] = c * scale;
}

struct GateBwdParams {
  float* dlogits;         // (N, E)
  const float* dweight;   // (N, K)
  const float* gates;     // (N, E)
  const int32_t* expert;  // (N, K)
  const int32_t* slot;    // (N, K)
  const double* daux_g;   // (E)
  int64_t N, E, K;
};

// One thread per token: dgates = l_aux's part + the weights' part at the kept
// choices, then through the softmax. Same order of sums as the CPU.
__global__ void gate_backward_kernel(GateBwdParams p) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  const float* g = p.gates + n * p.E;
  const int32_t* ex = p.expert + n * p.K;
  const int32_t* sl = p.slot + n * p.K;
  const float* w = p.dweight + n * p.K;
  double S = 0, wsum = 0;
  for (int64_t j = 0; j < p.K; ++j) S += sl[j] >= 0 ? double(g[ex[j]]) : 0.0;
  for (int64_t j = 0; j < p.K; ++j) wsum += sl[j] >= 0 ? double(w[j]) * double(g[ex[j]]) : 0.0;
  const bool clamped = S < double(FLT_EPSILON);
  auto dg = [&](int64_t k) {
    double v = p.daux_g[k];
    for (int64_t j = 0; j < p.K; ++j) {
      if (sl[j] < 0 || ex[j] != k) continue;
      v += p.K == 1 ? double(w[j]) : clamped ? double(w[j]) / double(FLT_EPSILON) : (double(w[j]) - wsum / S) / S;
    }
    return v;
  };
  double dot = 0;
  for (int64_t k = 0; k < p.E; ++k) dot += double(g[k]) * dg(k);
  for (int64_t k = 0; k < p.E; ++k) p.dlogits[n * p.E + k] = float(double(g[k]) * (dg(k) - dot));
}

// ---- dispatch / combine: one block per token, threads over D --------------

// The buffer row of choice (n, j), or -1 when dropped (or out of range).
__device__ __forceinline__ int64_t buffer_row(const int32_t* expert, const int32_t* slot, int64_t i, int64_t E,
                                              int64_t C) {
  const int32_t e = expert[i], s = slot[i];
  return s >= 0 && s < C && e >= 0 && e < E ? int64_t(e) * C + s : -1;
}

template <class T>
__global__ void dispatch_kernel(T* out /* (E, C, D) */, const T* inp /* (N, D) */, const int32_t* expert,
                                const int32_t* slot /* (N, K) */, int64_t K, int64_t E, int64_t C, int64_t D) {
  const int64_t n = blockIdx.x;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t row = buffer_row(expert, slot, n * K + j, E, C);
    if (row < 0) continue;
    for (int64_t d = threadIdx.x; d < D; d += kRowThreads) out[row * D + d] = inp[n * D + d];
  }
}

// out[n] = sum_j w_j * buf[row_j] (w null: weights 1), in choice order.
template <class T>
__global__ void gather_kernel(T* out /* (N, D) */, const T* buf /* (E, C, D) */, const float* w /* (N, K) */,
                              const int32_t* expert, const int32_t* slot, int64_t K, int64_t E, int64_t C,
                              int64_t D) {
  const int64_t n = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += kRowThreads) {
    float acc = 0.f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = buffer_row(expert, slot, n * K + j, E, C);
      if (row >= 0) acc += (w ? w[n * K + j] : 1.f) * to_f(buf[row * D + d]);
    }
    out[n * D + d] = from_f<T>(acc);
  }
}

template <class T>
__global__ void combine_backward_kernel(T* dinp /* (E, C, D) */, float* dweight /* (N, K) */,
                                        const T* dout /* (N, D) */, const T* inp /* (E, C, D) */,
                                        const float* weight, const int32_t* expert, const int32_t* slot,
                                        int64_t K, int64_t E, int64_t C, int64_t D) {
  const int64_t n = blockIdx.x;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t i = n * K + j, row = buffer_row(expert, slot, i, E, C);
    if (row < 0) {  // uniform over the block
      if (threadIdx.x == 0) dweight[i] = 0.f;
      continue;
    }
    double dot = 0;
    for (int64_t d = threadIdx.x; d < D; d += kRowThreads) {
      const float g = to_f(dout[n * D + d]);
      dot += double(g) * double(to_f(inp[row * D + d]));
      dinp[row * D + d] = from_f<T>(weight[i] * g);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dweight[i] = float(dot);
  }
}

GateParams gate_params(const MoeGateArgs& a) {
  return {a.gates.data<float>(), a.expert.data<int32_t>(), a.slot.data<int32_t>(), a.weight.data<float>(),
          a.counts.data<int32_t>(), a.logits.data<float>(), a.logits.size(0), a.logits.size(1),
          a.expert.size(1), a.capacity, a.seq, a.rts, a.rsample, a.second_sampling,
          moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Gumbel),
          moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Rts)};
}

void zero(const Tensor& t, const Stream& s) {
  if (t.numel() > 0) DS_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), stream_of(s)));
}

}  // namespace

void moe_gate_forward(const MoeGateArgs& a, const Stream& s) {
  const GateParams p = gate_params(a);
  DS_CUDA_REQUIRE(p.E < (int64_t{1} << 31), "moe_gate_forward: E exceeds the grid");
  auto* me_ce = static_cast<double*>(stream_workspace(s, sizeof(double) * size_t(p.E)));
  const cudaStream_t st = stream_of(s);
  const unsigned tok = grid_for(p.N, kTokenThreads, int64_t{1} << 31);
  gate_token_kernel<<<tok, kTokenThreads, 0, st>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  gate_expert_kernel<<<unsigned(p.E), kExpertThreads, 0, st>>>(p, me_ce);
  DS_CUDA_CHECK_LAUNCH();
  gate_weight_kernel<<<tok, kTokenThreads, 0, st>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  gate_aux_kernel<<<1, 1, 0, st>>>(a.aux.data<float>(), me_ce, p.N, p.E, p.K);
  DS_CUDA_CHECK_LAUNCH();
}

void moe_gate_backward(const MoeGateBwdArgs& a, const Stream& s) {
  const int64_t N = a.gates.size(0), E = a.gates.size(1), K = a.expert.size(1);
  DS_CUDA_REQUIRE(E < (int64_t{1} << 31), "moe_gate_backward: E exceeds the grid");
  auto* daux_g = static_cast<double*>(stream_workspace(s, sizeof(double) * size_t(E)));
  const double coef = K <= 2 ? double(E) : double(E) / double(K);
  const double scale = N > 0 ? double(a.daux) * coef / (double(N) * double(N)) : 0.0;
  const cudaStream_t st = stream_of(s);
  gate_ce_kernel<<<unsigned(E), kExpertThreads, 0, st>>>(daux_g, a.expert.data<int32_t>(), N, K, scale);
  DS_CUDA_CHECK_LAUNCH();
  const GateBwdParams p{a.dlogits.data<float>(), a.dweight.data<float>(), a.gates.data<float>(),
                        a.expert.data<int32_t>(), a.slot.data<int32_t>(), daux_g, N, E, K};
  gate_backward_kernel<<<grid_for(N, kTokenThreads, int64_t{1} << 31), kTokenThreads, 0, st>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

void moe_dispatch_forward(const MoeDispatchArgs& a, const Stream& s) {
  const char* op = "moe_dispatch_forward";
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  const int64_t N = a.inp.size(0), D = a.inp.size(1), K = a.expert.size(1), E = a.out.size(0), C = a.out.size(1);
  zero(a.out, s);
  if (N == 0 || D == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), a.expert.data<int32_t>(), a.slot.data<int32_t>(), K, E, C, D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void moe_dispatch_backward(const MoeDispatchBwdArgs& a, const Stream& s) {
  const char* op = "moe_dispatch_backward";
  expect_compute(a.dinp, a.dout.dtype(), op, "dinp", "dout");
  const int64_t N = a.dinp.size(0), D = a.dinp.size(1), K = a.expert.size(1), E = a.dout.size(0),
                C = a.dout.size(1);
  if (N == 0 || D == 0) return;
  dispatch_float(a.dout.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(
        a.dinp.data<T>(), a.dout.data<T>(), nullptr, a.expert.data<int32_t>(), a.slot.data<int32_t>(), K, E, C, D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_forward(const MoeCombineArgs& a, const Stream& s) {
  const char* op = "moe_combine_forward";
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  const int64_t N = a.out.size(0), D = a.out.size(1), K = a.expert.size(1), E = a.inp.size(0), C = a.inp.size(1);
  if (N == 0 || D == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(a.out.data<T>(), a.inp.data<T>(),
                                                                   a.weight.data<float>(), a.expert.data<int32_t>(),
                                                                   a.slot.data<int32_t>(), K, E, C, D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_backward(const MoeCombineBwdArgs& a, const Stream& s) {
  const char* op = "moe_combine_backward";
  expect_compute(a.dinp, a.inp.dtype(), op, "dinp", "inp");
  expect_compute(a.dout, a.inp.dtype(), op, "dout", "inp");
  const int64_t N = a.dout.size(0), D = a.dout.size(1), K = a.expert.size(1), E = a.inp.size(0), C = a.inp.size(1);
  zero(a.dinp, s);
  zero(a.dweight, s);
  if (N == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    combine_backward_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(
        a.dinp.data<T>(), a.dweight.data<float>(), a.dout.data<T>(), a.inp.data<T>(), a.weight.data<float>(),
        a.expert.data<int32_t>(), a.slot.data<int32_t>(), K, E, C, D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

// ---- PR-MoE mix: one block per token, threads over D ------------------------

__device__ void mix_weights(const float* coef, double& c0, double& c1) {
  const double m = fmax(double(coef[0]), double(coef[1]));
  const double e0 = exp(double(coef[0]) - m), e1 = exp(double(coef[1]) - m);
  c0 = e0 / (e0 + e1);
  c1 = e1 / (e0 + e1);
}

template <class T>
__global__ void mix_kernel(T* out, const T* moe, const T* mlp, const float* coef, int64_t D) {
  const int64_t n = blockIdx.x;
  double c0, c1;
  mix_weights(coef + 2 * n, c0, c1);
  for (int64_t d = threadIdx.x; d < D; d += kRowThreads)
    out[n * D + d] = from_f<T>(float(c0 * double(to_f(moe[n * D + d])) + c1 * double(to_f(mlp[n * D + d]))));
}

template <class T>
__global__ void mix_backward_kernel(T* dmoe, T* dmlp, float* dcoef, const T* dout, const T* moe, const T* mlp,
                                    const float* coef, int64_t D) {
  const int64_t n = blockIdx.x;
  double c0, c1;
  mix_weights(coef + 2 * n, c0, c1);
  double g0 = 0, g1 = 0;
  for (int64_t d = threadIdx.x; d < D; d += kRowThreads) {
    const double g = to_f(dout[n * D + d]);
    g0 += g * double(to_f(moe[n * D + d]));
    g1 += g * double(to_f(mlp[n * D + d]));
    dmoe[n * D + d] = from_f<T>(float(c0 * g));
    dmlp[n * D + d] = from_f<T>(float(c1 * g));
  }
  g0 = block_sum(g0);
  g1 = block_sum(g1);
  if (threadIdx.x == 0) {
    const double dot = c0 * g0 + c1 * g1;
    dcoef[2 * n] = float(c0 * (g0 - dot));
    dcoef[2 * n + 1] = float(c1 * (g1 - dot));
  }
}

void moe_mix_forward(const MoeMixArgs& a, const Stream& s) {
  const char* op = "moe_mix_forward";
  expect_compute(a.moe, a.out.dtype(), op, "moe", "out");
  expect_compute(a.mlp, a.out.dtype(), op, "mlp", "out");
  const int64_t N = a.out.size(0), D = a.out.size(1);
  if (N == 0 || D == 0) return;
  dispatch_float(a.out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    mix_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(a.out.data<T>(), a.moe.data<T>(), a.mlp.data<T>(),
                                                                 a.coef.data<float>(), D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void moe_mix_backward(const MoeMixBwdArgs& a, const Stream& s) {
  const char* op = "moe_mix_backward";
  for (const Tensor* t : {&a.dmoe, &a.dmlp, &a.moe, &a.mlp}) expect_compute(*t, a.dout.dtype(), op, "grad", "dout");
  const int64_t N = a.dout.size(0), D = a.dout.size(1);
  if (N == 0) return;
  dispatch_float(a.dout.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    mix_backward_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(
        a.dmoe.data<T>(), a.dmlp.data<T>(), a.dcoef.data<float>(), a.dout.data<T>(), a.moe.data<T>(),
        a.mlp.data<T>(), a.coef.data<float>(), D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
__global__ void jitter_kernel(T* out, const T* inp, uint64_t key, float eps, int64_t D) {
  const int64_t n = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += kRowThreads)
    out[n * D + d] = from_f<T>(to_f(inp[n * D + d]) * moe_jitter_factor(key, n, d, eps));
}

void moe_jitter(const MoeJitterArgs& a, const Stream& s) {
  const char* op = "moe_jitter";
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  const int64_t N = a.inp.size(0), D = a.inp.size(1);
  if (N == 0 || D == 0) return;
  const uint64_t key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Jitter);
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    jitter_kernel<T><<<unsigned(N), kRowThreads, 0, stream_of(s)>>>(a.out.data<T>(), a.inp.data<T>(), key, a.eps, D);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
