// GELU (tanh approximation) and ReLU forward and backward, elementwise,
// vectorised (cuda/core/vec.cuh: 16 bytes per array per thread, scalar
// head/tail). Backward: dinp = dout * act'(inp) (GeluArgs.out is dinp).
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float gelu_f(float x) {
  float t = tanhf(kGeluK * (x + kGeluA * x * x * x));
  return 0.5f * x * (1.0f + t);
}
__device__ __forceinline__ float gelu_grad(float x) {
  float t = tanhf(kGeluK * (x + kGeluA * x * x * x));
  float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * dt;
}

template <class T>
__global__ void gelu_forward_kernel(T* out /* (n) */, const T* inp /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, out, inp, [](float x) { return gelu_f(x); });
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp /* (n) */, const T* inp /* (n) */,
                                     const T* dout /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, dinp, inp, dout, [](float x, float d) { return d * gelu_grad(x); });
}

template <class T>
__global__ void relu_forward_kernel(T* out /* (n) */, const T* inp /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, out, inp, [](float x) { return x > 0.f ? x : 0.f; });
}

template <class T>
__global__ void relu_backward_kernel(T* dinp /* (n) */, const T* inp /* (n) */,
                                     const T* dout /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, dinp, inp, dout, [](float x, float d) { return x > 0.f ? d : 0.f; });
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
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}});
    gelu_forward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(),
                                                                             a.inp.data<T>(), pl);
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
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}, {a.dout.raw(), E}});
    gelu_backward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), a.dout.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void relu_forward(const GeluArgs& a, const Stream& s) {
  const char* op = "relu_forward";
  check_same(a.out, a.inp, op, "out");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}});
    relu_forward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(),
                                                                             a.inp.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void relu_backward(const GeluArgs& a, const Stream& s) {
  const char* op = "relu_backward";
  check_same(a.out, a.inp, op, "out (dinp)");
  check_same(a.dout, a.inp, op, "dout");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}, {a.dout.raw(), E}});
    relu_backward_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), a.inp.data<T>(), a.dout.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
