// Vocab-parallel softmax cross-entropy on CUDA, one phase per launch (see
// VocabParallelCEArgs): one block per row reduces the local real columns
// (max, or sum of exp and the owned target logit); the finish phase writes
// the loss and dlogits = dloss * (softmax - onehot) in the logits' dtype.
// The tp all-reduces between phases are the caller's.
// Rows are read and written in 16-byte vectors when the local width Vl is a
// multiple of the vector width VW and the logits/dlogits are aligned: the
// reductions read the vectors that hold real columns (those >= real masked
// inside the last one), the finish phase writes whole padded rows. Otherwise
// the same kernels run with VW = 1, element by element. Per element the
// arithmetic is the same on both paths: the max (order-free) and the finish
// phase give the same bits on either; the sum of exp is added in a per-path
// order (deterministic for a given path).
#include "cuda/core/vec.cuh"
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

// End of the columns a reduction reads: the real ones, rounded up to whole
// vectors (<= Vl, since VW > 1 only when VW divides Vl).
template <int VW> __device__ __forceinline__ int64_t reduce_end(int64_t real) {
  return (real + VW - 1) / VW * VW;
}

template <class T, int VW>
__global__ void vocab_ce_max_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const T* x = p.logits + row * p.Vl;
  float m = -INFINITY;
  const int64_t end = reduce_end<VW>(p.real);
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < end; c0 += int64_t(kThreads) * VW) {
    float xv[VW];
    load_f<VW>(x, c0, xv);
#pragma unroll
    for (int k = 0; k < VW; ++k)
      if (c0 + k < p.real) m = fmaxf(m, xv[k]);
  }
  float M = block_max(m);
  if (threadIdx.x == 0) p.rowmax[row] = M;
}

template <class T, int VW>
__global__ void vocab_ce_stats_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const T* x = p.logits + row * p.Vl;
  const float M = p.rowmax[row];
  float s = 0.f;
  const int64_t end = reduce_end<VW>(p.real);
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < end; c0 += int64_t(kThreads) * VW) {
    float xv[VW];
    load_f<VW>(x, c0, xv);
#pragma unroll
    for (int k = 0; k < VW; ++k)
      if (c0 + k < p.real) s += expf(xv[k] - M);
  }
  float S = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t tgt = p.targets[row], t = tgt - p.vocab_start;
    p.stats[row] = S;
    p.stats[p.N + row] = tgt >= 0 && t >= 0 && t < p.real ? to_f(x[t]) : 0.f;
  }
}

template <class T, int VW>
__global__ void vocab_ce_finish_kernel(VocabCEParams<T> p) {
  const int64_t row = blockIdx.x;
  const int64_t tgt = p.targets[row], t = tgt - p.vocab_start;
  const float lse = p.rowmax[row] + logf(p.stats[row]);
  if (threadIdx.x == 0) p.losses[row] = tgt >= 0 ? lse - p.stats[p.N + row] : 0.f;
  if (!p.dlogits) return;
  const T* x = p.logits + row * p.Vl;
  T* d = p.dlogits + row * p.Vl;
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < p.Vl; c0 += int64_t(kThreads) * VW) {
    // Only vectors with a real column of a counted row need the logits; a
    // vector is read before it is written (dlogits may alias logits).
    const bool live = tgt >= 0 && c0 < p.real;
    float xv[VW], g[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) xv[k] = 0.f;
    if (live) load_f<VW>(x, c0, xv);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      const int64_t c = c0 + k;
      g[k] = 0.f;
      if (live && c < p.real) g[k] = p.dloss * (expf(xv[k] - lse) - (c == t ? 1.0f : 0.0f));
    }
    store_f<VW>(d, c0, g);
  }
}

template <class T, int VW> void launch_phase(VocabCEPhase phase, const VocabCEParams<T>& p, const Stream& s) {
  const unsigned grid = unsigned(p.N);
  if (phase == VocabCEPhase::Max)
    vocab_ce_max_kernel<T, VW><<<grid, kThreads, 0, stream_of(s)>>>(p);
  else if (phase == VocabCEPhase::Stats)
    vocab_ce_stats_kernel<T, VW><<<grid, kThreads, 0, stream_of(s)>>>(p);
  else
    vocab_ce_finish_kernel<T, VW><<<grid, kThreads, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
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
    constexpr int E = sizeof(T), VW = vec_width(E);
    if (rows_vectorisable(p.logits, E, Vl, VW) && rows_vectorisable(p.dlogits, E, Vl, VW))
      launch_phase<T, VW>(a.phase, p, s);
    else
      launch_phase<T, 1>(a.phase, p, s);
  });
}

}  // namespace ds::cuda
