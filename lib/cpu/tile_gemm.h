// A small single-threaded register-tiled gemm for the blocks inside one
// attention head (scores, probabilities @ V, and their gradients), called from
// inside OpenMP tasks where a threaded BLAS call would oversubscribe.
// Uses GCC vector extensions, so it compiles to AVX-512, AVX2 or SSE as the
// target allows. Each output element is summed in k order: deterministic.
#pragma once
#include <cstdint>

namespace ds::cpu {

#if defined(__AVX512F__)
constexpr int64_t kVecW = 16;  // floats per vector register
constexpr int kMaxNV = 4;      // vectors per row in the widest micro-tile
constexpr int kMaxR = 6;       // rows in the tallest micro-tile (6 x 4 accumulators)
#else
constexpr int64_t kVecW = 8;
constexpr int kMaxNV = 2;
constexpr int kMaxR = 6;
#endif
#if defined(__AVX512F__)
#define DS_VEC_REG_CONSTRAINT(x) "+v"(x)  // any of the 32 vector registers
#else
#define DS_VEC_REG_CONSTRAINT(x) "+x"(x)
#endif
typedef float VecF __attribute__((vector_size(kVecW * sizeof(float)), aligned(4)));

// C[i][j] (+)= sum_k A(i, k) * B[k][j] for i < M, j < N, k < K.
// A(i, k) = a[i * a_rs + k * a_cs] (any strides, so A may be a transposed view).
// B and C are row-major with leading dims ldb, ldc; N must be a multiple of
// kVecW (callers pad B and C columns).
struct TileGemm {
  int64_t M = 0, N = 0, K = 0;
  const float* a = nullptr;
  int64_t a_rs = 0, a_cs = 1;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
};

namespace detail {

template <int R, int NV>
inline void tile_micro(const TileGemm& g, int64_t i, int64_t j) {
  VecF acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = g.accumulate ? *reinterpret_cast<const VecF*>(g.c + (i + r) * g.ldc + j + v * kVecW)
                               : VecF{};
    }
  }
  const int64_t K = g.K, a_rs = g.a_rs, a_cs = g.a_cs, ldb = g.ldb;
  const float* ak = g.a + i * a_rs;  // A(i, k)
  const float* brow = g.b + j;       // B[k][j]
  for (int64_t k = 0; k < K; ++k, ak += a_cs, brow += ldb) {
    VecF bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      VecF t = *reinterpret_cast<const VecF*>(brow + v * kVecW);
      // Keep the B vectors in registers: folding the load into every FMA
      // would load each one R times.
      asm("" : DS_VEC_REG_CONSTRAINT(t));
      bv[v] = t;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float av = ak[r * a_rs];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      *reinterpret_cast<VecF*>(g.c + (i + r) * g.ldc + j + v * kVecW) = acc[r][v];
  }
}

template <int R>
inline void tile_rows(const TileGemm& g, int64_t i) {
  int64_t j = 0;
  for (; j + kMaxNV * kVecW <= g.N; j += kMaxNV * kVecW) tile_micro<R, kMaxNV>(g, i, j);
  if constexpr (kMaxNV > 2) {
    for (; j + 2 * kVecW <= g.N; j += 2 * kVecW) tile_micro<R, 2>(g, i, j);
  }
  for (; j < g.N; j += kVecW) tile_micro<R, 1>(g, i, j);
}

}  // namespace detail

inline void tile_gemm(const TileGemm& g) {
  int64_t i = 0;
  for (; i + kMaxR <= g.M; i += kMaxR) detail::tile_rows<kMaxR>(g, i);
  for (; i + 4 <= g.M; i += 4) detail::tile_rows<4>(g, i);
  for (; i < g.M; ++i) detail::tile_rows<1>(g, i);
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace ds::cpu
