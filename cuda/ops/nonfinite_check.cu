// Overflow check for dynamic loss scaling: flag = 1 if any element of x is
// inf or nan (never cleared here, so one flag can cover many tensors).
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void nonfinite_kernel(float* flag /* (1) */, const T* x /* (n) */, int64_t n) {
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(to_f(x[i]));
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
    nonfinite_kernel<T><<<grid_for(n, 256, 4096), 256, 0, stream_of(s)>>>(a.flag.data<float>(),
                                                                          a.x.data<T>(), n);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
