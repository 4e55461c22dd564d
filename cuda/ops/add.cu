// Elementwise out = a + b (out may alias a or b), any float dtype, all three
// tensors of the same dtype. Vectorised: 16 bytes per array per thread.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void add_kernel(T* out /* (n) */, const T* a /* (n) */, const T* b /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(T));
  vec_map<N>(pl, out, a, b, [](float x, float y) { return x + y; });
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
    constexpr int E = sizeof(T), N = vec_width(E);
    VecPlan pl = plan_vec(n, N, {{a.out.raw(), E}, {a.a.raw(), E}, {a.b.raw(), E}});
    add_kernel<T><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<T>(), a.a.data<T>(),
                                                                   a.b.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
