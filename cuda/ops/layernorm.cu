// LayerNorm forward and backward.
// Forward: one warp per row, mean, centered variance and the output in three
// passes over the row (the re-reads hit L1); each lane moves V elements per
// access (16 bytes) when the row starts and the weight/bias are aligned and C
// is a multiple of V, else one (cuda/core/vec.cuh).
// Backward: one pass over x and dout per row (cuda/core/norm_bwd.cuh): one
// block per fixed chunk of rows writes dinp and its own partial dweight/dbias
// sums, which a second kernel adds in chunk order (no atomics). Rows longer
// than the one-pass kernel holds fall back to the column reduction (16-byte
// vectors when C and the pointers allow) plus a dinp kernel (two reads of
// the inputs).
#include "cuda/core/norm_bwd.cuh"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per 256-thread block

template <class T> struct LnFwdParams {
  T* out;          // (N, C)
  float* mean;     // (N) or null
  float* rstd;     // (N) or null
  const T* inp;    // (N, C)
  AnyPtr weight;   // (C)
  AnyPtr bias;     // (C) or null
  int64_t N, C;
  float eps;
};

// V elements per lane access (1: scalar path).
template <class T, int V>
__global__ void layernorm_forward_kernel(LnFwdParams<T> p) {
  int lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* x = p.inp + row * p.C;
  float s = 0.f;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float xv[V];
    load_f<V>(x, c, xv);
#pragma unroll
    for (int k = 0; k < V; ++k) s += xv[k];
  }
  float m = warp_sum(s) / float(p.C);
  float v = 0.f;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float xv[V];
    load_f<V>(x, c, xv);
#pragma unroll
    for (int k = 0; k < V; ++k) v += (xv[k] - m) * (xv[k] - m);
  }
  float rs = 1.0f / sqrtf(warp_sum(v) / float(p.C) + p.eps);
  T* o = p.out + row * p.C;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float xv[V], w[V], b[V];
    load_f<V>(x, c, xv);
    load_any<V>(p.weight, c, w);
    if (p.bias.p) load_any<V>(p.bias, c, b);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      xv[k] = (xv[k] - m) * rs * w[k];
      if (p.bias.p) xv[k] += b[k];
    }
    store_f<V>(o, c, xv);
  }
  if (lane == 0) {
    if (p.mean) p.mean[row] = m;
    if (p.rstd) p.rstd[row] = rs;
  }
}

template <class T> struct LnBwdParams {
  T* dinp;            // (N, C)
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  AnyPtr weight;      // (C)
  const float* mean;  // (N)
  const float* rstd;  // (N)
  int64_t N, C;
  bool add;           // dinp += instead of =
};

// Fallback dinp kernel (rows too long for the one-pass kernel): one warp per row.
template <class T>
__global__ void layernorm_backward_kernel(LnBwdParams<T> p) {
  int lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* x = p.inp + row * p.C;
  const T* g = p.dout + row * p.C;
  float m = p.mean[row], rs = p.rstd[row];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t c = lane; c < p.C; c += 32) {
    float dn = to_f(g[c]) * load(p.weight, c);
    s1 += dn;
    s2 += dn * (to_f(x[c]) - m) * rs;
  }
  s1 = warp_sum(s1) / float(p.C);
  s2 = warp_sum(s2) / float(p.C);
  T* d = p.dinp + row * p.C;
  for (int64_t c = lane; c < p.C; c += 32) {
    float xhat = (to_f(x[c]) - m) * rs;
    float dn = to_f(g[c]) * load(p.weight, c);
    float v = (dn - s1 - xhat * s2) * rs;
    if (p.add) v += to_f(d[c]);
    d[c] = from_f<T>(v);
  }
}

// The column-reduction functor (cuda/core/reduce.cuh) of the two-pass
// backward: v[0] = dout * xhat (for dweight), v[1] = dout (for dbias).
template <class T> struct LnParamGrad {
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  const float* mean;  // (N)
  const float* rstd;  // (N)
  int64_t C;
  static constexpr int kVW = vec_width(sizeof(T));
  bool vectorisable() const {
    return rows_vectorisable(dout, sizeof(T), C, kVW) && rows_vectorisable(inp, sizeof(T), C, kVW);
  }
  template <int V> __device__ void operator()(int64_t n, int64_t c, float (&v)[2][V]) const {
    float g[V], x[V];
    load_f<V>(dout + n * C, c, g);
    load_f<V>(inp + n * C, c, x);
    const float m = mean[n], rs = rstd[n];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      v[0][j] = g[j] * (x[j] - m) * rs;
      v[1][j] = g[j];
    }
  }
};

template <class T> bool ln_rows_vec(const LayerNormArgs& a, int64_t C) {
  constexpr int V = vec_width(sizeof(T));
  return rows_vectorisable(a.inp.raw(), sizeof(T), C, V) &&
         rows_vectorisable(a.out.raw(), sizeof(T), C, V) &&
         rows_vectorisable(a.weight.raw(), int(dtype_size(a.weight.dtype())), C, V) &&
         (!a.bias.defined() || rows_vectorisable(a.bias.raw(), int(dtype_size(a.bias.dtype())), C, V));
}

}  // namespace

void layernorm_forward(const LayerNormArgs& a, const Stream& s) {
  const char* op = "layernorm_forward";
  int64_t C = a.inp.size(-1), N = C ? a.inp.numel() / C : 0;
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  if (N == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    LnFwdParams<T> p{a.out.data<T>(), a.mean.data<float>(), a.rstd.data<float>(),
                     a.inp.data<T>(), any_ptr(a.weight), any_ptr(a.bias), N, C, a.eps};
    const unsigned grid = grid_for(N, kRowsPerBlock, (1ll << 31) - 1);
    if (ln_rows_vec<T>(a, C))
      layernorm_forward_kernel<T, vec_width(sizeof(T))>
          <<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
    else
      layernorm_forward_kernel<T, 1><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void layernorm_backward(const LayerNormBwdArgs& a, const Stream& s) {
  const char* op = "layernorm_backward";
  const NormRows r = check_norm_backward(a.inp, a.dout, a.dinp, a.dweight, op);
  const int64_t N = r.N, C = r.C;
  if (a.dbias.defined()) expect_grad(a.dbias, a.inp.dtype(), op, "dbias");
  if (N == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    NormBwd<T> nb{a.dinp.defined() ? a.dinp.data<T>() : nullptr, a.dout.data<T>(), a.inp.data<T>(),
                  any_ptr(a.weight), a.mean.data<float>(), a.rstd.data<float>(),
                  any_ptr(a.dweight), any_ptr(a.dbias), N, C, a.accum == Accum::Add};
    if (norm_backward_one_pass<T, NormKind::LayerNorm>(nb, s)) return;
    // Parameter gradients first: dinp may alias dout.
    if (a.dweight.defined() || a.dbias.defined()) {
      LnParamGrad<T> f{a.dout.data<T>(), a.inp.data<T>(), a.mean.data<float>(),
                       a.rstd.data<float>(), C};
      ColumnOut<2> out{{any_ptr(a.dweight), any_ptr(a.dbias)}};
      column_reduce<2>(f, N, C, out, s);
    }
    if (a.dinp.defined()) {
      LnBwdParams<T> p{a.dinp.data<T>(), a.dout.data<T>(), a.inp.data<T>(), any_ptr(a.weight),
                       a.mean.data<float>(), a.rstd.data<float>(), N, C,
                       a.accum == Accum::Add};
      layernorm_backward_kernel<T><<<grid_for(N, kRowsPerBlock, (1ll << 31) - 1), 32 * kRowsPerBlock,
                                     0, stream_of(s)>>>(p);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::cuda
