// Vocab-parallel softmax cross-entropy on CUDA, one phase per launch (see
// VocabParallelCEArgs): one block per row reduces the local real columns
// (max, or sum of exp and the owned target logit); the finish phase writes
// the loss and dlogits = dloss * (softmax - onehot) in the logits' dtype.
// The tp all-reduces between phases are the caller's.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;

template <class T> struct VocabCEParams {
  const T* logits;         // (N, Vl)
  T* dlogits;              // (N, Vl) or null; may alias logits
  const int32_t* targets;  // (N)
  float* rowmax;           // (N)
  float* stats;            // (2, N)
  float* losses;           // (N)
  int64_t N, Vl, real, vocab_start;
  float dloss;
};

template <class T>
__global__ void vocab_ce_max_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const T* x = p.logits + row * p.Vl;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < p.real; c += kThreads) m = fmaxf(m, to_f(x[c]));
  float M = block_max(m);
  if (threadIdx.x == 0) p.rowmax[row] = M;
}

template <class T>
__global__ void vocab_ce_stats_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const T* x = p.logits + row * p.Vl;
  const float M = p.rowmax[row];
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < p.real; c += kThreads) s += expf(to_f(x[c]) - M);
  float S = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t tgt = p.targets[row], t = tgt - p.vocab_start;
    p.stats[row] = S;
    p.stats[p.N + row] = tgt >= 0 && t >= 0 && t < p.real ? to_f(x[t]) : 0.f;
  }
}

template <class T>
__global__ void vocab_ce_finish_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const int64_t tgt = p.targets[row], t = tgt - p.vocab_start;
  const float lse = p.rowmax[row] + logf(p.stats[row]);
  if (threadIdx.x == 0) p.losses[row] = tgt >= 0 ? lse - p.stats[p.N + row] : 0.f;
  if (!p.dlogits) return;
  const T* x = p.logits + row * p.Vl;
  T* d = p.dlogits + row * p.Vl;
  for (int64_t c = threadIdx.x; c < p.Vl; c += kThreads) {
    float g = 0.f;
    if (tgt >= 0 && c < p.real) g = p.dloss * (expf(to_f(x[c]) - lse) - (c == t ? 1.0f : 0.0f));
    d[c] = from_f<T>(g);
  }
}

}  // namespace

void vocab_parallel_cross_entropy(const VocabParallelCEArgs& a, const Stream& s) {
  const char* op = "vocab_parallel_cross_entropy";
  const int64_t Vl = a.logits.size(-1), N = Vl ? a.logits.numel() / Vl : 0;
  const bool finish = a.phase == VocabCEPhase::Finish;
  if (finish && a.dlogits.defined())
    expect_compute(a.dlogits, a.logits.dtype(), op, "dlogits", "logits");
  if (N == 0) return;
  DS_CUDA_REQUIRE(N < (int64_t(1) << 31), std::string(op) + ": too many rows");
  int64_t real = a.V - a.vocab_start;
  real = real < 0 ? 0 : (real > Vl ? Vl : real);
  dispatch_float(a.logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    VocabCEParams<T> p{a.logits.data<T>(),
                       finish && a.dlogits.defined() ? a.dlogits.data<T>() : nullptr,
                       a.targets.data<int32_t>(),
                       a.rowmax.data<float>(),
                       a.phase != VocabCEPhase::Max ? a.stats.data<float>() : nullptr,
                       finish ? a.losses.data<float>() : nullptr,
                       N, Vl, real, a.vocab_start, a.dloss};
    if (a.phase == VocabCEPhase::Max)
      vocab_ce_max_kernel<T><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    else if (a.phase == VocabCEPhase::Stats)
      vocab_ce_stats_kernel<T><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    else
      vocab_ce_finish_kernel<T><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
