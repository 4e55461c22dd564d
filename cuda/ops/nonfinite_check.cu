// Overflow check for dynamic loss scaling: flag = 1 if any element of x is
// inf or nan (never cleared here, so one flag can cover many tensors).
// Vectorised reads (cuda/core/vec.cuh).
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void nonfinite_kernel(float* flag /* (1) */, const T* x /* (n) */, VecPlan pl) {
  constexpr int V = vec_width(sizeof(T));
  bool bad = false;
  vec_loop<V>(
      pl,
      [&](int64_t i) {
        float v[V];
        load_f<V>(x, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) bad |= !isfinite(v[k]);
      },
      [&](int64_t i) { bad |= !isfinite(to_f(x[i])); });
  // Every writer stores the same value, so the race is benign.
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) flag[0] = 1.0f;
}

}  // namespace

void nonfinite_check(const NonFiniteArgs& a, const Stream& s) {
  const char* op = "nonfinite_check";
  int64_t n = a.x.numel();
  if (n == 0) return;
  dispatch_float(a.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.x.raw(), E}});
    nonfinite_kernel<T><<<grid_for_plan(pl, 256, 4096), 256, 0, stream_of(s)>>>(a.flag.data<float>(),
                                                                                a.x.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
