// flash2 attention backward: causal, bf16/f16, head size 64 or 128, scores,
// probabilities and gradients in registers, deterministic (no atomics).
// Three kernels:
//  1. D_i = dout_i . out_i per (b, h, i) row (f32 workspace), from which
//     dS = P (dP - D).
//  2. dK, dV: one block per (key tile of 64 rows, kv head, batch); warp w owns
//     key rows [16 w, 16 w + 16). The block streams query tiles (Q, dO, lse,
//     D; double-buffered with cp.async) from the diagonal to the end, for each
//     query head of the kv head's group in turn, so a kv head's gradient is
//     summed in a fixed order. Per tile pair it computes S^T = K Q^T and
//     dP^T = V dO^T once (C fragments), turns them into P^T and dS^T in
//     registers and accumulates dV += P^T dO and dK += dS^T Q with those
//     registers as A operands (flash2_common.cuh): 4 GEMMs.
//  3. dQ: one block per (query tile of 64 rows, head, batch), warp w owns
//     query rows [16 w, 16 w + 16); streams K, V tiles up to the diagonal,
//     recomputes S and dP and accumulates dQ += dS K: 3 GEMMs.
// So a tile pair costs 7 GEMMs (FA2 with float atomics on dQ: 5); the two
// recomputed ones buy a dQ that is bit-for-bit repeatable without atomics and
// without a (T / 64) x T x HS partial buffer; docs/cuda.md, "Attention".
// Opt-in ordered-dQ mode (Flash2Dq::Ordered, 5 GEMMs): kernel 2 also adds
// dS K to an f32 dQ accumulator in key-tile order (dq_ordered_add), kernel 3
// is replaced by a scaling copy.
// P is recomputed exactly from the saved lse (exp2 of pre-scaled scores).
// Dropout redraws the forward's mask factor md per (query, key):
// dV += (P md)^T dO, dS = P (md dP - D) (lib/ops/dropout_mask.h).
#include "cuda/attn/flash2_common.cuh"
#include "cuda/core/allocator.h"
#include "cuda/cuda_api.h"

namespace ds::cuda {
namespace flash2 {
namespace {

constexpr int kTileK = 64;  // key rows per dK/dV block and per streamed K/V tile of dQ
constexpr int kTileQ = 64;  // query rows per dQ block
// Query rows per streamed tile of the dK/dV kernel: 32 at HS 128 keeps the
// S^T and dP^T fragments (2 x 16 floats) beside the dK and dV accumulators
// (2 x 64 floats) within 255 registers.
template <int HS> constexpr int dkdv_tile_q() { return HS == 128 ? 32 : 64; }

template <class T> struct BwdParams {
  T* dqkv;            // (B, T, (NH+2*NKV)*HS)
  float* dq_acc;      // (B, NH, T, HS) f32, ordered-dQ mode only
  uint32_t* dq_turn;  // (B, NH, T / BQ tiles): key tiles that have added, ordered-dQ mode only
  const T* dout;      // (B, T, NH*HS)
  const float* lse;   // (B, NH, T)
  const float* Drow;  // (B, NH, T)
  const T* qkv;       // (B, T, (NH+2*NKV)*HS)
  int64_t T_;
  int NH, NKV;
  float scale;
  DropoutSpec drop;
  uint32_t threshold;
  float dscale;
};

// Row length of the shared dS^T tile (kTileK keys x BQ queries) of the
// ordered-dQ mode: BQ + 8 keeps ldmatrix conflict-free (80 or 144 bytes).
template <int HS> constexpr int ld_ds() { return dkdv_tile_q<HS>() + 8; }

// K, V tiles + two (Q, dO) tiles of BQ rows, per buffer BQ x (lse, D, dropout
// row key), and in ordered-dQ mode the dS^T tile.
template <int HS, bool kDq> constexpr size_t dkdv_smem() {
  constexpr int BQ = dkdv_tile_q<HS>();
  return sizeof(uint16_t) * ld_tile<HS>() * (2 * kTileK + 4 * BQ) + 2 * BQ * (2 * sizeof(float) + sizeof(uint64_t)) +
         (kDq ? sizeof(uint16_t) * kTileK * ld_ds<HS>() : 0);
}
// Q, dO tiles + two (K, V) tiles.
template <int HS> constexpr size_t dq_smem() { return sizeof(uint16_t) * ld_tile<HS>() * (2 * kTileQ + 4 * kTileK); }

// One warp per (b, t, h) row: D = sum_d dout * out, read as 16-bit pairs.
template <class T>
__global__ void flash2_d_kernel(float* Drow /* (B, NH, T) */, const T* dout /* (B, T, NH*HS) */,
                                const T* out /* (B, T, NH*HS) */, int64_t rows, int64_t T_, int NH, int HS) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t bt = row / NH;
  const int h = int(row - bt * NH);
  const T* g = dout + bt * int64_t(NH) * HS + int64_t(h) * HS;
  const T* o = out + bt * int64_t(NH) * HS + int64_t(h) * HS;
  float s = 0.f;
  for (int d = 2 * lane; d < HS; d += 64) s += to_f(g[d]) * to_f(o[d]) + to_f(g[d + 1]) * to_f(o[d + 1]);
  s = warp_sum(s);
  const int64_t b = bt / T_, t = bt - b * T_;
  if (lane == 0) Drow[(b * NH + h) * T_ + t] = s;
}

// Ordered-dQ mode, per tile pair: dQ(q0 .. q0 + BQ) += dS K for this key tile,
// added to the f32 accumulator in key-tile order. dS^T (already rounded to T,
// as the dK GEMM uses it) goes through shared memory because dQ needs it by
// query rows: warp w computes query rows 16 (w % (BQ/16)) .. + 16 and 64 of
// the HS columns (BQ 64, HS 64: 4 x 1 slices; BQ 32, HS 128: 2 x 2).
// The wait: thread 0 spins (acquire) until the tile's counter equals this
// block's key tile index j; every key tile 0 .. j-1 that contributes has then
// added its part. This is deadlock-free as long as block (., j - 1) starts no
// later than block (., j): the grid puts j in blockIdx.y, so the key tiles
// are dispatched in order (how the hardware dispatches a grid; CUDA does not
// promise it, hence opt-in until a device has run it).
template <class T, int HS>
__device__ __forceinline__ void dq_ordered_add(const BwdParams<T>& p, const T* sDS, const T* sK, int64_t bh,
                                               int64_t q0, int j) {
  constexpr int BQ = dkdv_tile_q<HS>(), kSlices = BQ / 16, DW = HS / (kWarps / kSlices), LD = ld_ds<HS>();
  static_assert(DW == 64, "each warp owns 16 query rows x 64 columns");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = lane >> 3, g = lane >> 2, t = lane & 3;
  const int m0 = 16 * (warp % kSlices), d0 = DW * (warp / kSlices);
  float acc[DW / 8][4];
  zero_acc(acc);
  // A = dS (16 queries x 16 keys) from dS^T [key][query], transposed by
  // ldmatrix: matrix i = keys k0 + 8 (i >> 1), queries m0 + 8 (i & 1).
  const uint32_t a_base = smem_addr(sDS) + uint32_t((((lane & 7) + 8 * (i >> 1)) * LD + m0 + 8 * (i & 1)) * sizeof(T));
  // B = K (keys x dims), read transposed as in gemm_pw.
  const uint32_t b_base =
      smem_addr(sK) + uint32_t((((lane & 7) + 8 * (i & 1)) * ld_tile<HS>() + d0 + 8 * (i >> 1)) * sizeof(T));
#pragma unroll
  for (int kc = 0; kc < kTileK / 16; ++kc) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, a_base + uint32_t(kc * 16 * LD * sizeof(T)));
#pragma unroll
    for (int dp = 0; dp < DW / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_base + uint32_t((kc * 16 * ld_tile<HS>() + dp * 16) * sizeof(T)));
      mma16816<T>(acc[2 * dp], a, b[0], b[1]);
      mma16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
  uint32_t* turn = p.dq_turn + bh * ((p.T_ + BQ - 1) / BQ) + q0 / BQ;
  if (threadIdx.x == 0) {
    uint32_t v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(turn) : "memory");
    } while (v != uint32_t(j));
  }
  __syncthreads();
  float* dst = p.dq_acc + (bh * p.T_ + q0 + m0) * HS + d0 + 2 * t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (q0 + m0 + g + 8 * r >= p.T_) continue;
    float* row = dst + int64_t(g + 8 * r) * HS;
#pragma unroll
    for (int n = 0; n < DW / 8; ++n) {
      float2 v = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
      if (j != 0) {  // key tile 0 contributes to every query tile first: it writes
        const float2 old = __ldcg(reinterpret_cast<const float2*>(row + 8 * n));
        v.x += old.x;
        v.y += old.y;
      }
      __stcg(reinterpret_cast<float2*>(row + 8 * n), v);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(turn), "r"(uint32_t(j + 1)) : "memory");
  }
}

// kDq: the ordered-dQ mode (5 GEMMs per tile pair; see dq_ordered_add).
template <class T, int HS, bool kDq>
__global__ void __launch_bounds__(kThreads) flash2_dkdv_kernel(BwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  constexpr int LT = ld_tile<HS>(), BQ = dkdv_tile_q<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);  // (kTileK, LT)
  T* sV = sK + kTileK * LT;            // (kTileK, LT)
  T* sQ = sV + kTileK * LT;            // 2 x (BQ, LT)
  T* sG = sQ + 2 * BQ * LT;            // 2 x (BQ, LT): dout
  uint64_t* sR = reinterpret_cast<uint64_t*>(sG + 2 * BQ * LT);  // 2 x BQ dropout row keys
  float* sL = reinterpret_cast<float*>(sR + 2 * BQ);             // 2 x BQ: lse * log2(e)
  float* sD = sL + 2 * BQ;                                       // 2 x BQ: D
  T* sDS = reinterpret_cast<T*>(sD + 2 * BQ);                    // (kTileK, ld_ds): dS^T, kDq only

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const int bk = blockIdx.x, kh = bk % p.NKV, G = p.NH / p.NKV;
  const int64_t b = bk / p.NKV;
  const int64_t kv0 = int64_t(blockIdx.y) * kTileK;  // the first key tiles see the most queries: launched first
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS, WO = int64_t(p.NH) * HS;
  T* gK = p.dqkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;  // gradient rows (written at the end)
  const T* K = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const int nqt = int((p.T_ - kv0 + BQ - 1) / BQ);  // query tiles from the diagonal on
  const int n_it = G * nqt;

  // Issues the loads of iteration `it` (query head, query tile) into buffer `buf`.
  auto issue = [&](int it, int buf) {
    const int h = kh * G + it / nqt;
    const int64_t q0 = kv0 + int64_t(it % nqt) * BQ;
    const int rows = int(imin64(BQ, p.T_ - q0));
    cp_async_tile<T, BQ, HS>(sQ + buf * BQ * LT, p.qkv + b * p.T_ * W + int64_t(h) * HS + q0 * W, W, rows);
    cp_async_tile<T, BQ, HS>(sG + buf * BQ * LT, p.dout + b * p.T_ * WO + int64_t(h) * HS + q0 * WO, WO, rows);
    for (int i = threadIdx.x; i < BQ; i += kThreads) {
      const bool ok = i < rows;
      const int64_t row = (b * p.NH + h) * p.T_ + q0 + i;
      sL[buf * BQ + i] = ok ? p.lse[row] * kLog2e : 0.f;
      sD[buf * BQ + i] = ok ? p.Drow[row] : 0.f;
      sR[buf * BQ + i] =
          p.drop.p != 0.f ? dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, q0 + i) : 0;
    }
  };

  const int kv_rows = int(imin64(kTileK, p.T_ - kv0));
  cp_async_tile<T, kTileK, HS>(sK, K + kv0 * W, W, kv_rows);
  cp_async_tile<T, kTileK, HS>(sV, K + int64_t(p.NKV) * HS + kv0 * W, W, kv_rows);
  issue(0, 0);
  cp_async_commit();

  float dk[HS / 8][4], dv[HS / 8][4];
  zero_acc(dk);
  zero_acc(dv);
  const float sl2 = p.scale * kLog2e;
  const int64_t kv_lo = kv0 + warp * 16 + (lane >> 2);  // the thread's key rows: kv_lo, kv_lo + 8
  for (int it = 0; it < n_it; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_it) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Q = sQ + buf * BQ * LT;
    const T* dO = sG + buf * BQ * LT;
    float s[BQ / 8][4], dp[BQ / 8][4];
    zero_acc(s);
    zero_acc(dp);
    {
      uint32_t a[HS / 16][4];
      load_a_frags<HS>(a, sK + warp * 16 * LT, LT * int(sizeof(T)));
      gemm_abt<T, HS, BQ>(s, a, Q, LT);  // S^T (16 keys x BQ queries)
      load_a_frags<HS>(a, sV + warp * 16 * LT, LT * int(sizeof(T)));
      gemm_abt<T, HS, BQ>(dp, a, dO, LT);  // dP^T
    }
    const int64_t q0 = kv0 + int64_t(it % nqt) * BQ;
    const float* L = sL + buf * BQ;
    const float* Dv = sD + buf * BQ;
    const uint64_t* R = sR + buf * BQ;
#pragma unroll
    for (int n = 0; n < BQ / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * t + (e & 1);
        const int64_t q = q0 + c, kv = kv_lo + 8 * (e >> 1);
        const bool valid = q < p.T_ && kv <= q;
        const float pv = valid ? exp2f(fmaf(s[n][e], sl2, -L[c])) : 0.f;
        const float md = p.drop.p != 0.f ? dropout_factor(R[c], kv, p.threshold, p.dscale) : 1.f;
        dp[n][e] = pv * (md * dp[n][e] - Dv[c]);  // dS^T
        s[n][e] = pv * md;                        // (P md)^T
      }
    gemm_pw<T, BQ, HS>(dv, s, dO, LT);
    gemm_pw<T, BQ, HS>(dk, dp, Q, LT);
    if constexpr (kDq) {
      // This warp's 16 key rows of dS^T, rounded as the dK GEMM used them.
      T* row = sDS + (warp * 16 + (lane >> 2)) * ld_ds<HS>() + 2 * t;
#pragma unroll
      for (int n = 0; n < BQ / 8; ++n) {
        *reinterpret_cast<uint32_t*>(row + 8 * n) = pack2<T>(dp[n][0], dp[n][1]);
        *reinterpret_cast<uint32_t*>(row + 8 * ld_ds<HS>() + 8 * n) = pack2<T>(dp[n][2], dp[n][3]);
      }
      __syncthreads();
      dq_ordered_add<T, HS>(p, sDS, sK, b * p.NH + kh * G + it / nqt, q0, int(blockIdx.y));
    }
    __syncthreads();  // buffer `buf` (and dS^T) are refilled by the next iteration
  }
  store_acc<T, HS>(dk, p.scale, gK, W, kv0 + warp * 16, p.T_);
  store_acc<T, HS>(dv, 1.f, gK + int64_t(p.NKV) * HS, W, kv0 + warp * 16, p.T_);
}

template <class T, int HS>
__global__ void __launch_bounds__(kThreads) flash2_dq_kernel(BwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  constexpr int LT = ld_tile<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (kTileQ, LT)
  T* sG = sQ + kTileQ * LT;            // (kTileQ, LT): dout
  T* sK = sG + kTileQ * LT;            // 2 x (kTileK, LT)
  T* sV = sK + 2 * kTileK * LT;        // 2 x (kTileK, LT)

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const int bh = blockIdx.x, h = bh % p.NH, kh = h / (p.NH / p.NKV);
  const int64_t b = bh / p.NH;
  const int64_t nq = (p.T_ + kTileQ - 1) / kTileQ;
  const int64_t q0 = (nq - 1 - blockIdx.y) * kTileQ;  // heaviest (last) query tiles first
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS, WO = int64_t(p.NH) * HS;
  const T* gK = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const T* gV = gK + int64_t(p.NKV) * HS;
  const int64_t last = imin64(q0 + kTileQ - 1, p.T_ - 1);
  const int n_kv = int(last / kTileK) + 1;

  const int q_rows = int(imin64(kTileQ, p.T_ - q0));
  cp_async_tile<T, kTileQ, HS>(sQ, p.qkv + b * p.T_ * W + int64_t(h) * HS + q0 * W, W, q_rows);
  cp_async_tile<T, kTileQ, HS>(sG, p.dout + b * p.T_ * WO + int64_t(h) * HS + q0 * WO, WO, q_rows);
  cp_async_tile<T, kTileK, HS>(sK, gK, W, int(imin64(kTileK, p.T_)));
  cp_async_tile<T, kTileK, HS>(sV, gV, W, int(imin64(kTileK, p.T_)));
  cp_async_commit();

  const int64_t q_lo = q0 + warp * 16 + (lane >> 2);  // the thread's rows: q_lo, q_lo + 8
  float lse2[2], Dr[2];
  uint64_t drow[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    const int64_t q = q_lo + 8 * r;
    const bool ok = q < p.T_;
    lse2[r] = ok ? p.lse[(b * p.NH + h) * p.T_ + q] * kLog2e : 0.f;
    Dr[r] = ok ? p.Drow[(b * p.NH + h) * p.T_ + q] : 0.f;
    if (p.drop.p != 0.f) drow[r] = dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, q);
  }
  const float sl2 = p.scale * kLog2e;
  float dq[HS / 8][4];
  zero_acc(dq);
  for (int j = 0; j < n_kv; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kv) {
      const int64_t kv1 = int64_t(j + 1) * kTileK;
      const int rows = int(imin64(kTileK, p.T_ - kv1));
      cp_async_tile<T, kTileK, HS>(sK + (buf ^ 1) * kTileK * LT, gK + kv1 * W, W, rows);
      cp_async_tile<T, kTileK, HS>(sV + (buf ^ 1) * kTileK * LT, gV + kv1 * W, W, rows);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* K = sK + buf * kTileK * LT;
    const T* V = sV + buf * kTileK * LT;
    float s[kTileK / 8][4], dp[kTileK / 8][4];
    zero_acc(s);
    zero_acc(dp);
    {
      uint32_t a[HS / 16][4];
      load_a_frags<HS>(a, sQ + warp * 16 * LT, LT * int(sizeof(T)));
      gemm_abt<T, HS, kTileK>(s, a, K, LT);  // S
      load_a_frags<HS>(a, sG + warp * 16 * LT, LT * int(sizeof(T)));
      gemm_abt<T, HS, kTileK>(dp, a, V, LT);  // dP
    }
    const int64_t kv0 = int64_t(j) * kTileK;
#pragma unroll
    for (int n = 0; n < kTileK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t q = q_lo + 8 * r, kv = kv0 + 8 * n + 2 * t + (e & 1);
        const bool valid = q < p.T_ && kv <= q;
        const float pv = valid ? exp2f(fmaf(s[n][e], sl2, -lse2[r])) : 0.f;
        const float md = p.drop.p != 0.f ? dropout_factor(drow[r], kv, p.threshold, p.dscale) : 1.f;
        dp[n][e] = pv * (md * dp[n][e] - Dr[r]);  // dS
      }
    gemm_pw<T, kTileK, HS>(dq, dp, K, LT);
    __syncthreads();
  }
  store_acc<T, HS>(dq, p.scale, p.dqkv + b * p.T_ * W + int64_t(h) * HS, W, q0 + warp * 16, p.T_);
}

// Ordered-dQ mode: dq = scale * dq_acc into the q part of dqkv, a pair per thread.
template <class T, int HS>
__global__ void flash2_dq_store_kernel(T* dqkv /* (B, T, (NH+2*NKV)*HS) */, const float* dq_acc /* (B, NH, T, HS) */,
                                       int64_t T_, int NH, int NKV, float scale) {
  const int64_t pairs = int64_t(T_) * NH * (HS / 2);
  const int64_t b = blockIdx.y;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = 2 * (idx % (HS / 2)), th = idx / (HS / 2), h = th % NH, t = th / NH;
    const float2 v = *reinterpret_cast<const float2*>(dq_acc + ((b * NH + h) * T_ + t) * HS + c);
    *reinterpret_cast<uint32_t*>(dqkv + (b * T_ + t) * int64_t(NH + 2 * NKV) * HS + h * HS + c) =
        pack2<T>(v.x * scale, v.y * scale);
  }
}

template <class T, int HS>
std::string launch_bwd(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  if (sh.B * sh.NH > int64_t(0x7fffffff)) return "B * NH beyond the grid limit";  // grid.x = (b, head)
  const bool ordered = flash2_dq_mode() == Flash2Dq::Ordered;
  auto dkdv = ordered ? flash2_dkdv_kernel<T, HS, true> : flash2_dkdv_kernel<T, HS, false>;
  const size_t dkdv_bytes = ordered ? dkdv_smem<HS, true>() : dkdv_smem<HS, false>();
  auto dq = flash2_dq_kernel<T, HS>;
  if (std::string why = flash::prepare_smem(dkdv, dkdv_bytes); !why.empty()) return why;
  if (!ordered)
    if (std::string why = flash::prepare_smem(dq, dq_smem<HS>()); !why.empty()) return why;
  // Workspace: D (B*NH*T f32), then in ordered mode the f32 dQ accumulator
  // (B*NH*T*HS) and the per-query-tile counters (zeroed here).
  constexpr int BQ = dkdv_tile_q<HS>();
  const int64_t rows = sh.B * sh.T * sh.NH;
  const size_t d_bytes = (sizeof(float) * size_t(rows) + 255) / 256 * 256;
  const size_t acc_bytes = ordered ? sizeof(float) * size_t(rows) * HS : 0;
  const size_t turn_bytes = ordered ? sizeof(uint32_t) * size_t(sh.B * sh.NH * ((sh.T + BQ - 1) / BQ)) : 0;
  auto* ws = static_cast<unsigned char*>(
      stream_workspace(s, d_bytes + acc_bytes + turn_bytes, WorkspaceSlot::Attn));
  auto* Drow = reinterpret_cast<float*>(ws);
  auto* dq_acc = ordered ? reinterpret_cast<float*>(ws + d_bytes) : nullptr;
  auto* dq_turn = ordered ? reinterpret_cast<uint32_t*>(ws + d_bytes + acc_bytes) : nullptr;
  if (ordered) DS_CUDA_CHECK(cudaMemsetAsync(dq_turn, 0, turn_bytes, stream_of(s)));
  flash2_d_kernel<T><<<grid_for(rows * 32, 256, (int64_t(1) << 31) - 1), 256, 0, stream_of(s)>>>(
      Drow, a.dout.data<T>(), a.out.data<T>(), rows, sh.T, sh.NH, HS);
  DS_CUDA_CHECK_LAUNCH();
  BwdParams<T> p{a.dqkv.data<T>(), dq_acc, dq_turn, a.dout.data<T>(), a.lse.data<float>(), Drow, a.qkv.data<T>(),
                 sh.T, sh.NH, sh.NKV, 1.0f / sqrtf(float(HS)), a.dropout, dropout_threshold(a.dropout.p),
                 dropout_scale(a.dropout.p)};
  const unsigned n_tiles = unsigned((sh.T + kTileK - 1) / kTileK);
  // Key tile j = blockIdx.y: the ordered mode relies on tile j - 1 of every
  // (batch, kv head) being dispatched before tile j.
  dkdv<<<dim3(unsigned(sh.B * sh.NKV), n_tiles), kThreads, dkdv_bytes, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  if (ordered) {
    flash2_dq_store_kernel<T, HS><<<dim3(grid_for(sh.T * sh.NH * (HS / 2), 256), unsigned(sh.B)), 256, 0,
                                    stream_of(s)>>>(a.dqkv.data<T>(), dq_acc, sh.T, sh.NH, sh.NKV, p.scale);
  } else {
    dq<<<dim3(unsigned(sh.B * sh.NH), n_tiles), kThreads, dq_smem<HS>(), stream_of(s)>>>(p);
  }
  DS_CUDA_CHECK_LAUNCH();
  return "";
}

}  // namespace
}  // namespace flash2

std::string flash2_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  if (std::string why = flash_unsupported(sh, a.qkv.dtype(), {&a.qkv, &a.dqkv, &a.dout, &a.out}); !why.empty())
    return why;
  const bool b16 = a.qkv.dtype() == DType::BF16;
  if (sh.HS == 64)
    return b16 ? flash2::launch_bwd<bf16, 64>(a, sh, s) : flash2::launch_bwd<f16, 64>(a, sh, s);
  return b16 ? flash2::launch_bwd<bf16, 128>(a, sh, s) : flash2::launch_bwd<f16, 128>(a, sh, s);
}

}  // namespace ds::cuda
