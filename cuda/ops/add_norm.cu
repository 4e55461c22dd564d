// Residual add fused with the following LayerNorm/RMSNorm (AddNormArgs):
// one warp per row reads a and b once, writes sum = a + b rounded to the
// activation dtype, and normalises that rounded sum (what add then norm
// would read). The statistics and output passes re-read sum from L1, not
// a and b from DRAM: 2 reads + 2 writes of (N, C) instead of 3 + 2 (plus the
// norm's re-read). Lane partition and arithmetic are those of the
// layernorm / rmsnorm forward kernels, chosen by the same test (sum, out,
// weight, bias aligned and C a multiple of the width: V elements per lane
// access, else one), so out, mean and rstd are bit-identical to add then the
// norm on the GPU too (a full recompute re-runs a fused norm1 unfused).
// When only a or b is misaligned, they are read element by element within
// the same partition.
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

// V elements of a or b: one vector, or V scalar loads when misaligned.
template <int V, bool kVec, class T> __device__ __forceinline__ void load_ab(const T* p, int64_t c, float (&x)[V]) {
  if (kVec) {
    load_f<V>(p, c, x);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = to_f(p[c + k]);
  }
}

template <class T, int V, bool kLn, bool kVecAB>
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
    load_ab<V, kVecAB>(a, c, x);
    load_ab<V, kVecAB>(b, c, y);
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

// vec: the norm kernels' test on sum, out, weight, bias; vec_ab: a and b too.
template <class T, bool kLn>
void launch(const AddNormParams<T>& p, bool vec, bool vec_ab, const Stream& s) {
  constexpr int W = vec_width(sizeof(T));
  const unsigned grid = grid_for(p.N, kRowsPerBlock, (1ll << 31) - 1);
  if (vec && vec_ab)
    add_norm_kernel<T, W, kLn, true><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
  else if (vec)
    add_norm_kernel<T, W, kLn, false><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
  else
    add_norm_kernel<T, 1, kLn, true><<<grid, 32 * kRowsPerBlock, 0, stream_of(s)>>>(p);
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
                     rows_vectorisable(a.weight.raw(), int(dtype_size(a.weight.dtype())), C, V) &&
                     (!a.bias.defined() || rows_vectorisable(a.bias.raw(), int(dtype_size(a.bias.dtype())), C, V));
    const bool vec_ab = rows_vectorisable(a.a.raw(), E, C, V) && rows_vectorisable(a.b.raw(), E, C, V);
    if (a.norm == NormType::RMSNorm) launch<T, false>(p, vec, vec_ab, s);
    else launch<T, true>(p, vec, vec_ab, s);
  });
}

}  // namespace ds::cuda
