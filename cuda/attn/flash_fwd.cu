// Fused causal flash attention forward (FA2 scheme): one block per (query tile,
// head, batch); the block walks the key/value tiles up to the diagonal, keeps a
// running row max m and row sum l, rescales its output accumulator and adds
// P V, so no T x T matrix exists anywhere. Saves lse = m + log(l) per row.
// Grouped-query attention: query head h reads kv head h / (NH / NKV).
// S = Q K^T and P V run on tensor cores (WMMA); softmax runs in f32 on a
// per-warp shared-memory copy of S. Lanes 2r and 2r+1 own row r of the warp.
// Attention dropout is applied in-kernel to P before P V (l sums the undropped
// probabilities), with the hashed mask of lib/ops/dropout_mask.h.
#include "cuda/attn/flash_common.cuh"

namespace ds::cuda {
namespace flash {
namespace {

template <class T> struct FwdParams {
  T* out;           // (B, T, NH*HS)
  float* lse;       // (B, NH, T)
  const T* qkv;     // (B, T, (NH+2*NKV)*HS)
  int64_t T_;
  int NH, NKV;
  float scale;
  DropoutSpec drop;
  uint32_t threshold;
  float dscale;
};

template <int HS> struct FwdSmem {
  static constexpr size_t tile = sizeof(uint16_t) * kTile * ld_tile<HS>();  // Q, K, V each
  static constexpr size_t s = sizeof(float) * kWarps * 16 * kLdS;
  static constexpr size_t p = sizeof(uint16_t) * kWarps * 16 * kLdP;
  static constexpr size_t o = sizeof(float) * kWarps * 16 * ld_out<HS>();
  static constexpr size_t total = 3 * tile + s + p + o;
};

// Online-softmax update of row r (columns [half*32, half*32+32)) of this
// warp's score tile: masks, updates m and l, writes P (16-bit) and returns the
// factor by which the row's previous output must be scaled.
template <class T>
__device__ __forceinline__ float softmax_update(const FwdParams<T>& p, float* S, T* P, int r, int half,
                                                int64_t qrow, int64_t kv0, uint64_t drop_row, float& m,
                                                float& l) {
  const int64_t T_ = p.T_;
  const float scale = p.scale;
  float* Sr = S + r * kLdS;
  float mx = -INFINITY;
  for (int c = half * 32; c < half * 32 + 32; ++c) {
    int64_t kv = kv0 + c;
    float s = (kv > qrow || kv >= T_) ? -INFINITY : Sr[c] * scale;
    Sr[c] = s;
    mx = fmaxf(mx, s);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  float m_new = fmaxf(m, mx);  // finite: key 0 of the first tile is always visible
  float alpha = expf(m - m_new);
  float sum = 0.f;
  T* Pr = P + r * kLdP;
  for (int c = half * 32; c < half * 32 + 32; ++c) {
    float pv = expf(Sr[c] - m_new);
    sum += pv;
    if (p.drop.p != 0.f) pv *= dropout_factor(drop_row, kv0 + c, p.threshold, p.dscale);
    Pr[c] = from_f<T>(pv);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

template <class T, int HS>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(FwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LT = ld_tile<HS>(), LO = ld_out<HS>();
  T* sQ = reinterpret_cast<T*>(smem);                 // (kTile, LT)
  T* sK = sQ + kTile * LT;                            // (kTile, LT)
  T* sV = sK + kTile * LT;                            // (kTile, LT)
  float* sS = reinterpret_cast<float*>(sV + kTile * LT);  // (kWarps, 16, kLdS)
  T* sP = reinterpret_cast<T*>(sS + kWarps * 16 * kLdS);  // (kWarps, 16, kLdP)
  float* sO = reinterpret_cast<float*>(sP + kWarps * 16 * kLdP);  // (kWarps, 16, LO)

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const int64_t q0 = int64_t(blockIdx.x) * kTile, b = blockIdx.z;
  const int h = blockIdx.y, kh = h / (p.NH / p.NKV);
  const int64_t W = int64_t(p.NH + 2 * p.NKV) * HS;
  const T* gQ = p.qkv + b * p.T_ * W + int64_t(h) * HS;
  const T* gK = p.qkv + b * p.T_ * W + int64_t(p.NH + kh) * HS;
  const T* gV = gK + int64_t(p.NKV) * HS;
  const int64_t qrow = q0 + warp * 16 + r;
  float* S = sS + warp * 16 * kLdS;
  T* P = sP + warp * 16 * kLdP;
  float* O = sO + warp * 16 * LO;

  load_tile<T, HS>(sQ, gQ + q0 * W, W, int(imin64(kTile, p.T_ - q0)));
  for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) O[r * LO + c] = 0.f;
  float m = -INFINITY, l = 0.f;
  const uint64_t drop_row =
      p.drop.p != 0.f ? dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, qrow) : 0;
  const int64_t last = imin64(q0 + kTile - 1, p.T_ - 1);
  for (int64_t kv0 = 0; kv0 <= last; kv0 += kTile) {
    __syncthreads();  // everyone is done with the previous K/V tile
    int rows = int(imin64(kTile, p.T_ - kv0));
    load_tile<T, HS>(sK, gK + kv0 * W, W, rows);
    load_tile<T, HS>(sV, gV + kv0 * W, W, rows);
    __syncthreads();
    for (int n = 0; n < kTile / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      mma_abt<T, HS>(acc, sQ + warp * 16 * LT, LT, sK + n * 16 * LT, LT);
      wmma::store_matrix_sync(S + n * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    float alpha = softmax_update(p, S, P, r, half, qrow, kv0, drop_row, m, l);
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) O[r * LO + c] *= alpha;
    __syncwarp();
    for (int n = 0; n < HS / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, O + n * 16, LO, wmma::mem_row_major);
      mma_ab<T, kTile>(acc, P, kLdP, sV + n * 16, LT);
      wmma::store_matrix_sync(O + n * 16, acc, LO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qrow < p.T_) {
    T* out = p.out + (b * p.T_ + qrow) * int64_t(p.NH) * HS + int64_t(h) * HS;
    float inv = 1.0f / l;
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c)
      out[c] = from_f<T>(O[r * LO + c] * inv);
    if (half == 0) p.lse[(b * p.NH + h) * p.T_ + qrow] = m + logf(l);
  }
}

template <class T, int HS>
std::string launch_fwd(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  auto kernel = flash_fwd_kernel<T, HS>;
  if (std::string why = prepare_smem(kernel, FwdSmem<HS>::total); !why.empty()) return why;
  FwdParams<T> p{a.out.data<T>(), a.lse.data<float>(), a.qkv.data<T>(), sh.T, sh.NH, sh.NKV,
                 1.0f / sqrtf(float(HS)), a.dropout, dropout_threshold(a.dropout.p), dropout_scale(a.dropout.p)};
  dim3 grid(unsigned((sh.T + kTile - 1) / kTile), unsigned(sh.NH), unsigned(sh.B));
  kernel<<<grid, kThreads, FwdSmem<HS>::total, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  return "";
}

template <class T>
std::string launch_fwd_hs(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  return sh.HS == 64 ? launch_fwd<T, 64>(a, sh, s) : launch_fwd<T, 128>(a, sh, s);
}

}  // namespace
}  // namespace flash

std::string flash_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  if (std::string why = flash_unsupported(sh, a.qkv.dtype(), {&a.qkv, &a.out}); !why.empty()) return why;
  return a.qkv.dtype() == DType::BF16 ? flash::launch_fwd_hs<bf16>(a, sh, s) : flash::launch_fwd_hs<f16>(a, sh, s);
}

}  // namespace ds::cuda
