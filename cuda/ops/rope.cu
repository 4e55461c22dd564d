// Rotary position embedding on the q and k parts of a packed qkv buffer (NH
// query heads, NKV key heads), rotate-half convention within the first R
// rotated dims of each head (pairs j and j + R/2; R = HS unless partial).
// Backward is the inverse rotation. One thread per (token, V consecutive
// pairs): the V angles are computed once in double (positions reach many
// thousands of radians) and applied to every q/k head; elements j..j+V-1 and
// j+R/2..j+R/2+V-1 move as 16-byte vectors when R/2 and HS are multiples of
// V and both buffers are aligned, else V = 1. The dims >= R and v are copied
// (same vectors) when out does not alias inp. Both paths do the same per-pair
// arithmetic, so the result does not depend on which one ran.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

enum class RopeDir { Forward, Inverse };

template <class T> struct RopeParams {
  T* out;          // (B, T, (NH+2*NKV)*HS)
  const T* inp;    // (B, T, (NH+2*NKV)*HS)
  int64_t rows;    // B*T
  int64_t T_;      // sequence length
  int NH, NKV, HS, R;  // R: rotated dims per head (even, <= HS)
  int64_t pos_offset;
  double log_theta;
  RopeDir dir;
  bool copy_rest;  // out does not alias inp: copy the unrotated dims and v
};

// One pair's rotation with explicit roundings, so every instantiation (V = 1
// or a vector width) computes the same bits whatever the compiler contracts.
__device__ __forceinline__ void rotate_pair(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
  y2 = __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

template <class T, int V>
__global__ void rope_kernel(RopeParams<T> p) {
  const int half = p.R / 2, chunks = half / V;
  const int64_t total = p.rows * chunks;
  const int64_t width = int64_t(p.NH + 2 * p.NKV) * p.HS;
  const int nqk = p.NH + p.NKV;  // q heads then k heads
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks;
    const int j = int(i - row * chunks) * V;
    const double pos = double(row % p.T_ + p.pos_offset);
    float c[V], s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const double freq = exp(-2.0 * (j + k) / p.R * p.log_theta);
      double sd, cd;
      sincos(pos * freq, &sd, &cd);
      c[k] = float(cd);
      s[k] = p.dir == RopeDir::Forward ? float(sd) : -float(sd);
    }
    const T* x = p.inp + row * width;
    T* o = p.out + row * width;
    for (int h = 0; h < nqk; ++h) {
      const int64_t b = int64_t(h) * p.HS + j;
      float x1[V], x2[V], y1[V], y2[V];
      load_f<V>(x, b, x1);
      load_f<V>(x, b + half, x2);
#pragma unroll
      for (int k = 0; k < V; ++k) rotate_pair(x1[k], x2[k], c[k], s[k], y1[k], y2[k]);
      store_f<V>(o, b, y1);
      store_f<V>(o, b + half, y2);
    }
    if (!p.copy_rest) continue;
    // This thread's share of what is copied: dims R + j, R + j + half, ... of
    // every q/k head, and v dims j, j + half, ... of every kv head.
    for (int h = 0; h < nqk; ++h)
      for (int d = p.R + j; d < p.HS; d += half) store_vec<V>(o, int64_t(h) * p.HS + d, load_vec<V>(x, int64_t(h) * p.HS + d));
    for (int64_t e = int64_t(nqk) * p.HS + j; e < width; e += half) store_vec<V>(o, e, load_vec<V>(x, e));
  }
}

void rope_launch(const RopeArgs& a, const Stream& s, RopeDir dir, const char* op) {
  int64_t Bn = a.inp.size(0), Tn = a.inp.size(1);
  const int NKV = a.NKV == 0 ? a.NH : a.NKV;
  const int HS = int(a.inp.size(2) / (a.NH + 2 * NKV)), R = a.rot_dims == 0 ? HS : a.rot_dims;
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  int64_t rows = Bn * Tn;
  if (rows == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = vec_width(sizeof(T));
    RopeParams<T> p{a.out.data<T>(), a.inp.data<T>(), rows, Tn, a.NH, NKV, HS, R, a.pos_offset,
                    std::log(double(a.theta)), dir, a.out.raw() != a.inp.raw()};
    // Rows (HS * heads long) start aligned when the base is and HS % W == 0.
    const bool vec = (R / 2) % W == 0 && rows_vectorisable(a.inp.raw(), sizeof(T), HS, W) &&
                     rows_vectorisable(a.out.raw(), sizeof(T), HS, W);
    if (vec)
      rope_kernel<T, W><<<grid_for(rows * (R / 2 / W), 256), 256, 0, stream_of(s)>>>(p);
    else
      rope_kernel<T, 1><<<grid_for(rows * (R / 2), 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_forward(const RopeArgs& a, const Stream& s) {
  rope_launch(a, s, RopeDir::Forward, "rope_forward");
}
void rope_backward(const RopeArgs& a, const Stream& s) {
  rope_launch(a, s, RopeDir::Inverse, "rope_backward");
}

}  // namespace ds::cuda
