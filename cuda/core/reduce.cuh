// Deterministic column reduction: out_k[c] += sum_n f(n, c)[k] over the rows
// of an (N, C) problem, used for weight/bias gradients (matmul bias, and the
// layernorm/rmsnorm parameter gradients of rows too long for the one-pass
// norm backward). Rows are split into R fixed chunks (R depends only on N),
// each block sums its chunk in a fixed order into f32 partials, and a second
// kernel adds the R partials in order. No atomics, so results repeat bit for
// bit.
//
// Each thread owns V consecutive columns: V = F::kVW (16 bytes of the
// functor's (N, C) arrays: 8 bf16/f16 or 4 f32 columns) when the functor's
// rows can be read as whole vectors (f.vectorisable(): C a multiple of V,
// every base pointer 16-byte aligned), else V = 1. A block is kColTile x
// kColRows threads; a warp is one row lane, so on the vector path it reads
// 32 x 16 = 512 contiguous bytes of one row per step (64 bytes on the
// 16-bit scalar path). Per column the order of the additions is the same on
// both paths: lane ty adds rows ty, ty + 8, ... of the chunk, the 8 lanes
// are added in lane order, the R chunks in chunk order; and the functor
// computes each element's value with the same arithmetic for any V. So the
// vector and the scalar path give the same bits (test_cuda_ops: "cuda
// column reduction: ... bits do not depend on the path"). The partials
// workspace is (K, R, C) f32 on both paths.
#pragma once
#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"
#include "cuda/core/vec.cuh"

namespace ds::cuda {

template <int K> struct ColumnOut {
  AnyPtr p[K];  // (C) each, += ; p[k].p == nullptr skips output k
};

constexpr int kColTile = 32;  // column groups per block (threadIdx.x), V columns each
constexpr int kColRows = 8;   // row lanes per block (threadIdx.y)

// Shared-memory slot of a block's column i: one float of padding per 32, so
// that the lanes' stores of column tx * V + j (stride V) hit distinct banks.
__device__ __forceinline__ int column_slot(int i) { return i + i / kColTile; }

// F provides
//   static constexpr int kVW;       // columns per 16-byte vector of its (N, C) arrays
//   bool vectorisable() const;      // host: its (N, C) rows can be read as kVW-vectors
//   template <int V> __device__ void operator()(int64_t n, int64_t c, float (&v)[K][V]) const;
//     // v[k][j] = value k of row n, column c + j; V is 1 or kVW (then c % V == 0)
// The per-element arithmetic of operator() must not depend on V.
template <int K, int V, class F>
__global__ void column_partials_kernel(F f, int64_t N, int64_t C, int64_t rows_per_split,
                                       float* partial /* (K, R, C) */) {
  constexpr int kCols = kColTile * V;  // columns per block
  __shared__ float sh[K][kColRows][kCols + V];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c_block = int64_t(blockIdx.x) * kCols;
  const int64_t c = c_block + int64_t(tx) * V;  // this thread's first column
  const int64_t r = blockIdx.y, R = gridDim.y;
  float acc[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[k][j] = 0.f;
  if (c < C) {  // V > 1: C % V == 0, so all V columns exist
    const int64_t end = min(N, (r + 1) * rows_per_split);
#pragma unroll 4
    for (int64_t n = r * rows_per_split + ty; n < end; n += kColRows) {
      float v[K][V];
      f(n, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) acc[k][j] += v[k][j];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) sh[k][ty][column_slot(tx * V + j)] = acc[k][j];
  __syncthreads();
  // All threads share the final sums: column i of the block adds its 8 lanes in order.
  for (int i = ty * kColTile + tx; i < kCols; i += kColTile * kColRows) {
    if (c_block + i >= C) break;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int y = 0; y < kColRows; ++y) s += sh[k][y][column_slot(i)];
      partial[(k * R + r) * C + c_block + i] = s;
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

template <int K, int V, class F>
void launch_column_partials(const F& f, int64_t N, int64_t C, int64_t R, int64_t rows_per_split,
                            float* partial, const Stream& s) {
  constexpr int64_t kCols = int64_t(kColTile) * V;
  dim3 grid(static_cast<unsigned>((C + kCols - 1) / kCols), static_cast<unsigned>(R));
  column_partials_kernel<K, V, F><<<grid, dim3(kColTile, kColRows), 0, stream_of(s)>>>(
      f, N, C, rows_per_split, partial);
  DS_CUDA_CHECK_LAUNCH();
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
  if (f.vectorisable())
    launch_column_partials<K, F::kVW>(f, N, C, R, rows_per_split, partial, s);
  else
    launch_column_partials<K, 1>(f, N, C, R, rows_per_split, partial, s);
  column_finish_kernel<K><<<grid_for(C, 256), 256, 0, stream_of(s)>>>(partial, int(R), C, out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::cuda
