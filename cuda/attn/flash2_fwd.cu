// flash2 attention forward: causal, bf16/f16, head size 64 or 128, with
// scores, probabilities and the output accumulator in registers.
//
// One block of 4 warps per (query tile of 64 S rows, head, batch); warp w owns
// S row slices of 16: rows [16 (S w + i), + 16) for i < S. S = 1 (HS 128):
// the Q tile is copied to shared memory once and its A fragments stay in
// registers for the whole key loop. S = 2 (HS 64): each K / V fragment loaded
// from shared memory feeds two slices, halving the ldmatrix traffic per FLOP,
// and the Q fragments are re-read from shared memory per tile (two slices of
// Q fragments would not fit in the registers beside the accumulators).
// K and V tiles (64 rows) are double-buffered with cp.async: the copies of
// tile j + 1 are in flight while tile j is used. Per key tile each warp
// computes S = Q K^T (16 x 64 f32 in C fragments per slice), updates the running row
// max m and row sum l (online softmax, exp2 on scores pre-scaled by
// scale * log2(e)), rescales its output accumulator, and adds P V with P
// taken straight from the S registers as the A operand (flash2_common.cuh).
// Causal: key tiles past the diagonal are never visited, and only the tiles
// that reach past the query tile's first row (the last one or two, which
// also hold the end of the sequence) are masked. Query tiles are launched last-first: they have the most key tiles,
// so the long blocks start early and the short ones fill the tail.
// Saves lse = m * scale + log(l) per row (natural log, as the other paths).
// Grouped-query attention: query head h reads kv head h / (NH / NKV).
// Attention dropout multiplies P by the hashed mask factor after l has summed
// the undropped probabilities (lib/ops/dropout_mask.h, docs/dropout.md).
#include "cuda/attn/flash2_common.cuh"

namespace ds::cuda {
namespace flash2 {
namespace {

constexpr int kTileK = 64;
// Row slices of 16 per warp (query tile = 64 S rows). At HS 128 two slices
// would need 2 x 64 accumulator + 2 x 32 score registers beside the
// fragments: more than 255.
template <int HS> constexpr int fwd_slices() { return HS == 64 ? 2 : 1; }
template <int HS> constexpr int fwd_tile_q() { return 16 * kWarps * fwd_slices<HS>(); }

template <class T> struct FwdParams {
  T* out;        // (B, T, NH*HS)
  float* lse;    // (B, NH, T)
  const T* qkv;  // (B, T, (NH+2*NKV)*HS)
  int64_t T_;
  int NH, NKV, B;
  float scale;   // 1 / sqrt(HS)
  DropoutSpec drop;
  uint32_t threshold;
  float dscale;
};

// Q tile + two K and two V tiles, 16-bit, rows of HS + 8.
template <int HS> constexpr size_t fwd_smem() {
  return sizeof(uint16_t) * ld_tile<HS>() * (fwd_tile_q<HS>() + 4 * kTileK);
}

// Masks S (raw scores) of a key tile on or near the diagonal: key kv > query,
// or kv >= T. q_lo: the thread's first row (the second is q_lo + 8).
__device__ __forceinline__ void mask_tile(float (&s)[kTileK / 8][4], int64_t q_lo, int64_t kv0, int64_t T_) {
  const int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
  for (int n = 0; n < kTileK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t q = q_lo + 8 * (e >> 1), kv = kv0 + 8 * n + 2 * t + (e & 1);
      if (kv > q || kv >= T_) s[n][e] = -INFINITY;
    }
}

// Online softmax of one key tile for the thread's two rows of one slice
// (r = 0: row g, r = 1: row g + 8). Turns s into P (dropped if dropout is
// on), updates m (raw-score units) and l, and rescales the output
// accumulator o.
template <class T, int HS>
__device__ __forceinline__ void softmax_tile(const FwdParams<T>& p, float (&s)[kTileK / 8][4], float (&o)[HS / 8][4],
                                             float (&m)[2], float (&l)[2], const uint64_t (&drow)[2], int64_t kv0) {
  const float sl2 = p.scale * kLog2e;
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int n = 0; n < kTileK / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    // The four threads of a group share the row.
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Key 0 of the first tile is visible to every row, so mx is finite; the
    // guard keeps a fully masked row at 0 rather than NaN all the same.
    const float mb = mx == -INFINITY ? 0.f : mx * sl2;
    const float alpha = exp2f(m[r] * sl2 - mb);  // 0 on the first tile (m = -inf)
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kTileK / 8; ++n)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        float pv = exp2f(fmaf(s[n][e], sl2, -mb));
        sum += pv;
        if (p.drop.p != 0.f) pv *= dropout_factor(drow[r], kv0 + 8 * n + 2 * t + (e & 1), p.threshold, p.dscale);
        s[n][e] = pv;
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      o[n][2 * r] *= alpha;
      o[n][2 * r + 1] *= alpha;
    }
  }
}

// acc[i] += A_i U^T for the warp's S slices, A_i the 16 rows at sA + 16 i
// rows (shared, re-read per call), U the (N, K) shared tile: each B fragment
// is loaded once for all slices.
template <class T, int K, int N, int S>
__device__ __forceinline__ void gemm_abt_slices(float (&acc)[S][N / 8][4], const T* sA, int lda, const T* sU,
                                                int ldu) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const uint32_t a_base = smem_addr(sA) + uint32_t((((lane & 7) + 8 * (i & 1)) * lda + 8 * (i >> 1)) * sizeof(T));
  const uint32_t b_base = smem_addr(sU) + uint32_t((((lane & 7) + 8 * (i >> 1)) * ldu + 8 * (i & 1)) * sizeof(T));
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) {
    uint32_t a[S][4];
#pragma unroll
    for (int sl = 0; sl < S; ++sl) ldmatrix_x4(a[sl], a_base + uint32_t((sl * 16 * lda + kc * 16) * sizeof(T)));
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_base + uint32_t((np * 16 * ldu + kc * 16) * sizeof(T)));
#pragma unroll
      for (int sl = 0; sl < S; ++sl) {
        mma16816<T>(acc[sl][2 * np], a[sl], b[0], b[1]);
        mma16816<T>(acc[sl][2 * np + 1], a[sl], b[2], b[3]);
      }
    }
  }
}

// acc[i] += P_i W for the warp's S slices (P_i in C registers), each B
// fragment of W (read transposed) loaded once for all slices.
template <class T, int N, int HS, int S>
__device__ __forceinline__ void gemm_pw_slices(float (&acc)[S][HS / 8][4], const float (&p)[S][N / 8][4],
                                               const T* sW, int ldw) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const uint32_t base = smem_addr(sW) + uint32_t((((lane & 7) + 8 * (i & 1)) * ldw + 8 * (i >> 1)) * sizeof(T));
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    uint32_t a[S][4];
#pragma unroll
    for (int sl = 0; sl < S; ++sl) pack_a_from_c<T, N / 8>(a[sl], p[sl], j);
#pragma unroll
    for (int dp = 0; dp < HS / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + uint32_t((j * 16 * ldw + dp * 16) * sizeof(T)));
#pragma unroll
      for (int sl = 0; sl < S; ++sl) {
        mma16816<T>(acc[sl][2 * dp], a[sl], b[0], b[1]);
        mma16816<T>(acc[sl][2 * dp + 1], a[sl], b[2], b[3]);
      }
    }
  }
}

template <class T, int HS>
__global__ void __launch_bounds__(kThreads) flash2_fwd_kernel(FwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  constexpr int LT = ld_tile<HS>(), S = fwd_slices<HS>(), TQ = fwd_tile_q<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (TQ, LT)
  T* sK = sQ + TQ * LT;                // 2 x (kTileK, LT)
  T* sV = sK + 2 * kTileK * LT;        // 2 x (kTileK, LT)

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int bh = blockIdx.x, h = bh % p.NH;
  const int64_t b = bh / p.NH;
  const int64_t nq = (p.T_ + TQ - 1) / TQ;
  const int64_t q0 = (nq - 1 - blockIdx.y) * TQ;  // heaviest (last) query tiles first
  const int kh = h / (p.NH / p.NKV);
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS;
  const T* gQ = p.qkv + b * p.T_ * W + int64_t(h) * HS;
  const T* gK = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const T* gV = gK + int64_t(p.NKV) * HS;
  const int64_t last = imin64(q0 + TQ - 1, p.T_ - 1);
  const int n_kv = int(last / kTileK) + 1;
  // Key tiles from here on reach past the tile's first row (or past T) and
  // are masked; the ones before are entirely visible.
  const int first_masked = int(q0 / kTileK);

  cp_async_tile<T, TQ, HS>(sQ, gQ + q0 * W, W, int(imin64(TQ, p.T_ - q0)));
  cp_async_tile<T, kTileK, HS>(sK, gK, W, int(imin64(kTileK, p.T_)));
  cp_async_tile<T, kTileK, HS>(sV, gV, W, int(imin64(kTileK, p.T_)));
  cp_async_commit();

  // The thread's rows: q_lo[i] and q_lo[i] + 8 of slice i.
  const T* sQw = sQ + warp * 16 * S * LT;
  int64_t q_lo[S];
  uint64_t drow[S][2];
  float o[S][HS / 8][4], m[S][2], l[S][2];
#pragma unroll
  for (int sl = 0; sl < S; ++sl) {
    q_lo[sl] = q0 + (warp * S + sl) * 16 + (lane >> 2);
    zero_acc(o[sl]);
    for (int r = 0; r < 2; ++r) {
      m[sl][r] = -INFINITY;
      l[sl][r] = 0.f;
      drow[sl][r] = p.drop.p != 0.f
                        ? dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, q_lo[sl] + 8 * r)
                        : 0;
    }
  }
  uint32_t qa[HS / 16][4];  // S == 1: the Q fragments, loaded once

  for (int j = 0; j < n_kv; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kv) {  // prefetch tile j + 1 into the other buffer
      const int64_t kv1 = int64_t(j + 1) * kTileK;
      const int rows = int(imin64(kTileK, p.T_ - kv1));
      cp_async_tile<T, kTileK, HS>(sK + (buf ^ 1) * kTileK * LT, gK + kv1 * W, W, rows);
      cp_async_tile<T, kTileK, HS>(sV + (buf ^ 1) * kTileK * LT, gV + kv1 * W, W, rows);
      cp_async_commit();
      cp_async_wait<1>();  // tile j (and Q) have landed; j + 1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* K = sK + buf * kTileK * LT;
    const T* V = sV + buf * kTileK * LT;
    const int64_t kv0 = int64_t(j) * kTileK;
    float s[S][kTileK / 8][4];
#pragma unroll
    for (int sl = 0; sl < S; ++sl) zero_acc(s[sl]);
    if constexpr (S == 1) {
      if (j == 0) load_a_frags<HS>(qa, sQw, LT * int(sizeof(T)));
      gemm_abt<T, HS, kTileK>(s[0], qa, K, LT);
    } else {
      gemm_abt_slices<T, HS, kTileK, S>(s, sQw, LT, K, LT);
    }
#pragma unroll
    for (int sl = 0; sl < S; ++sl) {
      if (j >= first_masked) mask_tile(s[sl], q_lo[sl], kv0, p.T_);
      softmax_tile<T, HS>(p, s[sl], o[sl], m[sl], l[sl], drow[sl], kv0);
    }
    gemm_pw_slices<T, kTileK, HS, S>(o, s, V, LT);
    __syncthreads();  // buffer `buf` is refilled by the prefetch of the next iteration
  }

  // Rows g and g + 8 have separate l: scale each half of the accumulator.
  const int t = lane & 3;
  T* gO = p.out + b * p.T_ * int64_t(p.NH) * HS + int64_t(h) * HS;
#pragma unroll
  for (int sl = 0; sl < S; ++sl)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t q = q_lo[sl] + 8 * r;
      if (q >= p.T_) continue;
      const float inv = 1.0f / l[sl][r];
      T* out = gO + q * int64_t(p.NH) * HS + 2 * t;
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<T>(o[sl][n][2 * r] * inv, o[sl][n][2 * r + 1] * inv);
      if (t == 0) p.lse[(b * p.NH + h) * p.T_ + q] = m[sl][r] * p.scale + logf(l[sl][r]);
    }
}

template <class T, int HS>
std::string launch_fwd(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  if (sh.B * sh.NH > int64_t(0x7fffffff)) return "B * NH beyond the grid limit";  // grid.x = (b, head)
  auto kernel = flash2_fwd_kernel<T, HS>;
  const size_t smem = fwd_smem<HS>();
  if (std::string why = flash::prepare_smem(kernel, smem); !why.empty()) return why;
  FwdParams<T> p{a.out.data<T>(), a.lse.data<float>(), a.qkv.data<T>(), sh.T, sh.NH, sh.NKV, int(sh.B),
                 1.0f / sqrtf(float(HS)), a.dropout, dropout_threshold(a.dropout.p), dropout_scale(a.dropout.p)};
  dim3 grid(unsigned(sh.B * sh.NH), unsigned((sh.T + fwd_tile_q<HS>() - 1) / fwd_tile_q<HS>()));
  kernel<<<grid, kThreads, smem, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  return "";
}

}  // namespace
}  // namespace flash2

std::string flash2_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  if (std::string why = flash_unsupported(sh, a.qkv.dtype(), {&a.qkv, &a.out}); !why.empty()) return why;
  const bool b16 = a.qkv.dtype() == DType::BF16;
  if (sh.HS == 64)
    return b16 ? flash2::launch_fwd<bf16, 64>(a, sh, s) : flash2::launch_fwd<f16, 64>(a, sh, s);
  return b16 ? flash2::launch_fwd<bf16, 128>(a, sh, s) : flash2::launch_fwd<f16, 128>(a, sh, s);
}

}  // namespace ds::cuda
