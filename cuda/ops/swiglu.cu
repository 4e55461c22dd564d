// SwiGLU forward and backward: inp row = [gate (F) | up (F)],
// out = silu(gate) * up. Elementwise over (N, F) with a grid-stride loop.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void swiglu_forward_kernel(T* out /* (N, F) */, const T* inp /* (N, 2F) */,
                                      int64_t N, int64_t F) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n = i / F, f = i - n * F;
    float g = to_f(inp[n * 2 * F + f]), u = to_f(inp[n * 2 * F + F + f]);
    float sg = 1.0f / (1.0f + expf(-g));
    out[i] = from_f<T>(g * sg * u);
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dinp /* (N, 2F) */, const T* dout /* (N, F) */,
                                       const T* inp /* (N, 2F) */, int64_t N, int64_t F) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n = i / F, f = i - n * F;
    float g = to_f(inp[n * 2 * F + f]), u = to_f(inp[n * 2 * F + F + f]);
    float d = to_f(dout[i]);
    float sg = 1.0f / (1.0f + expf(-g));
    float dsilu = sg * (1.0f + g * (1.0f - sg));
    // Read everything before writing: dinp may alias inp.
    dinp[n * 2 * F + f] = from_f<T>(d * u * dsilu);
    dinp[n * 2 * F + F + f] = from_f<T>(d * g * sg);
  }
}

}  // namespace

void swiglu_forward(const SwigluArgs& a, const Stream& s) {
  const char* op = "swiglu_forward";
  int64_t F2 = a.inp.size(-1), N = F2 ? a.inp.numel() / F2 : 0, F = F2 / 2;
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  if (N * F == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_forward_kernel<T><<<grid_for(N * F, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), N, F);
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
    swiglu_backward_kernel<T><<<grid_for(N * F, 256), 256, 0, stream_of(s)>>>(
        a.dinp.data<T>(), a.dout.data<T>(), a.inp.data<T>(), N, F);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
