// SwiGLU forward and backward: inp row = [gate (F) | up (F)],
// out = silu(gate) * up. Elementwise over (N, F); vectorised (16 bytes per
// array per thread) when F is a multiple of the vector width and the bases
// are aligned (then every gate/up segment is), else one element per thread.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

__device__ __forceinline__ float silu_mul(float g, float u) {
  float sg = 1.0f / (1.0f + expf(-g));
  return g * sg * u;
}
// d/dgate and d/dup of silu(g) * u, times d.
__device__ __forceinline__ void silu_mul_grad(float g, float u, float d, float& dg, float& du) {
  float sg = 1.0f / (1.0f + expf(-g));
  float dsilu = sg * (1.0f + g * (1.0f - sg));
  dg = d * u * dsilu;
  du = d * g * sg;
}

// The plan runs over the N*F outputs; i -> (row n, column f).
template <class T>
__global__ void swiglu_forward_kernel(T* out /* (N, F) */, const T* inp /* (N, 2F) */,
                                      int64_t F, VecPlan pl) {
  constexpr int V = vec_width(sizeof(T));
  vec_loop<V>(
      pl,
      [&](int64_t i) {
        int64_t n = i / F, f = i - n * F;
        float g[V], u[V];
        load_f<V>(inp, n * 2 * F + f, g);
        load_f<V>(inp, n * 2 * F + F + f, u);
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = silu_mul(g[k], u[k]);
        store_f<V>(out, i, g);
      },
      [&](int64_t i) {
        int64_t n = i / F, f = i - n * F;
        out[i] = from_f<T>(silu_mul(to_f(inp[n * 2 * F + f]), to_f(inp[n * 2 * F + F + f])));
      });
}

template <class T>
__global__ void swiglu_backward_kernel(T* dinp /* (N, 2F) */, const T* dout /* (N, F) */,
                                       const T* inp /* (N, 2F) */, int64_t F, VecPlan pl) {
  constexpr int V = vec_width(sizeof(T));
  // Read everything before writing: dinp may alias inp.
  vec_loop<V>(
      pl,
      [&](int64_t i) {
        int64_t n = i / F, f = i - n * F;
        float g[V], u[V], d[V], dg[V], du[V];
        load_f<V>(inp, n * 2 * F + f, g);
        load_f<V>(inp, n * 2 * F + F + f, u);
        load_f<V>(dout, i, d);
#pragma unroll
        for (int k = 0; k < V; ++k) silu_mul_grad(g[k], u[k], d[k], dg[k], du[k]);
        store_f<V>(dinp, n * 2 * F + f, dg);
        store_f<V>(dinp, n * 2 * F + F + f, du);
      },
      [&](int64_t i) {
        int64_t n = i / F, f = i - n * F;
        float dg, du;
        silu_mul_grad(to_f(inp[n * 2 * F + f]), to_f(inp[n * 2 * F + F + f]), to_f(dout[i]), dg, du);
        dinp[n * 2 * F + f] = from_f<T>(dg);
        dinp[n * 2 * F + F + f] = from_f<T>(du);
      });
}

// Whole-vector plan when every row segment is aligned, else all scalar.
VecPlan row_plan(int64_t N, int64_t F, int V, int E, std::initializer_list<const void*> ptrs) {
  VecPlan pl;
  pl.n = N * F;
  pl.width = V;
  bool ok = true;
  for (const void* p : ptrs) ok = ok && rows_vectorisable(p, E, F, V);
  if (ok) pl.nvec = N * F / V;
  return pl;
}

}  // namespace

void swiglu_forward(const SwigluArgs& a, const Stream& s) {
  const char* op = "swiglu_forward";
  int64_t F2 = a.inp.size(-1), N = F2 ? a.inp.numel() / F2 : 0, F = F2 / 2;
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  if (N * F == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = row_plan(N, F, vec_width(E), E, {a.out.raw(), a.inp.raw()});
    swiglu_forward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), F, pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward(const SwigluBwdArgs& a, const Stream& s) {
  const char* op = "swiglu_backward";
  int64_t F2 = a.inp.size(-1), N = F2 ? a.inp.numel() / F2 : 0, F = F2 / 2;
  expect_compute(a.dinp, a.inp.dtype(), op, "dinp", "inp");
  expect_compute(a.dout, a.inp.dtype(), op, "dout", "inp");
  if (N * F == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = row_plan(N, F, vec_width(E), E, {a.dinp.raw(), a.dout.raw(), a.inp.raw()});
    swiglu_backward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(
        a.dinp.data<T>(), a.dout.data<T>(), a.inp.data<T>(), F, pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
