// Dtype conversion between f32, bf16 and f16 (round to nearest even); same
// dtype is a device copy. Vectorised (cuda/core/vec.cuh): N elements per
// thread, 16 bytes of the narrower type.
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class To, class From>
__global__ void cast_kernel(To* out /* (n) */, const From* inp /* (n) */, VecPlan pl) {
  constexpr int N = vec_width(sizeof(To) < sizeof(From) ? int(sizeof(To)) : int(sizeof(From)));
  vec_map<N>(pl, out, inp, [](float x) { return x; });
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
      constexpr int N = vec_width(sizeof(To) < sizeof(From) ? int(sizeof(To)) : int(sizeof(From)));
      VecPlan pl = plan_vec(n, N, {{a.out.raw(), int(sizeof(To))}, {a.inp.raw(), int(sizeof(From))}});
      cast_kernel<To, From><<<grid_for_plan(pl, 256), 256, 0, stream_of(s)>>>(a.out.data<To>(),
                                                                             a.inp.data<From>(), pl);
      DS_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace ds::cuda
