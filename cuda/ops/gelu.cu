// GELU (tanh approximation) forward and backward, elementwise with a
// grid-stride loop. Backward: dinp = dout * gelu'(inp) (GeluArgs.out is dinp).
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

template <class T>
__global__ void gelu_forward_kernel(T* out /* (n) */, const T* inp /* (n) */, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float x = to_f(inp[i]);
    float t = tanhf(kGeluK * (x + kGeluA * x * x * x));
    out[i] = from_f<T>(0.5f * x * (1.0f + t));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp /* (n) */, const T* inp /* (n) */,
                                     const T* dout /* (n) */, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float x = to_f(inp[i]);
    float t = tanhf(kGeluK * (x + kGeluA * x * x * x));
    float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * x * x);
    float g = 0.5f * (1.0f + t) + 0.5f * x * dt;
    dinp[i] = from_f<T>(to_f(dout[i]) * g);
  }
}

void check_same(const Tensor& a, const Tensor& ref, const char* op, const char* name) {
  expect_compute(a, ref.dtype(), op, name, "inp");
}

}  // namespace

void gelu_forward(const GeluArgs& a, const Stream& s) {
  const char* op = "gelu_forward";
  check_same(a.out, a.inp, op, "out");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_forward_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(),
                                                                       a.inp.data<T>(), n);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void gelu_backward(const GeluArgs& a, const Stream& s) {
  const char* op = "gelu_backward";
  check_same(a.out, a.inp, op, "out (dinp)");
  check_same(a.dout, a.inp, op, "dout");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_backward_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), a.dout.data<T>(), n);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
