// The element-wise steps of the 1-bit exchange (OneBitPackArgs,
// OneBitServerArgs, OneBitUnpackArgs in lib/ops/op_args.h) on the GPU, the
// same bits as lib/cpu/onebit.cpp: the scale in double from the f32 sum of
// squares, and the server's sum in rank order. Grid-stride loops: a thread
// per byte of signs (pack) or per element.
#include <cstdint>

#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

__device__ __forceinline__ float sign_at(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (7 - (i & 7))) & 1 ? 1.f : -1.f;
}

// The scale from the sum of squares: sqrt(sumsq) / sqrt(n) in double.
__device__ __forceinline__ float onebit_scale(const float* sumsq, int64_t n) {
  return static_cast<float>(sqrt(static_cast<double>(sumsq[0])) / sqrt(static_cast<double>(n)));
}

__global__ void onebit_pack_kernel(uint8_t* bits, float* x, const float* sumsq, int64_t n_bytes) {
  const float s = onebit_scale(sumsq, n_bytes * 8);
  for (int64_t byte = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; byte < n_bytes;
       byte += int64_t(gridDim.x) * blockDim.x) {
    uint32_t b = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float v = x[byte * 8 + k];
      const bool pos = !(v < 0.f);
      b = (b << 1) | (pos ? 1u : 0u);
      x[byte * 8 + k] = __fsub_rn(v, pos ? s : -s);
    }
    bits[byte] = static_cast<uint8_t>(b);
  }
}

__global__ void onebit_scale_kernel(float* scale, const float* sumsq, int64_t n) { scale[0] = onebit_scale(sumsq, n); }

__global__ void onebit_server_kernel(float* x, const uint8_t* bits, const float* scales, int W, int64_t n) {
  const int64_t row = n / 8;
  const float inv_w = __frcp_rn(static_cast<float>(W));
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int r = 0; r < W; ++r) s = __fadd_rn(s, sign_at(bits + r * row, k) * __fmul_rn(scales[r], inv_w));
    x[k] = __fadd_rn(s, x[k]);
  }
}

__global__ void onebit_unpack_kernel(float* out, const uint8_t* bits, const float* scales, int64_t chunk, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = scales[i / chunk] * sign_at(bits, i);
}

}  // namespace

void onebit_pack(const OneBitPackArgs& a, const Stream& s) {
  const int64_t n = a.x.numel();
  const cudaStream_t st = stream_of(s);
  if (n > 0) {
    onebit_pack_kernel<<<grid_for(n / 8, 256), 256, 0, st>>>(a.bits.data<uint8_t>(), a.x.data<float>(),
                                                             a.sumsq.data<float>(), n / 8);
    DS_CUDA_CHECK_LAUNCH();
  }
  onebit_scale_kernel<<<1, 1, 0, st>>>(a.scale.data<float>(), a.sumsq.data<float>(), n);
  DS_CUDA_CHECK_LAUNCH();
}

void onebit_server(const OneBitServerArgs& a, const Stream& s) {
  const int64_t n = a.x.numel();
  if (n == 0) return;
  onebit_server_kernel<<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
      a.x.data<float>(), a.bits.data<uint8_t>(), a.scales.data<float>(), static_cast<int>(a.scales.numel()), n);
  DS_CUDA_CHECK_LAUNCH();
}

void onebit_unpack(const OneBitUnpackArgs& a, const Stream& s) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  onebit_unpack_kernel<<<grid_for(n, 256), 256, 0, stream_of(s)>>>(a.out.data<float>(), a.bits.data<uint8_t>(),
                                                                    a.scales.data<float>(), a.chunk, n);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
