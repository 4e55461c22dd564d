// out += weight * (mean of the losses whose target is not ignored): the
// training loss of one micro-batch stays on the device until the step's one
// packed read. One block: a micro-batch has B*T rows (thousands), so the
// launch, not the sum, is the cost. Each thread sums a fixed strided subset
// in double, then the block adds them in a fixed order: deterministic. The
// order differs from the host's row order, so the double sum may differ in
// its last bits; it is rounded to f32 like the CPU version, which makes the
// two agree to f32 rounding.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void masked_mean_kernel(float* out /* (1) */, const float* losses /* (N) */,
                                   const int32_t* targets /* (N) */, int64_t n, float weight) {
  double sum = 0.0, count = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    if (targets[i] < 0) continue;
    sum += double(losses[i]);
    count += 1.0;
  }
  sum = block_sum(sum);
  count = block_sum(count);  // exact: integers below 2^53
  if (threadIdx.x != 0 || count == 0.0) return;
  const float mean = float(sum / count);
  out[0] = float(double(out[0]) + double(weight) * double(mean));
}

}  // namespace

void masked_mean(const MaskedMeanArgs& a, const Stream& s) {
  const int64_t n = a.losses.numel();
  if (n == 0) return;
  masked_mean_kernel<<<1, kThreads, 0, stream_of(s)>>>(a.out.data<float>(), a.losses.data<float>(),
                                                       a.targets.data<int32_t>(), n, a.weight);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
