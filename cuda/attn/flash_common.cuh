// Shared pieces of the fused (flash) attention kernels: tile geometry, padded
// shared-memory leading dimensions, the cooperative tile loader, and the
// support check. Tiles are 64 query rows x 64 key rows; a block has 4 warps and
// each warp owns 16 rows of the tile. Tensor-core math goes through WMMA
// 16x16x16 fragments (bf16/f16 inputs, f32 accumulators).
#pragma once
#include <mma.h>

#include <string>

#include "cuda/attn/attention.h"
#include "cuda/core/common.cuh"
#include "cuda/core/smem.cuh"

namespace ds::cuda::flash {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;     // rows per query tile and per key tile
constexpr int kWarps = 4;     // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kTile + 4;  // f32 score buffers (16 x kTile per warp)
constexpr int kLdP = kTile + 8;  // 16-bit probability buffers (16 x kTile per warp)

// Leading dimension (elements) of a 16-bit (kTile, HS) tile, padded against
// bank conflicts; every 16-row / 16-column fragment start stays 32-byte aligned.
template <int HS> constexpr int ld_tile() { return HS + 8; }
// Leading dimension of a per-warp f32 (16, HS) staging buffer.
template <int HS> constexpr int ld_out() { return HS + 4; }

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

template <class T> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T> using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T> using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Copies rows [0, rows_valid) of a (kTile, HS) tile from global memory (row
// stride `stride` elements, 16-byte aligned rows) into shared memory with
// leading dimension ld_tile<HS>(); rows beyond rows_valid are zero-filled.
template <class T, int HS>
__device__ __forceinline__ void load_tile(T* sm, const T* g, int64_t stride, int rows_valid) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPerRow = HS / kVec;
  for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += kThreads) {
    int r = idx / kPerRow, c = (idx - r * kPerRow) * kVec;
    int4 v = make_int4(0, 0, 0, 0);
    if (r < rows_valid) v = *reinterpret_cast<const int4*>(g + r * stride + c);
    *reinterpret_cast<int4*>(sm + r * ld_tile<HS>() + c) = v;
  }
}

// acc (16 x 16 per n) = A (16 x K, row-major in smem) * B, B given as rows of
// a (., K) tile read transposed (col-major view), i.e. acc = A * Bt^T.
template <class T, int K>
__device__ __forceinline__ void mma_abt(FragC& acc, const T* a, int lda, const T* bt, int ldb) {
  for (int k = 0; k < K; k += 16) {
    FragA<T> fa;
    FragBCol<T> fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, bt + k, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// acc += A (16 x K, row-major) * B (K x 16, row-major).
template <class T, int K>
__device__ __forceinline__ void mma_ab(FragC& acc, const T* a, int lda, const T* b, int ldb) {
  for (int k = 0; k < K; k += 16) {
    FragA<T> fa;
    FragBRow<T> fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + int64_t(k) * ldb, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Sets the dynamic shared-memory limit of `kernel`; returns "" or, when the
// device cannot give `bytes` (beside the kernel's static memory) to one
// block, the reason (cuda/core/smem.cuh).
template <class K>
std::string prepare_smem(K kernel, size_t bytes) {
  return fit_dynamic_smem(kernel, bytes);
}

}  // namespace ds::cuda::flash
