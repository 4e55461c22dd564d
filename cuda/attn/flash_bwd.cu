// Fused causal flash attention backward (FA2 scheme, no T x T matrix, no
// atomics). Three kernels:
//  1. D_i = dout_i . out_i per (b, h, i) row (f32 workspace).
//  2. dK, dV: one block per (key tile, kv head, batch) walks, for each query
//     head of the kv head's group in turn (grouped-query attention), the
//     query tiles at and after the diagonal; each warp owns 16 key rows and
//     computes S^T, P^T, dP^T and dS^T for them, accumulating dV += P^T dO and
//     dK += dS^T Q in tensor-core fragments.
//  3. dQ: one block per (query tile, head, batch) walks the key tiles up to
//     the diagonal, recomputes P and dS, and accumulates dQ += dS K.
// P is recomputed exactly from the saved lse, so no rescaling is needed.
// Attention dropout redraws the forward's mask factor m per (query, key):
// dV += (P m)^T dO, dS = P (m dP - D) (lib/ops/dropout_mask.h).
#include "cuda/attn/flash_common.cuh"
#include "cuda/core/allocator.h"

namespace ds::cuda {
namespace flash {
namespace {

template <class T> struct BwdParams {
  T* dqkv;            // (B, T, (NH+2*NKV)*HS)
  const T* dout;      // (B, T, NH*HS)
  const T* out;       // (B, T, NH*HS)
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

// The dropout factor of probability (query q, key kv) of head h in batch b.
template <class T>
__device__ __forceinline__ float drop_factor(const BwdParams<T>& p, int64_t b, int h, int64_t q, int64_t kv) {
  if (p.drop.p == 0.f) return 1.f;
  return dropout_factor(dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, q), kv, p.threshold,
                        p.dscale);
}

template <int HS> struct BwdSmem {
  static constexpr size_t tile = sizeof(uint16_t) * kTile * ld_tile<HS>();  // 4 tiles
  static constexpr size_t f = sizeof(float) * kWarps * 16 * kLdS;           // 2 f32 buffers
  static constexpr size_t p = sizeof(uint16_t) * kWarps * 16 * kLdP;        // 2 16-bit buffers
  static constexpr size_t rows = sizeof(float) * 2 * kTile;                 // lse, D
  static constexpr size_t total = 4 * tile + 2 * f + 2 * p + rows;
  // The f32 staging of one warp's (16, HS) result must fit in two tiles.
  static_assert(sizeof(float) * kWarps * 16 * (HS + 4) <= 2 * tile, "staging does not fit");
};

// One warp per (b, t, h) row: D = sum_d dout * out.
template <class T>
__global__ void flash_d_kernel(float* Drow /* (B, NH, T) */, const T* dout /* (B, T, NH*HS) */,
                               const T* out /* (B, T, NH*HS) */, int64_t rows, int64_t T_,
                               int NH, int HS) {
  int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bt = row / NH;
  int h = int(row - bt * NH);
  const T* g = dout + bt * int64_t(NH) * HS + int64_t(h) * HS;
  const T* o = out + bt * int64_t(NH) * HS + int64_t(h) * HS;
  float s = 0.f;
  for (int d = lane; d < HS; d += 32) s += to_f(g[d]) * to_f(o[d]);
  s = warp_sum(s);
  int64_t b = bt / T_, t = bt - b * T_;
  if (lane == 0) Drow[(b * NH + h) * T_ + t] = s;
}

// Loads lse and D for query rows [q0, q0 + kTile) (0 beyond T).
__device__ __forceinline__ void load_rows(float* sL, float* sD, const float* lse, const float* D,
                                          int64_t q0, int64_t T_) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    bool ok = q0 + i < T_;
    sL[i] = ok ? lse[q0 + i] : 0.f;
    sD[i] = ok ? D[q0 + i] : 0.f;
  }
}

// Writes a warp's (16, HS) f32 fragments, times `mul`, as rows [row0, row0+16)
// of a T-typed global matrix (row stride `stride`), via shared staging.
template <class T, int HS>
__device__ __forceinline__ void store_rows(FragC (&acc)[HS / 16], float mul, float* stage,
                                           T* g, int64_t stride, int64_t row0, int64_t T_) {
  constexpr int LO = ld_out<HS>();
  for (int n = 0; n < HS / 16; ++n) {
    for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= mul;
    wmma::store_matrix_sync(stage + n * 16, acc[n], LO, wmma::mem_row_major);
  }
  __syncwarp();
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < 16 * HS; e += 32) {
    int r = e / HS, c = e - r * HS;
    if (row0 + r < T_) g[(row0 + r) * stride + c] = from_f<T>(stage[r * LO + c]);
  }
}

template <class T, int HS>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(BwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LT = ld_tile<HS>();
  T* sK = reinterpret_cast<T*>(smem);  // (kTile, LT) each
  T* sV = sK + kTile * LT;
  T* sQ = sV + kTile * LT;
  T* sG = sQ + kTile * LT;             // dout tile
  float* sS = reinterpret_cast<float*>(sG + kTile * LT);  // (kWarps, 16, kLdS): S^T, then P^T
  float* sDP = sS + kWarps * 16 * kLdS;                    // (kWarps, 16, kLdS): dP^T
  T* sP = reinterpret_cast<T*>(sDP + kWarps * 16 * kLdS);  // (kWarps, 16, kLdP)
  T* sDS = sP + kWarps * 16 * kLdP;                        // (kWarps, 16, kLdP)
  float* sL = reinterpret_cast<float*>(sDS + kWarps * 16 * kLdP);
  float* sD = sL + kTile;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t kv0 = int64_t(blockIdx.x) * kTile, b = blockIdx.z;
  const int kh = blockIdx.y, G = p.NH / p.NKV;
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS, WO = int64_t(p.NH) * HS, WKV = int64_t(p.NKV) * HS;
  const T* gK = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const T* gV = gK + WKV;
  float* S = sS + warp * 16 * kLdS;
  float* DP = sDP + warp * 16 * kLdS;
  T* P = sP + warp * 16 * kLdP;
  T* DS = sDS + warp * 16 * kLdP;

  int kv_rows = int(imin64(kTile, p.T_ - kv0));
  load_tile<T, HS>(sK, gK + kv0 * W, W, kv_rows);
  load_tile<T, HS>(sV, gV + kv0 * W, W, kv_rows);
  FragC dK[HS / 16], dV[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dK[n], 0.f);
    wmma::fill_fragment(dV[n], 0.f);
  }
  for (int h = kh * G; h < (kh + 1) * G; ++h) {
    const T* gQ = p.qkv + b * p.T_ * W + int64_t(h) * HS;
    const T* gG = p.dout + b * p.T_ * WO + int64_t(h) * HS;
    const float* lse = p.lse + (b * p.NH + h) * p.T_;
    const float* D = p.Drow + (b * p.NH + h) * p.T_;
    for (int64_t q0 = kv0; q0 < p.T_; q0 += kTile) {
      __syncthreads();  // previous Q/dO tiles no longer in use (and K/V loaded)
      int q_rows = int(imin64(kTile, p.T_ - q0));
      load_tile<T, HS>(sQ, gQ + q0 * W, W, q_rows);
      load_tile<T, HS>(sG, gG + q0 * WO, WO, q_rows);
      load_rows(sL, sD, lse, D, q0, p.T_);
      __syncthreads();
      for (int n = 0; n < kTile / 16; ++n) {
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
        mma_abt<T, HS>(acc, sK + warp * 16 * LT, LT, sQ + n * 16 * LT, LT);  // S^T
        wmma::store_matrix_sync(S + n * 16, acc, kLdS, wmma::mem_row_major);
        wmma::fill_fragment(acc, 0.f);
        mma_abt<T, HS>(acc, sV + warp * 16 * LT, LT, sG + n * 16 * LT, LT);  // dP^T
        wmma::store_matrix_sync(DP + n * 16, acc, kLdS, wmma::mem_row_major);
      }
      __syncwarp();
      for (int e = lane; e < 16 * kTile; e += 32) {
        int rr = e / kTile, c = e - rr * kTile;
        int64_t kv = kv0 + warp * 16 + rr, q = q0 + c;
        bool valid = q < p.T_ && kv <= q;
        float pv = valid ? expf(S[rr * kLdS + c] * p.scale - sL[c]) : 0.f;
        float md = valid ? drop_factor(p, b, h, q, kv) : 0.f;
        P[rr * kLdP + c] = from_f<T>(pv * md);
        DS[rr * kLdP + c] = from_f<T>(pv * (md * DP[rr * kLdS + c] - sD[c]));
      }
      __syncwarp();
      for (int n = 0; n < HS / 16; ++n) {
        mma_ab<T, kTile>(dV[n], P, kLdP, sG + n * 16, LT);
        mma_ab<T, kTile>(dK[n], DS, kLdP, sQ + n * 16, LT);
      }
    }
  }  // query heads of the group
  __syncthreads();  // Q/dO tiles become the f32 staging area
  float* stage = reinterpret_cast<float*>(sQ) + warp * 16 * ld_out<HS>();
  T* dK_g = p.dqkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  store_rows<T, HS>(dK, p.scale, stage, dK_g, W, kv0 + warp * 16, p.T_);
  __syncwarp();
  store_rows<T, HS>(dV, 1.0f, stage, dK_g + WKV, W, kv0 + warp * 16, p.T_);
}

template <class T, int HS>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(BwdParams<T> p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LT = ld_tile<HS>();
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTile * LT;
  T* sQ = sV + kTile * LT;
  T* sG = sQ + kTile * LT;
  float* sS = reinterpret_cast<float*>(sG + kTile * LT);
  float* sDP = sS + kWarps * 16 * kLdS;
  T* sDS = reinterpret_cast<T*>(sDP + kWarps * 16 * kLdS);
  float* sL = reinterpret_cast<float*>(sDS + 2 * kWarps * 16 * kLdP);
  float* sD = sL + kTile;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q0 = int64_t(blockIdx.x) * kTile, b = blockIdx.z;
  const int h = blockIdx.y, kh = h / (p.NH / p.NKV);
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS, WO = int64_t(p.NH) * HS;
  const T* gQ = p.qkv + b * p.T_ * W + int64_t(h) * HS;
  const T* gK = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const T* gV = gK + int64_t(p.NKV) * HS;
  const T* gG = p.dout + b * p.T_ * WO + int64_t(h) * HS;
  // The block's one head: its dropout key, with a per-step key in memory read once.
  uint64_t head_key = 0;
  if (p.drop.p != 0.f) {
    const DropoutSpec d = dropout_resolve(p.drop);
    head_key = dropout_attn_head(d.stream, d.sample0 + b, d.head0 + h);
  }
  float* S = sS + warp * 16 * kLdS;
  float* DP = sDP + warp * 16 * kLdS;
  T* DS = sDS + warp * 16 * kLdP;

  int q_rows = int(imin64(kTile, p.T_ - q0));
  load_tile<T, HS>(sQ, gQ + q0 * W, W, q_rows);
  load_tile<T, HS>(sG, gG + q0 * WO, WO, q_rows);
  load_rows(sL, sD, p.lse + (b * p.NH + h) * p.T_, p.Drow + (b * p.NH + h) * p.T_, q0, p.T_);
  FragC dQ[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dQ[n], 0.f);
  const int64_t last = imin64(q0 + kTile - 1, p.T_ - 1);
  for (int64_t kv0 = 0; kv0 <= last; kv0 += kTile) {
    __syncthreads();
    int kv_rows = int(imin64(kTile, p.T_ - kv0));
    load_tile<T, HS>(sK, gK + kv0 * W, W, kv_rows);
    load_tile<T, HS>(sV, gV + kv0 * W, W, kv_rows);
    __syncthreads();
    for (int n = 0; n < kTile / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      mma_abt<T, HS>(acc, sQ + warp * 16 * LT, LT, sK + n * 16 * LT, LT);  // S
      wmma::store_matrix_sync(S + n * 16, acc, kLdS, wmma::mem_row_major);
      wmma::fill_fragment(acc, 0.f);
      mma_abt<T, HS>(acc, sG + warp * 16 * LT, LT, sV + n * 16 * LT, LT);  // dP
      wmma::store_matrix_sync(DP + n * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * kTile; e += 32) {
      int rr = e / kTile, c = e - rr * kTile;
      int ql = warp * 16 + rr;
      int64_t q = q0 + ql, kv = kv0 + c;
      bool valid = q < p.T_ && kv <= q;
      float pv = valid ? expf(S[rr * kLdS + c] * p.scale - sL[ql]) : 0.f;
      float md = !valid ? 0.f
                 : p.drop.p == 0.f ? 1.f
                 : dropout_factor(dropout_attn_query(head_key, q), kv, p.threshold, p.dscale);
      DS[rr * kLdP + c] = from_f<T>(pv * (md * DP[rr * kLdS + c] - sD[ql]));
    }
    __syncwarp();
    for (int n = 0; n < HS / 16; ++n) mma_ab<T, kTile>(dQ[n], DS, kLdP, sK + n * 16, LT);
  }
  __syncthreads();  // K/V tiles become the f32 staging area
  float* stage = reinterpret_cast<float*>(sK) + warp * 16 * ld_out<HS>();
  T* dQ_g = p.dqkv + b * p.T_ * W + int64_t(h) * HS;
  store_rows<T, HS>(dQ, p.scale, stage, dQ_g, W, q0 + warp * 16, p.T_);
}

template <class T, int HS>
std::string launch_bwd(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  auto dkdv = flash_dkdv_kernel<T, HS>;
  auto dq = flash_dq_kernel<T, HS>;
  size_t smem = BwdSmem<HS>::total;
  if (std::string why = prepare_smem(dkdv, smem); !why.empty()) return why;
  if (std::string why = prepare_smem(dq, smem); !why.empty()) return why;
  int64_t rows = sh.B * sh.T * sh.NH;
  auto* Drow = static_cast<float*>(
      stream_workspace(s, sizeof(float) * size_t(rows), WorkspaceSlot::Attn));
  flash_d_kernel<T><<<grid_for(rows * 32, 256, (int64_t(1) << 31) - 1), 256, 0, stream_of(s)>>>(
      Drow, a.dout.data<T>(), a.out.data<T>(), rows, sh.T, sh.NH, HS);
  DS_CUDA_CHECK_LAUNCH();
  BwdParams<T> p{a.dqkv.data<T>(), a.dout.data<T>(), a.out.data<T>(), a.lse.data<float>(),
                 Drow, a.qkv.data<T>(), sh.T, sh.NH, sh.NKV, 1.0f / sqrtf(float(HS)), a.dropout,
                 dropout_threshold(a.dropout.p), dropout_scale(a.dropout.p)};
  dim3 grid(unsigned((sh.T + kTile - 1) / kTile), unsigned(sh.NH), unsigned(sh.B));
  dim3 kv_grid(unsigned((sh.T + kTile - 1) / kTile), unsigned(sh.NKV), unsigned(sh.B));
  dkdv<<<kv_grid, kThreads, smem, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  dq<<<grid, kThreads, smem, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  return "";
}

template <class T>
std::string launch_bwd_hs(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  return sh.HS == 64 ? launch_bwd<T, 64>(a, sh, s) : launch_bwd<T, 128>(a, sh, s);
}

}  // namespace
}  // namespace flash

std::string flash_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  if (std::string why = flash_unsupported(sh, a.qkv.dtype(), {&a.qkv, &a.dqkv, &a.dout, &a.out}); !why.empty())
    return why;
  return a.qkv.dtype() == DType::BF16 ? flash::launch_bwd_hs<bf16>(a, sh, s) : flash::launch_bwd_hs<f16>(a, sh, s);
}

}  // namespace ds::cuda
