// Residual add fused with the following LayerNorm/RMSNorm (AddNormArgs):
// one warp per row reads a and b once, writes sum = a + b rounded to the
// activation dtype, and normalises that rounded sum (what add then norm
// would read). The statistics and output passes re-read sum from L1, not
// a and b from DRAM: 2 reads + 2 writes of (N, C) instead of 3 + 2 (plus the
// norm's re-read). 16-byte vectors per lane when every row and the weight /
// bias are aligned and C is a multiple of the width, else one element.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

template <class T> struct AddNormParams {
  T* sum;          // (N, C); may alias a or b
  T* out;          // (N, C)
  float* mean;     // (N) or null
  float* rstd;     // (N) or null
  const T* a;      // (N, C)
  const T* b;      // (N, C)
  AnyPtr weight;   // (C)
  AnyPtr bias;     // (C) or null
  int64_t N, C;
  float eps;
};

template <class T, int V, bool kLn>
__global__ void add_norm_kernel(AddNormParams<T> p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.N) return;
  const T* a = p.a + row * p.C;
  const T* b = p.b + row * p.C;
  T* sm = p.sum + row * p.C;
  // Pass 1: sum (rounded as stored), its row sum (LayerNorm) or sum of
  // squares (RMSNorm). Each lane reads a and b before writing the same
  // elements of sum, so aliasing is safe.
  float acc = 0.f;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float x[V], y[V];
    load_f<V>(a, c, x);
    load_f<V>(b, c, y);
    Packed<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      r.v[k] = from_f<T>(x[k] + y[k]);
      const float v = to_f(r.v[k]);
      acc += kLn ? v : v * v;
    }
    store_vec<V>(sm, c, r);
  }
  float m = 0.f, rs;
  if (kLn) {
    m = warp_sum(acc) / float(p.C);
    float var = 0.f;
    for (int64_t c = lane * V; c < p.C; c += 32 * V) {
      float x[V];
      load_f<V>(sm, c, x);
#pragma unroll
      for (int k = 0; k < V; ++k) var += (x[k] - m) * (x[k] - m);
    }
    rs = 1.0f / sqrtf(warp_sum(var) / float(p.C) + p.eps);
  } else {
    rs = 1.0f / sqrtf(warp_sum(acc) / float(p.C) + p.eps);
  }
  T* o = p.out + row * p.C;
  for (int64_t c = lane * V; c < p.C; c += 32 * V) {
    float x[V], w[V], bi[V];
    load_f<V>(sm, c, x);
    load_any<V>(p.weight, c, w);
    if (kLn && p.bias.p) load_any<V>(p.bias, c, bi);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (kLn) {
        x[k] = (x[k] - m) * rs * w[k];
        if (p.bias.p) x[k] += bi[k];
      } else {
        x[k] = x[k] * rs * w[k];
      }
    }
    store_f<V>(o, c, x);
  }
  if (lane == 0) {
    if (p.mean) p.mean[row] = m;
    if (p.rstd) p.rstd[row] = rs;
  }
}

template <class T, bool kLn>
void launch(const AddNormParams<T>& p, bool vec, const Stream& s) {
  const unsigned grid = grid_for(p.N, kRowsPerBlock, 1ll << 31);
  if (vec)
    add_norm_kernel<T, vec_width(sizeof(T)), kLn><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
  else
    add_norm_kernel<T, 1, kLn><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_norm_forward(const AddNormArgs& a, const Stream& s) {
  const char* op = "add_norm_forward";
  const int64_t C = a.sum.size(-1), N = C ? a.sum.numel() / C : 0;
  expect_compute(a.out, a.sum.dtype(), op, "out", "sum");
  expect_compute(a.a, a.sum.dtype(), op, "a", "sum");
  expect_compute(a.b, a.sum.dtype(), op, "b", "sum");
  expect_grad(a.weight, a.sum.dtype(), op, "weight");
  if (a.bias.defined()) expect_grad(a.bias, a.sum.dtype(), op, "bias");
  DS_CUDA_REQUIRE(!a.mean.defined() || a.mean.dtype() == DType::F32, std::string(op) + ": mean must be f32");
  DS_CUDA_REQUIRE(!a.rstd.defined() || a.rstd.dtype() == DType::F32, std::string(op) + ": rstd must be f32");
  if (N == 0) return;
  dispatch_float(a.sum.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T), V = vec_width(E);
    AddNormParams<T> p{a.sum.data<T>(), a.out.data<T>(), a.mean.data<float>(), a.rstd.data<float>(),
                       a.a.data<T>(), a.b.data<T>(), any_ptr(a.weight), any_ptr(a.bias), N, C, a.eps};
    const bool vec = rows_vectorisable(a.sum.raw(), E, C, V) && rows_vectorisable(a.out.raw(), E, C, V) &&
                     rows_vectorisable(a.a.raw(), E, C, V) && rows_vectorisable(a.b.raw(), E, C, V) &&
                     rows_vectorisable(a.weight.raw(), int(dtype_size(a.weight.dtype())), C, V) &&
                     (!a.bias.defined() || rows_vectorisable(a.bias.raw(), int(dtype_size(a.bias.dtype())), C, V));
    if (a.norm == NormType::RMSNorm) launch<T, false>(p, vec, s);
    else launch<T, true>(p, vec, s);
  });
}

}  // namespace ds::cuda
