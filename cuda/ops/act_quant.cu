// act_quantize on the GPU (lib/ops/op_args.h, ActQuantArgs), with the CPU
// version's arithmetic: each elementwise step rounded to x's dtype, the
// static range, scale and zero point computed in f32 and rounded to it. Static: one block folds the tensor's
// extremes into the running range (no host read), then a grid quantizes.
// Dynamic: one block per row.
#include <cmath>

#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;

struct MinOp {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};

template <class T> __device__ __forceinline__ float rnd(float v) { return to_f(from_f<T>(v)); }

template <class T>
__global__ void fold_range_kernel(const T* x, int64_t n, float* range, float m, float c) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f(x[i]);
    lo = fminf(lo, v), hi = fmaxf(hi, v);
  }
  lo = block_reduce(lo, INFINITY, MinOp{});
  hi = block_reduce(hi, -INFINITY, MaxOp{});
  if (threadIdx.x != 0) return;
  float r0 = range[0], r1 = range[1];
  if (r0 == r1) r0 = lo, r1 = hi;
  const float cd = rnd<T>(c);  // the Python float converted to x's dtype, as PyTorch does
  range[0] = __fadd_rn(__fmul_rn(r0, m), rnd<T>(__fmul_rn(lo, cd)));
  range[1] = __fadd_rn(__fmul_rn(r1, m), rnd<T>(__fmul_rn(hi, cd)));
}

template <class T>
__global__ void quantize_static_kernel(T* x, int64_t n, const float* range, float q, bool sym) {
  const float lo = range[0], hi = range[1];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = to_f(x[i]);
    if (sym) {
      const float scale = rnd<T>(__fdiv_rn(2.f * fmaxf(fabsf(lo), hi), q));
      const float t = fminf(fmaxf(rintf(rnd<T>(__fdiv_rn(v, scale))), -q / 2), q / 2 - 1);
      x[i] = from_f<T>(__fmul_rn(t, scale));
    } else {
      const float scale32 = __fdiv_rn(hi - lo, q);
      const float scale = rnd<T>(scale32), zp = rnd<T>(__fmul_rn(rintf(__fdiv_rn(lo, scale32)), scale32));
      const float t = fminf(fmaxf(rintf(rnd<T>(__fdiv_rn(rnd<T>(v - zp), scale))), 0.f), q - 1);
      x[i] = from_f<T>(rnd<T>(__fmul_rn(t, scale)) + zp);
    }
  }
}

template <class T>
__global__ void quantize_rows_kernel(T* x, int64_t C, float q, bool sym) {
  T* row = x + blockIdx.x * C;
  float lo = INFINITY, hi = -INFINITY, amax = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f(row[c]);
    lo = fminf(lo, v), hi = fmaxf(hi, v), amax = fmaxf(amax, fabsf(v));
  }
  lo = block_reduce(lo, INFINITY, MinOp{});
  hi = block_reduce(hi, -INFINITY, MaxOp{});
  amax = block_max(amax);
  if (sym) {
    const float scale = rnd<T>(__fdiv_rn(rnd<T>(2.f * amax), q));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float t = fminf(fmaxf(rintf(rnd<T>(__fdiv_rn(to_f(row[c]), scale))), -q / 2), q / 2 - 1);
      row[c] = from_f<T>(__fmul_rn(t, scale));
    }
    return;
  }
  const float scale = rnd<T>(__fdiv_rn(rnd<T>(hi - lo), q));
  const float zp = rnd<T>(__fmul_rn(rintf(rnd<T>(__fdiv_rn(lo, scale))), scale));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float t = fminf(fmaxf(rintf(rnd<T>(__fdiv_rn(rnd<T>(to_f(row[c]) - zp), scale))), 0.f), q - 1);
    row[c] = from_f<T>(rnd<T>(__fmul_rn(t, scale)) + zp);
  }
}

}  // namespace

void act_quantize(const ActQuantArgs& a, const Stream& s) {
  const char* op = "act_quantize";
  const int64_t n = a.x.numel();
  if (n == 0) return;
  DS_CUDA_REQUIRE(!a.range.defined() || (a.range.dtype() == DType::F32 && a.range.numel() == 2),
                  std::string(op) + ": the range must be a (2) f32 tensor, got " + desc(a.range));
  const float q = static_cast<float>(int64_t{1} << a.bits);
  cudaStream_t st = stream_of(s);
  dispatch_float(a.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* x = a.x.data<T>();
    if (!a.range.defined()) {
      const int64_t C = a.x.size(a.x.dim() - 1);
      quantize_rows_kernel<T><<<static_cast<unsigned>(n / C), kThreads, 0, st>>>(x, C, q, a.symmetric);
      DS_CUDA_CHECK_LAUNCH();
      return;
    }
    float* range = a.range.data<float>();
    if (a.update) {
      fold_range_kernel<T><<<1, 1024, 0, st>>>(x, n, range, static_cast<float>(a.momentum),
                                              static_cast<float>(1.0 - a.momentum));
      DS_CUDA_CHECK_LAUNCH();
    }
    quantize_static_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(x, n, range, q, a.symmetric);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
