// Register-resident building blocks of the flash2 attention kernels
// (flash2_fwd.cu, flash2_bwd.cu): the tensor-core instruction
// mma.sync.m16n8k16 (bf16 or f16 in, f32 accumulate), ldmatrix fragment
// loads from shared memory, cp.async tile copies with commit/wait groups, and
// the two warp-level GEMM shapes the flash2 kernels are built from
// (flash2_fwd.cu adds variants that feed several 16-row slices per B load).
//
// Fragment layouts of m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16").
// In a warp, lane = 4 * g + t: g = lane / 4 (0..7) is the "group", t = lane % 4
// the thread in the group. Each 32-bit register holds two 16-bit elements,
// the lower column (or k) in the low half.
//   A (16 x 16, row-major), 4 registers:
//     a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]
//     a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, k x n), 2 registers:
//     b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, f32), 4 floats:
//     c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// Two adjacent C tiles (columns 8j..8j+7 and 8j+8..8j+15) therefore hold, per
// thread, exactly the elements of the A fragment of columns 16j..16j+15:
// a0 = (c0, c1) of the first, a1 = (c2, c3) of the first, a2, a3 the same of
// the second. So P = softmax(S), computed in C registers, becomes the A operand
// of P V by packing pairs to 16 bits, without touching shared memory
// (pack_a_from_c below).
//
// ldmatrix.x4 loads four 8 x 8 16-bit matrices; lanes 8i..8i+7 give the row
// addresses of matrix i, and register i of lane (4g + t) receives row g,
// elements 2t and 2t+1 of matrix i. With .trans it receives instead elements
// [2t][g] and [2t+1][g] (the matrix transposed). Hence, for a tile stored
// row-major in shared memory:
//   A operand, rows r0..r0+15, cols c0..c0+15:  matrix i = rows r0 + 8*(i&1),
//     cols c0 + 8*(i>>1)  -> registers a0..a3.
//   B operand of X U^T (B[k][n] = U[n][k], U row-major, n = rows): matrix i =
//     rows n0 + 8*(i>>1), cols k0 + 8*(i&1) -> b0, b1 of n-tile n0, b0, b1 of
//     n-tile n0 + 8.
//   B operand of P W (B[k][n] = W[k][n], W row-major, k = rows), .trans:
//     matrix i = rows k0 + 8*(i&1), cols n0 + 8*(i>>1) -> b0, b1 of n-tile
//     n0, b0, b1 of n-tile n0 + 8.
// Shared-memory tiles have rows of HS + 8 elements (144 or 272 bytes): the 8
// row addresses of one 8 x 8 matrix then fall in 8 different 16-byte bank
// groups, so ldmatrix is free of bank conflicts, and every row stays 16-byte
// aligned for cp.async.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/attn/attention.h"
#include "cuda/attn/flash_common.cuh"  // prepare_smem
#include "cuda/core/common.cuh"

namespace ds::cuda::flash2 {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

template <int HS> constexpr int ld_tile() { return HS + 8; }

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// d (16 x 8 f32) += a (16 x 16) * b (16 x 8), 16-bit inputs of type T.
template <class T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1);
template <> __device__ __forceinline__ void mma16816<bf16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                           uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<f16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats -> one register of two 16-bit values (x in the low half).
template <class T> __device__ __forceinline__ uint32_t pack2(float x, float y);
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<f16>(float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16-byte global -> shared copy that bypasses L1; src_bytes 0 writes zeros
// (rows past the end of the sequence).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Issues the copies of rows [0, ROWS) of a (ROWS, HS) tile whose global rows
// are `stride` elements apart into shared memory (row length ld_tile<HS>());
// rows >= rows_valid are zero-filled. The caller commits the group.
template <class T, int ROWS, int HS>
__device__ __forceinline__ void cp_async_tile(T* sm, const T* g, int64_t stride, int rows_valid) {
  constexpr int kPerRow = HS * int(sizeof(T)) / 16;
  const uint32_t base = smem_addr(sm);
  for (int idx = threadIdx.x; idx < ROWS * kPerRow; idx += kThreads) {
    const int r = idx / kPerRow, c = (idx - r * kPerRow) * (16 / int(sizeof(T)));
    const bool ok = r < rows_valid;
    cp_async16(base + uint32_t((r * ld_tile<HS>() + c) * sizeof(T)), ok ? g + r * stride + c : g, ok ? 16 : 0);
  }
}

// Loads the A fragments of rows [0, 16) x cols [16 kc, 16 kc + 16) of a
// row-major shared tile `sA` (row length ld) for kc < K / 16.
template <int K>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[K / 16][4], const void* sA, int ld_bytes) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const uint32_t base = smem_addr(sA) + uint32_t(((lane & 7) + 8 * (i & 1)) * ld_bytes + 8 * (i >> 1) * 2);
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) ldmatrix_x4(a[kc], base + uint32_t(kc * 32));
}

// acc (16 x N) += A (16 x K, fragments) * U^T, U the (N, K) row-major shared
// tile `sU`: the S = Q K^T shape (and dP = dO V^T, S^T = K Q^T, ...).
template <class T, int K, int N>
__device__ __forceinline__ void gemm_abt(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const T* sU,
                                         int ldu) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const uint32_t base = smem_addr(sU) + uint32_t((((lane & 7) + 8 * (i >> 1)) * ldu + 8 * (i & 1)) * sizeof(T));
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc)
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, base + uint32_t((np * 16 * ldu + kc * 16) * sizeof(T)));
      mma16816<T>(acc[2 * np], a[kc], b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a[kc], b[2], b[3]);
    }
}

// The A fragment of columns [16 j, 16 j + 16) of a 16 x N matrix held as
// C fragments `c` (the register reuse described at the top of the file).
template <class T, int NT>
__device__ __forceinline__ void pack_a_from_c(uint32_t (&a)[4], const float (&c)[NT][4], int j) {
  a[0] = pack2<T>(c[2 * j][0], c[2 * j][1]);
  a[1] = pack2<T>(c[2 * j][2], c[2 * j][3]);
  a[2] = pack2<T>(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = pack2<T>(c[2 * j + 1][2], c[2 * j + 1][3]);
}

// acc (16 x HS) += P (16 x N, C fragments in registers, rounded to T here) *
// W, W the (N, HS) row-major shared tile `sW` read transposed by ldmatrix:
// the O += P V shape (and dV += P^T dO, dK += dS^T Q, dQ += dS K).
template <class T, int N, int HS>
__device__ __forceinline__ void gemm_pw(float (&acc)[HS / 8][4], const float (&p)[N / 8][4], const T* sW, int ldw) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const uint32_t base = smem_addr(sW) + uint32_t((((lane & 7) + 8 * (i & 1)) * ldw + 8 * (i >> 1)) * sizeof(T));
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    uint32_t a[4];
    pack_a_from_c<T, N / 8>(a, p, j);
#pragma unroll
    for (int dp = 0; dp < HS / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + uint32_t((j * 16 * ldw + dp * 16) * sizeof(T)));
      mma16816<T>(acc[2 * dp], a, b[0], b[1]);
      mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

template <int NT> __device__ __forceinline__ void zero_acc(float (&c)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
}

// Writes a warp's 16 x HS f32 accumulator, times `mul`, as rows [row0,
// row0 + 16) of a T matrix in global memory (row stride `stride` elements);
// rows >= T_ are skipped. Each thread stores pairs (4 bytes).
template <class T, int HS>
__device__ __forceinline__ void store_acc(const float (&c)[HS / 8][4], float mul, T* g, int64_t stride,
                                          int64_t row0, int64_t T_) {
  const int lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + gr + 8 * half;
    if (row >= T_) continue;
    T* out = g + row * stride + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n)
      *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<T>(c[n][2 * half] * mul, c[n][2 * half + 1] * mul);
  }
}

}  // namespace ds::cuda::flash2
