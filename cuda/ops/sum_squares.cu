// out += sum(x^2) for the global gradient norm. Deterministic: a fixed number
// of blocks (a function of numel only) each sums a fixed strided subset in
// double, then one block adds the partials in order.
#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxPartials = 1024;

template <class T>
__global__ void sum_squares_partial_kernel(double* partial /* (G) */, const T* x /* (n) */,
                                           int64_t n) {
  double acc = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    double v = to_f(x[i]);
    acc += v * v;
  }
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
    sum_squares_partial_kernel<T><<<unsigned(G), kThreads, 0, stream_of(s)>>>(partial,
                                                                            a.x.data<T>(), n);
    DS_CUDA_CHECK_LAUNCH();
  });
  sum_squares_finish_kernel<<<1, kThreads, 0, stream_of(s)>>>(a.out.data<float>(), partial,
                                                             int(G));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
