// LayerNorm forward and backward. One warp per row: mean, centered variance
// and the output in three passes over the row (re-reads hit L1/L2). Weight and
// bias gradients use the deterministic column reduction.
#include "cuda/core/reduce.cuh"
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

template <class T>
__global__ void layernorm_forward_kernel(LnFwdParams<T> p) {
  int lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* x = p.inp + row * p.C;
  float s = 0.f;
  for (int64_t c = lane; c < p.C; c += 32) s += to_f(x[c]);
  float m = warp_sum(s) / float(p.C);
  float v = 0.f;
  for (int64_t c = lane; c < p.C; c += 32) {
    float d = to_f(x[c]) - m;
    v += d * d;
  }
  float rs = 1.0f / sqrtf(warp_sum(v) / float(p.C) + p.eps);
  T* o = p.out + row * p.C;
  for (int64_t c = lane; c < p.C; c += 32) {
    float y = (to_f(x[c]) - m) * rs * load(p.weight, c);
    if (p.bias.p) y += load(p.bias, c);
    o[c] = from_f<T>(y);
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

// v[0] = dout * xhat (for dweight), v[1] = dout (for dbias).
template <class T> struct LnParamGrad {
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  const float* mean;  // (N)
  const float* rstd;  // (N)
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[2]) const {
    float g = to_f(dout[n * C + c]);
    v[0] = g * (to_f(inp[n * C + c]) - mean[n]) * rstd[n];
    v[1] = g;
  }
};

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
    layernorm_forward_kernel<T><<<grid_for(N, kRowsPerBlock, 1ll << 31), 32 * kRowsPerBlock, 0,
                                  stream_of(s)>>>(p);
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
      layernorm_backward_kernel<T><<<grid_for(N, kRowsPerBlock, 1ll << 31), 32 * kRowsPerBlock,
                                     0, stream_of(s)>>>(p);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::cuda
