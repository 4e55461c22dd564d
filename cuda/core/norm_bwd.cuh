// One-pass LayerNorm / RMSNorm backward. One block per fixed chunk of rows
// (the chunking depends only on N, so results repeat bit for bit); for each
// row of its chunk the block
//   1. reads x and dout once (16-byte vectors when aligned), accumulates the
//      row sums the input gradient needs and, in registers, this thread's
//      columns of dweight (+= dout * xhat) and dbias (+= dout);
//   2. writes dinp, re-reading the row from L1/L2, not from DRAM.
// At the end each block stores its partial column sums in a workspace
// (R, C) per output, and column_finish_kernel (reduce.cuh) adds the R
// partials in chunk order into dweight/dbias. No atomics.
// Each thread owns the columns c = (t + j * blockDim) * V, j < J; the
// accumulators are kMaxCols floats per output, which bounds C to
// kThreads * kMaxCols; longer rows return false and the caller runs the
// two-pass path.
#pragma once
#include "cuda/core/allocator.h"
#include "cuda/core/reduce.cuh"
#include "cuda/core/vec.cuh"

namespace ds::cuda {

enum class NormKind { LayerNorm, RMSNorm };

template <class T> struct NormBwd {
  T* dinp;            // (N, C) or null
  const T* dout;      // (N, C)
  const T* inp;       // (N, C)
  AnyPtr weight;      // (C)
  const float* mean;  // (N), LayerNorm only
  const float* rstd;  // (N)
  AnyPtr dweight;     // (C) += or null
  AnyPtr dbias;       // (C) += or null (LayerNorm only)
  int64_t N, C;
  bool add;           // dinp += instead of =
};

namespace norm_bwd_detail {

constexpr int kThreads = 256;
constexpr int kMaxCols = 32;   // accumulator floats per thread and output
constexpr int64_t kMaxChunks = 512;

// J: vectors per thread per row (J * V <= kMaxCols).
template <class T, NormKind K, int V, int J>
__global__ void __launch_bounds__(kThreads) norm_bwd_kernel(NormBwd<T> p, int64_t rows_per_chunk,
                                                            float* partial /* (2, R, C) */) {
  constexpr bool kLn = K == NormKind::LayerNorm;
  const int64_t R = gridDim.x, chunk = blockIdx.x;
  const int64_t row0 = chunk * rows_per_chunk;
  const int64_t row1 = min(p.N, row0 + rows_per_chunk);
  float dw[J][V], db[J][V];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < V; ++k) dw[j][k] = db[j][k] = 0.f;
  for (int64_t row = row0; row < row1; ++row) {
    const T* x = p.inp + row * p.C;
    const T* g = p.dout + row * p.C;
    const float m = kLn ? p.mean[row] : 0.f, rs = p.rstd[row];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(j) * kThreads) * V;
      if (c >= p.C) continue;
      float xv[V], gv[V], w[V];
      load_f<V>(x, c, xv);
      load_f<V>(g, c, gv);
      load_any<V>(p.weight, c, w);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (xv[k] - m) * rs;
        const float dn = gv[k] * w[k];
        s1 += dn;
        s2 += dn * xhat;
        dw[j][k] += gv[k] * xhat;
        db[j][k] += gv[k];
      }
    }
    if (!p.dinp) continue;
    s2 = block_sum(s2) / float(p.C);
    if (kLn) s1 = block_sum(s1) / float(p.C);
    T* d = p.dinp + row * p.C;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(j) * kThreads) * V;
      if (c >= p.C) continue;
      float xv[V], gv[V], w[V], o[V], prev[V];
      load_f<V>(x, c, xv);
      load_f<V>(g, c, gv);
      load_any<V>(p.weight, c, w);
      if (p.add) load_f<V>(d, c, prev);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (xv[k] - m) * rs;
        const float dn = gv[k] * w[k];
        o[k] = (kLn ? dn - s1 - xhat * s2 : dn - xhat * s2) * rs;
        if (p.add) o[k] += prev[k];
      }
      store_f<V>(d, c, o);
    }
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int64_t c = (int64_t(threadIdx.x) + int64_t(j) * kThreads) * V;
    if (c >= p.C) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      partial[chunk * p.C + c + k] = dw[j][k];
      if (kLn) partial[(R + chunk) * p.C + c + k] = db[j][k];
    }
  }
}

template <class T, NormKind K, int V, int J>
void launch(const NormBwd<T>& p, int64_t R, int64_t rows_per_chunk, float* partial, const Stream& s) {
  norm_bwd_kernel<T, K, V, J><<<unsigned(R), kThreads, 0, stream_of(s)>>>(p, rows_per_chunk, partial);
  DS_CUDA_CHECK_LAUNCH();
}

// Smallest J in {1, 2, 4, ..., kMaxCols / V} that covers C.
template <class T, NormKind K, int V>
bool launch_v(const NormBwd<T>& p, int64_t R, int64_t rpc, float* partial, const Stream& s) {
  const int64_t need = (p.C + int64_t(kThreads) * V - 1) / (int64_t(kThreads) * V);
  if (need <= 1) launch<T, K, V, 1>(p, R, rpc, partial, s);
  else if (need <= 2) launch<T, K, V, (2 * V <= kMaxCols ? 2 : 1)>(p, R, rpc, partial, s);
  else if (need <= 4) launch<T, K, V, (4 * V <= kMaxCols ? 4 : 1)>(p, R, rpc, partial, s);
  else if (need <= 8 && 8 * V <= kMaxCols) launch<T, K, V, (8 * V <= kMaxCols ? 8 : 1)>(p, R, rpc, partial, s);
  else if (need <= 16 && 16 * V <= kMaxCols) launch<T, K, V, (16 * V <= kMaxCols ? 16 : 1)>(p, R, rpc, partial, s);
  else if (need <= 32 && 32 * V <= kMaxCols) launch<T, K, V, (32 * V <= kMaxCols ? 32 : 1)>(p, R, rpc, partial, s);
  else return false;
  return true;
}

}  // namespace norm_bwd_detail

// Runs the one-pass backward; false (nothing launched) when C is too long
// for it. Needs 4 * K * R * C bytes of workspace (K = 2 for LayerNorm).
template <class T, NormKind K>
bool norm_backward_one_pass(const NormBwd<T>& p, const Stream& s) {
  using namespace norm_bwd_detail;
  if (p.C > int64_t(kThreads) * kMaxCols || p.N == 0) return false;
  constexpr int VW = vec_width(sizeof(T));
  const int wb = elem_bytes(p.weight);
  const bool vec = rows_vectorisable(p.inp, sizeof(T), p.C, VW) &&
                   rows_vectorisable(p.dout, sizeof(T), p.C, VW) &&
                   rows_vectorisable(p.dinp, sizeof(T), p.C, VW) &&
                   rows_vectorisable(p.weight.p, wb, p.C, VW);
  // Rows split into R chunks; R depends on N only.
  int64_t R = p.N < kMaxChunks ? p.N : kMaxChunks;
  const int64_t rows_per_chunk = (p.N + R - 1) / R;
  R = (p.N + rows_per_chunk - 1) / rows_per_chunk;
  constexpr int KO = K == NormKind::LayerNorm ? 2 : 1;
  auto* partial = static_cast<float*>(stream_workspace(s, sizeof(float) * size_t(KO) * size_t(R) * size_t(p.C)));
  const bool ok = vec ? launch_v<T, K, VW>(p, R, rows_per_chunk, partial, s)
                      : launch_v<T, K, 1>(p, R, rows_per_chunk, partial, s);
  if (!ok) return false;
  if (p.dweight.p || p.dbias.p) {
    ColumnOut<KO> out{};
    out.p[0] = p.dweight;
    if constexpr (KO == 2) out.p[1] = p.dbias;
    column_finish_kernel<KO><<<grid_for(p.C, 256), 256, 0, stream_of(s)>>>(partial, int(R), p.C, out);
    DS_CUDA_CHECK_LAUNCH();
  }
  return true;
}

}  // namespace ds::cuda
