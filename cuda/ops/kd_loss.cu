// Knowledge distillation loss (lib/ops/op_args.h, KdLossArgs), one block per
// row: pass 1 keeps a running (max, sum of exp) of the scaled student and
// teacher rows per thread and merges them into the two log-sum-exps; pass 2
// adds up KL(p_t || p_s) and writes dscale * (p_s - p_t). Every read of the
// teacher row in pass 2 precedes the write of the same element by the same
// thread, so dlogits may alias it. Columns >= V are padding (gradient 0).
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 512;

template <class T> struct KdParams {
  float* losses;      // (N)
  T* dlogits;         // (N, Vp) or null; may alias teacher
  const T* logits;    // (N, Vp)
  const T* teacher;   // (N, Vp)
  int64_t Vp, V;
  float inv_temp, dscale;
};

// The running (max, sum of exp(v - max)) of one thread, with v = -inf adding 0.
__device__ __forceinline__ void online_add(float v, float& m, float& s) {
  if (v == -INFINITY) return;
  if (v > m) {
    s = s * expf(m - v) + 1.0f;
    m = v;
  } else {
    s += expf(v - m);
  }
}

__device__ __forceinline__ float block_lse(float m, float s) {
  const float M = block_max(m);
  const float S = block_sum(m == -INFINITY ? 0.f : s * expf(m - M));
  return M + logf(S);
}

template <class T>
__global__ void kd_loss_kernel(KdParams<T> p) {
  const int64_t row = blockIdx.x;
  const T* xs = p.logits + row * p.Vp;
  const T* xt = p.teacher + row * p.Vp;
  float ms = -INFINITY, ss = 0.f, mt = -INFINITY, st = 0.f;
  for (int64_t c = threadIdx.x; c < p.V; c += kThreads) {
    online_add(to_f(xs[c]) * p.inv_temp, ms, ss);
    online_add(to_f(xt[c]) * p.inv_temp, mt, st);
  }
  const float lse_s = block_lse(ms, ss);
  const float lse_t = block_lse(mt, st);
  float kl = 0.f;
  T* d = p.dlogits ? p.dlogits + row * p.Vp : nullptr;
  for (int64_t c = threadIdx.x; c < p.Vp; c += kThreads) {
    if (c >= p.V) {
      if (d) d[c] = from_f<T>(0.f);
      continue;
    }
    const float lt = to_f(xt[c]) * p.inv_temp - lse_t, ls = to_f(xs[c]) * p.inv_temp - lse_s;
    const float pt = expf(lt);
    if (pt > 0.f) kl += pt * (lt - ls);
    if (d) d[c] = from_f<T>(p.dscale * (expf(ls) - pt));
  }
  kl = block_sum(kl);
  if (threadIdx.x == 0) p.losses[row] = kl;
}

}  // namespace

void kd_loss(const KdLossArgs& a, const Stream& s) {
  const char* op = "kd_loss";
  const int64_t Vp = a.logits.size(-1), N = Vp ? a.logits.numel() / Vp : 0;
  expect_compute(a.teacher, a.logits.dtype(), op, "teacher", "logits");
  if (a.dlogits.defined()) expect_compute(a.dlogits, a.logits.dtype(), op, "dlogits", "logits");
  if (N == 0) return;
  DS_CUDA_REQUIRE(N < (int64_t(1) << 31), std::string(op) + ": too many rows");
  dispatch_float(a.logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    KdParams<T> p{a.losses.data<float>(), a.dlogits.defined() ? a.dlogits.data<T>() : nullptr, a.logits.data<T>(),
                  a.teacher.data<T>(), Vp, a.V, 1.0f / a.temp, a.dscale};
    kd_loss_kernel<T><<<unsigned(N), kThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
