// RMSNorm forward and backward (LLaMA style: y = x * rstd * w, no mean, no
// bias). Forward: one warp per row, 16-byte vectors per lane when the rows and
// the weight are aligned and C is a multiple of the width (cuda/core/vec.cuh).
// Backward: the one-pass kernel of cuda/core/norm_bwd.cuh (dinp and per-chunk
// weight-gradient partials, then an in-order sum); rows too long for it use
// the column reduction (16-byte vectors when C and the pointers allow) plus
// a dinp kernel.
#include "cuda/core/norm_bwd.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

template <class T> struct RmsFwdParams {
  T* out;         // (N, C)
  float* rstd;    // (N) or null
  const T* inp;   // (N, C)
  AnyPtr weight;  // (C)
  int64_t N, C;
  float eps;
};

// V elements per lane access (1: scalar path).
template <class T, int V>
__global__ void rmsnorm_forward_kernel(RmsFwdParams<T> p) {
  int lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* x = p.inp + row * p.C;
  float ss = 0.f;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float xv[V];
    load_f<V>(x, c, xv);
#pragma unroll
    for (int k = 0; k < V; ++k) ss += xv[k] * xv[k];
  }
  float rs = 1.0f / sqrtf(warp_sum(ss) / float(p.C) + p.eps);
  T* o = p.out + row * p.C;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float xv[V], w[V];
    load_f<V>(x, c, xv);
    load_any<V>(p.weight, c, w);
#pragma unroll
    for (int k = 0; k < V; ++k) xv[k] = xv[k] * rs * w[k];
    store_f<V>(o, c, xv);
  }
  if (lane == 0 && p.rstd) p.rstd[row] = rs;
}

template <class T> struct RmsBwdParams {
  T* dinp;            // (N, C)
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  AnyPtr weight;      // (C)
  const float* rstd;  // (N)
  int64_t N, C;
  bool add;
};

template <class T>
__global__ void rmsnorm_backward_kernel(RmsBwdParams<T> p) {
  int lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* x = p.inp + row * p.C;
  const T* g = p.dout + row * p.C;
  float rs = p.rstd[row];
  float s = 0.f;
  for (int64_t c = lane; c < p.C; c += 32) s += to_f(g[c]) * load(p.weight, c) * to_f(x[c]) * rs;
  s = warp_sum(s) / float(p.C);
  T* d = p.dinp + row * p.C;
  for (int64_t c = lane; c < p.C; c += 32) {
    float xhat = to_f(x[c]) * rs;
    float v = (to_f(g[c]) * load(p.weight, c) - xhat * s) * rs;
    if (p.add) v += to_f(d[c]);
    d[c] = from_f<T>(v);
  }
}

// The column-reduction functor of dweight (cuda/core/reduce.cuh): v = dout * x * rstd.
template <class T> struct RmsWeightGrad {
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  const float* rstd;  // (N)
  int64_t C;
  static constexpr int kVW = vec_width(sizeof(T));
  bool vectorisable() const {
    return rows_vectorisable(dout, sizeof(T), C, kVW) && rows_vectorisable(inp, sizeof(T), C, kVW);
  }
  template <int V> __device__ void operator()(int64_t n, int64_t c, float (&v)[1][V]) const {
    float g[V], x[V];
    load_f<V>(dout + n * C, c, g);
    load_f<V>(inp + n * C, c, x);
    const float rs = rstd[n];
#pragma unroll
    for (int j = 0; j < V; ++j) v[0][j] = g[j] * x[j] * rs;
  }
};

}  // namespace

void rmsnorm_forward(const RMSNormArgs& a, const Stream& s) {
  const char* op = "rmsnorm_forward";
  int64_t C = a.inp.size(-1), N = C ? a.inp.numel() / C : 0;
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  if (N == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    RmsFwdParams<T> p{a.out.data<T>(), a.rstd.data<float>(), a.inp.data<T>(), any_ptr(a.weight),
                      N, C, a.eps};
    constexpr int V = vec_width(sizeof(T));
    const unsigned grid = grid_for(N, kRowsPerBlock, (1ll << 31) - 1);
    if (rows_vectorisable(a.inp.raw(), sizeof(T), C, V) && rows_vectorisable(a.out.raw(), sizeof(T), C, V) &&
        rows_vectorisable(a.weight.raw(), int(dtype_size(a.weight.dtype())), C, V))
      rmsnorm_forward_kernel<T, V><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
    else
      rmsnorm_forward_kernel<T, 1><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward(const RMSNormBwdArgs& a, const Stream& s) {
  const char* op = "rmsnorm_backward";
  const NormRows r = check_norm_backward(a.inp, a.dout, a.dinp, a.dweight, op);
  const int64_t N = r.N, C = r.C;
  if (N == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    NormBwd<T> nb{a.dinp.defined() ? a.dinp.data<T>() : nullptr, a.dout.data<T>(), a.inp.data<T>(),
                  any_ptr(a.weight), nullptr, a.rstd.data<float>(), any_ptr(a.dweight), AnyPtr{},
                  N, C, a.accum == Accum::Add};
    if (norm_backward_one_pass<T, NormKind::RMSNorm>(nb, s)) return;
    // Weight gradient first: dinp may alias dout.
    if (a.dweight.defined()) {
      RmsWeightGrad<T> f{a.dout.data<T>(), a.inp.data<T>(), a.rstd.data<float>(), C};
      column_reduce<1>(f, N, C, ColumnOut<1>{{any_ptr(a.dweight)}}, s);
    }
    if (a.dinp.defined()) {
      RmsBwdParams<T> p{a.dinp.data<T>(), a.dout.data<T>(), a.inp.data<T>(), any_ptr(a.weight),
                        a.rstd.data<float>(), N, C, a.accum == Accum::Add};
      rmsnorm_backward_kernel<T><<<grid_for(N, kRowsPerBlock, (1ll << 31) - 1), 32 * kRowsPerBlock, 0,
                                   stream_of(s)>>>(p);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::cuda
