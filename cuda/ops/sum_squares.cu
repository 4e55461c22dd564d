// out += sum(x^2) for the global gradient norm. Deterministic: a fixed number
// of blocks (a function of numel only) each sums a fixed strided subset in
// double, then one block adds the partials in order. Reads are 16-byte
// vectors (cuda/core/vec.cuh); the split of the work depends on numel and the
// pointer's alignment only.
#include "cuda/core/allocator.h"
#include "cuda/core/vec.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxPartials = 1024;

template <class T>
__global__ void sum_squares_partial_kernel(double* partial /* (G) */, const T* x /* (n) */,
                                           VecPlan pl) {
  constexpr int V = vec_width(sizeof(T));
  double acc = 0.0;
  vec_loop<V>(
      pl,
      [&](int64_t i) {
        float v[V];
        load_f<V>(x, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) acc += double(v[k]) * double(v[k]);
      },
      [&](int64_t i) {
        double v = to_f(x[i]);
        acc += v * v;
      });
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_squares_finish_kernel(float* out /* (1) */, const double* partial /* (G) */,
                                          int G) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < G; i += kThreads) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = float(double(out[0]) + acc);
}

}  // namespace

void sum_squares(const SumSquaresArgs& a, const Stream& s) {
  const char* op = "sum_squares";
  int64_t n = a.x.numel();
  if (n == 0) return;
  int64_t G = (n + kThreads * 8 - 1) / (kThreads * 8);
  if (G > kMaxPartials) G = kMaxPartials;
  auto* partial = static_cast<double*>(stream_workspace(s, sizeof(double) * size_t(G)));
  dispatch_float(a.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int E = sizeof(T);
    VecPlan pl = plan_vec(n, vec_width(E), {{a.x.raw(), E}});
    sum_squares_partial_kernel<T><<<unsigned(G), kThreads, 0, stream_of(s)>>>(partial,
                                                                            a.x.data<T>(), pl);
    DS_CUDA_CHECK_LAUNCH();
  });
  sum_squares_finish_kernel<<<1, kThreads, 0, stream_of(s)>>>(a.out.data<float>(), partial,
                                                             int(G));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
