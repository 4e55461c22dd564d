// Elementwise out = a + b (out may alias a or b), any float dtype, all three
// tensors of the same dtype.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void add_kernel(T* out /* (n) */, const T* a /* (n) */, const T* b /* (n) */,
                           int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

}  // namespace

void add(const AddArgs& a, const Stream& s) {
  const char* op = "add";
  int64_t n = a.out.numel();
  DS_CUDA_REQUIRE(a.a.dtype() == a.out.dtype() && a.b.dtype() == a.out.dtype(),
                  std::string(op) + ": dtypes differ: " + desc(a.out) + ", " + desc(a.a) + ", " +
                      desc(a.b));
  if (n == 0) return;
  dispatch_float(a.out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(), a.a.data<T>(),
                                                              a.b.data<T>(), n);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
