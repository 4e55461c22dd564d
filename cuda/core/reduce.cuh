// Deterministic column reduction: out_k[c] += sum_n f(n, c)[k] over the rows
// of an (N, C) problem, used for weight/bias gradients (layernorm, rmsnorm,
// matmul bias). Rows are split into R fixed chunks (R depends only on N), each
// block sums its chunk in a fixed order into f32 partials, and a second kernel
// adds the R partials in order. No atomics, so results repeat bit for bit.
#pragma once
#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"

namespace ds::cuda {

template <int K> struct ColumnOut {
  AnyPtr p[K];  // (C) each, += ; p[k].p == nullptr skips output k
};

constexpr int kColTile = 32;  // columns per block (threadIdx.x)
constexpr int kColRows = 8;   // row lanes per block (threadIdx.y)

// F: __device__ void operator()(int64_t n, int64_t c, float (&v)[K]) const
template <int K, class F>
__global__ void column_partials_kernel(F f, int64_t N, int64_t C, int64_t rows_per_split,
                                       float* partial /* (K, R, C) */) {
  __shared__ float sh[K][kColRows][kColTile + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t c = int64_t(blockIdx.x) * kColTile + tx;
  int64_t r = blockIdx.y, R = gridDim.y;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  if (c < C) {
    int64_t end = min(N, (r + 1) * rows_per_split);
    for (int64_t n = r * rows_per_split + ty; n < end; n += kColRows) {
      float v[K];
      f(n, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) sh[k][ty][tx] = acc[k];
  __syncthreads();
  if (ty == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int y = 0; y < kColRows; ++y) s += sh[k][y][tx];
      partial[(k * R + r) * C + c] = s;
    }
  }
}

template <int K>
__global__ void column_finish_kernel(const float* partial /* (K, R, C) */, int R, int64_t C,
                                     ColumnOut<K> out) {
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!out.p[k].p) continue;
    float s = 0.f;
    for (int r = 0; r < R; ++r) s += partial[(int64_t(k) * R + r) * C + c];
    store(out.p[k], c, load(out.p[k], c) + s);
  }
}

template <int K, class F>
void column_reduce(const F& f, int64_t N, int64_t C, const ColumnOut<K>& out, const Stream& s) {
  if (C == 0) return;
  int64_t R = (N + 255) / 256;
  if (R < 1) R = 1;
  if (R > 256) R = 256;
  int64_t rows_per_split = (N + R - 1) / R;
  if (rows_per_split < 1) rows_per_split = 1;
  auto* partial = static_cast<float*>(
      stream_workspace(s, sizeof(float) * size_t(K) * size_t(R) * size_t(C)));
  dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(R));
  column_partials_kernel<K, F><<<grid, dim3(kColTile, kColRows), 0, stream_of(s)>>>(
      f, N, C, rows_per_split, partial);
  DS_CUDA_CHECK_LAUNCH();
  column_finish_kernel<K><<<grid_for(C, 256), 256, 0, stream_of(s)>>>(partial, int(R), C, out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
