// In-place x *= s for any float dtype (gradient unscaling, clipping).
// Vectorised: 16 bytes per thread.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void scale_kernel(T* x /* (n) */, float s, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, x, x, [s](float v) { return v * s; });
}

}  // namespace

void scale(const ScaleArgs& a, const Stream& s) {
  int64_t n = a.x.numel();
  if (n == 0 || a.s == 1.0f) return;
  dispatch_float(a.x.dtype(), "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.x.raw(), E}});
    scale_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.x.data<T>(), a.s, pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
