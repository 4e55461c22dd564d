// Fused softmax cross-entropy over the padded vocab, one block per row:
// pass 1 keeps a running (max, sum of exp) per thread and merges them into the
// row's log-sum-exp; pass 2 writes dlogits = dloss (times *dloss_scale when
// given) * (softmax - onehot) in the logits' dtype. No fp32 probability matrix is ever stored. Columns >= V are
// padding (gradient 0); rows with target < 0 are ignored (loss 0, no gradient).
// A target >= V is an error on every backend: the CPU op throws, and since a
// kernel cannot, GptModel checks the targets on the host before the loss (the
// kernel itself would treat such a row as ignored).
// Rows are read and written in 16-byte vectors when the padded width Vp is a
// multiple of the vector width and the logits/dlogits are aligned (the
// padded columns inside a vector are masked), else element by element.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 512;

template <class T> struct XentParams {
  float* losses;        // (N)
  T* dlogits;           // (N, Vp) or null; may alias logits
  const T* logits;      // (N, Vp)
  const int32_t* targets;  // (N)
  int64_t N, Vp, V;
  float dloss;
  const float* dloss_scale;  // (1) or null: dloss is multiplied by it
};

template <class T, int VW>
__global__ void cross_entropy_kernel(XentParams<T> p) {
  int64_t row = blockIdx.x;
  const T* x = p.logits + row * p.Vp;
  int64_t tgt = p.targets[row];
  bool valid = tgt >= 0 && tgt < p.V;
  float xt = valid ? to_f(x[tgt]) : 0.f;  // read before any thread writes dlogits
  float m = -INFINITY, s = 0.f;
  // Vectors over the padded row (all in bounds); columns >= V are skipped.
  const int64_t end = VW == 1 ? p.V : p.Vp;
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < end; c0 += int64_t(kThreads) * VW) {
    float xv[VW];
    load_f<VW>(x, c0, xv);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      if (c0 + k >= p.V) continue;
      const float v = xv[k];
      if (v == -INFINITY) continue;  // adds exp(-inf) = 0 (and -inf - -inf would be NaN)
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
  }
  float M = block_max(m);
  float S = block_sum(m == -INFINITY ? 0.f : s * expf(m - M));
  float lse = M + logf(S);
  if (threadIdx.x == 0) p.losses[row] = valid ? lse - xt : 0.f;
  if (!p.dlogits) return;
  const float dloss = p.dloss_scale ? p.dloss * *p.dloss_scale : p.dloss;
  T* d = p.dlogits + row * p.Vp;
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < p.Vp; c0 += int64_t(kThreads) * VW) {
    float xv[VW], g[VW];
    load_f<VW>(x, c0, xv);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      const int64_t c = c0 + k;
      g[k] = 0.f;
      if (valid && c < p.V) g[k] = dloss * (expf(xv[k] - lse) - (c == tgt ? 1.0f : 0.0f));
    }
    store_f<VW>(d, c0, g);
  }
}

}  // namespace

void cross_entropy(const CrossEntropyArgs& a, const Stream& s) {
  const char* op = "cross_entropy";
  int64_t Vp = a.logits.size(-1), N = Vp ? a.logits.numel() / Vp : 0;
  if (a.dlogits.defined()) expect_compute(a.dlogits, a.logits.dtype(), op, "dlogits", "logits");
  if (N == 0) return;
  DS_CUDA_REQUIRE(N < (int64_t(1) << 31), std::string(op) + ": too many rows");
  dispatch_float(a.logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    XentParams<T> p{a.losses.data<float>(), a.dlogits.defined() ? a.dlogits.data<T>() : nullptr,
                    a.logits.data<T>(), a.targets.data<int32_t>(), N, Vp, a.V, a.dloss,
                    a.dloss_scale.defined() ? a.dloss_scale.data<float>() : nullptr};
    constexpr int E = sizeof(T), VW = vec_width(E);
    if (rows_vectorisable(a.logits.raw(), E, Vp, VW) &&
        rows_vectorisable(a.dlogits.defined() ? a.dlogits.raw() : nullptr, E, Vp, VW))
      cross_entropy_kernel<T, VW><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    else
      cross_entropy_kernel<T, 1><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
