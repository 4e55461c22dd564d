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

// out = f(inp) (a forward), elementwise.
template <class T, class F>
__global__ void map1_kernel(T* out /* (n) */, const T* inp /* (n) */, VecPlan pl, F f) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, out, inp, f);
}

// dinp = g(inp, dout) (a backward), elementwise.
template <class T, class G>
__global__ void map2_kernel(T* dinp /* (n) */, const T* inp /* (n) */, const T* dout /* (n) */, VecPlan pl, G g) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, dinp, inp, dout, g);
}

void check_same(const Tensor& a, const Tensor& ref, const char* op, const char* name) {
  expect_compute(a, ref.dtype(), op, name, "inp");
}

template <class F>
void activation_forward(const GeluArgs& a, const Stream& s, const char* op, F f) {
  check_same(a.out, a.inp, op, "out");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}});
    map1_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(), a.inp.data<T>(), pl, f);
    DS_CUDA_CHECK_LAUNCH();
  });
}

template <class G>
void activation_backward(const GeluArgs& a, const Stream& s, const char* op, G g) {
  check_same(a.out, a.inp, op, "out (dinp)");
  check_same(a.dout, a.inp, op, "dout");
  int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.out.raw(), E}, {a.inp.raw(), E}, {a.dout.raw(), E}});
    map2_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(), a.inp.data<T>(),
                                                                      a.dout.data<T>(), pl, g);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void gelu_forward(const GeluArgs& a, const Stream& s) {
  activation_forward(a, s, "gelu_forward", [] __device__(float x) { return gelu_f(x); });
}

void gelu_backward(const GeluArgs& a, const Stream& s) {
  activation_backward(a, s, "gelu_backward", [] __device__(float x, float d) { return d * gelu_grad(x); });
}

void relu_forward(const GeluArgs& a, const Stream& s) {
  activation_forward(a, s, "relu_forward", [] __device__(float x) { return x > 0.f ? x : 0.f; });
}

void relu_backward(const GeluArgs& a, const Stream& s) {
  activation_backward(a, s, "relu_backward", [] __device__(float x, float d) { return x > 0.f ? d : 0.f; });
}

}  // namespace ds::cuda
