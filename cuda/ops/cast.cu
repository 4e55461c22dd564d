// Dtype conversion between f32, bf16 and f16 (round to nearest even); same
// dtype is a device copy.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class To, class From>
__global__ void cast_kernel(To* out /* (n) */, const From* inp /* (n) */, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<To>(to_f(inp[i]));
}

}  // namespace

void cast(const CastArgs& a, const Stream& s) {
  const char* op = "cast";
  int64_t n = a.inp.numel();
  if (n == 0) return;
  if (a.out.dtype() == a.inp.dtype()) {
    if (a.out.raw() != a.inp.raw())
      DS_CUDA_CHECK(cudaMemcpyAsync(a.out.raw(), a.inp.raw(), a.inp.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream_of(s)));
    return;
  }
  dispatch_float(a.out.dtype(), op, [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    dispatch_float(a.inp.dtype(), op, [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      cast_kernel<To, From><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(a.out.data<To>(),
                                                                        a.inp.data<From>(), n);
      DS_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace ds::cuda
