// In-place x *= s for any float dtype (gradient unscaling, clipping).
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void scale_kernel(T* x /* (n) */, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) * s);
}

}  // namespace

void scale(const ScaleArgs& a, const Stream& s) {
  int64_t n = a.x.numel();
  if (n == 0 || a.s == 1.0f) return;
  dispatch_float(a.x.dtype(), "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(a.x.data<T>(), a.s, n);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
