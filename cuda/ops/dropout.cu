// Hidden dropout fused with the residual add on the GPU: the mask drawn per
// element from the same hash as the CPU backend (lib/ops/dropout_mask.h), so
// both backends drop exactly the same elements. 16-byte vectors per thread
// when C is a multiple of the width and the tensors are aligned (a vector
// then stays inside one row), else one element per thread.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T> struct DropoutParams {
  T* out;             // (B, T, C)
  const T* inp;       // (B, T, C)
  const T* residual;  // (B, T, C) or null
  int64_t T_, C, n;
  DropoutSpec d;
  uint32_t threshold;
  float scale;
  VecPlan pl;
};

template <class T>
__global__ void dropout_kernel(DropoutParams<T> p) {
  p.d = dropout_resolve(p.d);  // a per-step key in memory, read once
  constexpr int V = vec_width(sizeof(T));
  vec_loop<V>(
      p.pl,
      [&](int64_t i) {
        const int64_t r = i / p.C, c0 = i - r * p.C;
        const uint64_t row = dropout_hidden_row(p.d.stream, p.d.sample0 + r / p.T_, p.d.pos0 + r % p.T_);
        float v[V], res[V];
        load_f<V>(p.inp, i, v);
        if (p.residual) load_f<V>(p.residual, i, res);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          v[k] *= dropout_factor(row, c0 + k, p.threshold, p.scale);
          if (p.residual) v[k] += res[k];
        }
        store_f<V>(p.out, i, v);
      },
      [&](int64_t i) {
        const int64_t r = i / p.C, c = i - r * p.C;
        const uint64_t row = dropout_hidden_row(p.d.stream, p.d.sample0 + r / p.T_, p.d.pos0 + r % p.T_);
        float v = to_f(p.inp[i]) * dropout_factor(row, c, p.threshold, p.scale);
        if (p.residual) v += to_f(p.residual[i]);
        p.out[i] = from_f<T>(v);
      });
}

void run(const DropoutArgs& a, const Stream& s, const char* op, bool with_residual) {
  DS_CUDA_REQUIRE(a.out.dtype() == a.inp.dtype() && (!with_residual || a.residual.dtype() == a.inp.dtype()),
                  std::string(op) + ": dtypes differ: " + desc(a.out) + ", " + desc(a.inp) +
                      (with_residual ? ", " + desc(a.residual) : std::string()));
  const int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutParams<T> p{a.out.data<T>(), a.inp.data<T>(), with_residual ? a.residual.data<T>() : nullptr,
                       a.inp.size(1), a.inp.size(2), n, a.dropout, dropout_threshold(a.dropout.p),
                       dropout_scale(a.dropout.p), VecPlan{}};
    constexpr int E = sizeof(T), V = vec_width(E);
    const int64_t C = a.inp.size(2);
    p.pl.n = n;
    p.pl.width = V;
    if (rows_vectorisable(a.out.raw(), E, C, V) && rows_vectorisable(a.inp.raw(), E, C, V) &&
        rows_vectorisable(with_residual ? a.residual.raw() : nullptr, E, C, V))
      p.pl.nvec = n / V;
    dropout_kernel<T><<<grid_for_plan(p.pl, 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void dropout_forward(const DropoutArgs& a, const Stream& s) {
  run(a, s, "dropout_forward", a.residual.defined());
}

void dropout_backward(const DropoutArgs& a, const Stream& s) { run(a, s, "dropout_backward", false); }

}  // namespace ds::cuda
