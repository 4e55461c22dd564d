// Shared device helpers for the CUDA kernels: element types and conversions,
// a runtime-typed pointer for small parameter vectors, dtype dispatch, warp and
// block reductions (fixed trees, so results are deterministic), the host
// checks that are the CUDA backend's own.
//
// Dtype contract of every CUDA op (mixed precision; the CPU ops follow it too):
//  - Activations and model weights have the compute dtype (bf16, f16, or f32
//    in fp32 mode); within one call all activation tensors share one dtype,
//    and the weights (matmul weight/bias, norm weight/bias, wte/wpe) have it.
//  - Weight/bias GRADIENTS (dweight, dbias, dwte, dwpe) accumulate (+=) and
//    are f32 in mixed precision (the compute dtype is accepted as well).
//    Input gradients (dinp, dqkv, dlogits, dout) have the compute dtype.
//  - Statistics are f32: LayerNorm mean/rstd, RMSNorm rstd, attention lse,
//    cross-entropy losses, vocab-parallel rowmax/stats.
//  - adamw_step: param, m, v f32 (master); grad f32/bf16/f16; param_lowp
//    bf16/f16 receives the updated value (stochastic rounding for bf16 when
//    sr_seed != 0). sum_squares / nonfinite_check: x any float dtype,
//    out/flag f32. scale: in place on any float dtype. cast: any float pair.
// Kernels are instantiated on the activation type T; the per-channel vectors
// (weights, biases and their gradients) go through AnyPtr, so each may be f32
// or the compute dtype independently. All arithmetic is f32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half_rn(x); }

// A float tensor of any of our float dtypes, typed at run time. Used for the
// small per-channel vectors (weights, biases, their gradients) so that, e.g.,
// bf16 activations can meet f32 gradients without a template per combination.
enum class FType : int { F32 = 0, BF16 = 1, F16 = 2 };
struct AnyPtr {
  void* p = nullptr;
  FType t = FType::F32;
};

__device__ __forceinline__ float load(AnyPtr a, int64_t i) {
  switch (a.t) {
    case FType::BF16: return __bfloat162float(static_cast<const bf16*>(a.p)[i]);
    case FType::F16: return __half2float(static_cast<const f16*>(a.p)[i]);
    default: return static_cast<const float*>(a.p)[i];
  }
}
__device__ __forceinline__ void store(AnyPtr a, int64_t i, float v) {
  switch (a.t) {
    case FType::BF16: static_cast<bf16*>(a.p)[i] = __float2bfloat16_rn(v); break;
    case FType::F16: static_cast<f16*>(a.p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(a.p)[i] = v; break;
  }
}

// A null handle is the compute stream (cuda/core/capture.h).
inline cudaStream_t stream_of(const Stream& s) { return resolve_stream(s.handle); }

inline bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

inline std::string desc(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) +
         (t.device().is_cuda() ? "" : " (not on a CUDA device)");
}

// The op API validated shapes, dtype classes and devices before the call got
// here (lib/ops/op_validate.cpp). What the CUDA backend checks itself is its
// own: kernels are instantiated on one compute dtype per call, so activations
// must share it, and weight/bias gradients are f32 or that dtype.

// Host-side check that `t` has the compute dtype of the call.
inline void expect_compute(const Tensor& t, DType compute, const char* op, const char* name,
                           const char* ref_name) {
  DS_CUDA_REQUIRE(t.dtype() == compute, std::string(op) + ": " + name + " (" + desc(t) +
                                            ") must have the dtype of " + ref_name + " (" +
                                            dtype_name(compute) + ")");
}
// Host-side check of a weight/bias gradient (or a per-channel vector read
// through AnyPtr): f32 or the compute dtype `compute`.
inline void expect_grad(const Tensor& t, DType compute, const char* op, const char* name) {
  DS_CUDA_REQUIRE(t.dtype() == DType::F32 || t.dtype() == compute,
                  std::string(op) + ": " + name + " must be f32 (or " + dtype_name(compute) +
                      "), got " + desc(t));
}

// Dtype rules shared by the norm backwards: dout and (if defined) dinp have
// the dtype of inp, dweight (if defined) f32 or that dtype. Returns {N, C}.
struct NormRows {
  int64_t N, C;
};
inline NormRows check_norm_backward(const Tensor& inp, const Tensor& dout, const Tensor& dinp,
                                    const Tensor& dweight, const char* op) {
  const int64_t C = inp.size(-1), N = C ? inp.numel() / C : 0;
  expect_compute(dout, inp.dtype(), op, "dout", "inp");
  if (dinp.defined()) expect_compute(dinp, inp.dtype(), op, "dinp", "inp");
  // Mixed precision: bf16/f16 activations with an f32 weight gradient (AnyPtr).
  if (dweight.defined()) expect_grad(dweight, inp.dtype(), op, "dweight");
  return {N, C};
}

inline AnyPtr any_ptr(const Tensor& t) {
  if (!t.defined()) return AnyPtr{};
  FType ft = t.dtype() == DType::BF16 ? FType::BF16
             : t.dtype() == DType::F16 ? FType::F16 : FType::F32;
  return AnyPtr{t.raw(), ft};
}

template <class T> struct Tag { using type = T; };

// Calls f(Tag<T>{}) with T the element type of a float dtype.
template <class F> void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32: f(Tag<float>{}); return;
    case DType::BF16: f(Tag<bf16>{}); return;
    case DType::F16: f(Tag<f16>{}); return;
    default:
      require_fail("float dtype", std::string(op) + ": unsupported dtype " + dtype_name(dt),
                   __FILE__, __LINE__);
  }
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65536) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread gets the result. blockDim.x must be a
// multiple of 32 (1-D blocks). Safe to call repeatedly in one kernel.
template <class V, class Op>
__device__ __forceinline__ V block_reduce(V v, V identity, Op op) {
  __shared__ V sh[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct SumOp {
  template <class V> __device__ V operator()(V a, V b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, 0.0f, SumOp{}); }
__device__ __forceinline__ double block_sum(double v) { return block_reduce(v, 0.0, SumOp{}); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, -INFINITY, MaxOp{}); }

}  // namespace ds::cuda
