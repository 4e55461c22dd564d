// Causal multi-head (and grouped-query) self-attention on a packed qkv
// buffer, CPU forward and backward, flash-attention style: the forward keeps
// only the log-sum-exp per (b, h, t); the backward recomputes the probabilities
// block by block.
// Work unit: a block of kBq query rows of one (b, h) against keys [0, q_end),
// with per-thread scratch of kBq x T scores; the products inside a block use
// the register-tiled tile_gemm. The forward packs K^T and V of every kv head once
// (a scratch of about 2 x B*T*NKV*HS floats kept by the calling thread) and
// then parallelises over (b, h, query block); the backward parallelises over
// (b, kv head), since the key/value gradients of one kv head gather
// contributions from all query blocks of all the query heads that share it (in
// a fixed order, so results do not depend on the thread count).
// In bf16 with the bf16 GEMM on (lib/cpu/bf16_gemm.h), lowp::attention_*
// run the same blocks with their products as bf16 GEMMs (end of this file).
// With per-sample lengths (right padding) a query also sees no key at or
// beyond its sample's length.
// Attention dropout drops probabilities after the softmax with the hashed mask
// of lib/ops/dropout_mask.h; the backward redraws it. A spec with a per-step
// key in memory (step_key) is resolved once per call.
#include <cmath>
#include <cstring>
#include <exception>

#include "lib/cpu/bf16_gemm.h"
#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"
#include "lib/cpu/tile_gemm.h"

namespace ds::cpu {
namespace {

constexpr int64_t kBq = 64;  // query rows per block

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bf16_to_f32(x); }  // bf16 bits

struct AttnDims {
  int64_t B, T, NH, HS, C;  // C = NH * HS
  int64_t NKV, G;           // kv heads, query heads per kv head
  int64_t W, koff, voff;    // packed row width (NH+2*NKV)*HS, offsets of k and v
  int64_t HSp;              // HS padded to the vector width
  float scale;              // 1 / sqrt(HS)
};

// Dimensions of a validated call (lib/ops/op_validate.cpp).
AttnDims attn_dims(const Tensor& qkv, int NH, int NKV) {
  AttnDims d;
  d.B = qkv.size(0);
  d.T = qkv.size(1);
  d.NH = NH;
  d.NKV = NKV == 0 ? NH : NKV;
  d.G = d.NH / d.NKV;
  d.HS = qkv.size(2) / (NH + 2 * d.NKV);
  d.C = NH * d.HS;
  d.W = qkv.size(2);
  d.koff = d.C;
  d.voff = d.C + d.NKV * d.HS;
  d.HSp = round_up(d.HS, kVecW);
  d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.HS)));
  return d;
}

// Leading dimension for a buffer of n-float rows: padded to the vector width
// plus one vector, so that rows are never a power-of-two apart (walking down
// a column would otherwise hit one cache set over and over).
int64_t padded_ld(int64_t n) { return round_up(n, kVecW) + kVecW; }

// dst (HS, ldd) = transpose of rows [0, n) of src (row stride ld_src), zero
// columns [n, round_up(n, kVecW)). Done in 16-row panels so that each written
// destination line is filled at once.
void pack_transposed(float* dst, int64_t ldd, const float* src, int64_t ld_src, int64_t n,
                     int64_t HS) {
  constexpr int64_t kPanel = 16;
  const int64_t np = round_up(n, kVecW);
  for (int64_t j0 = 0; j0 < np; j0 += kPanel) {
    const int64_t jn = std::min(kPanel, np - j0), jv = std::max<int64_t>(0, std::min(jn, n - j0));
    for (int64_t e = 0; e < HS; ++e) {
      float* d = dst + e * ldd + j0;
      for (int64_t jj = 0; jj < jv; ++jj) d[jj] = src[(j0 + jj) * ld_src + e];
      for (int64_t jj = jv; jj < jn; ++jj) d[jj] = 0.f;
    }
  }
}

// dst (n, HSp) = rows [0, n) of src (row stride ld_src), columns >= HS zeroed.
void pack_rows(float* dst, int64_t HSp, const float* src, int64_t ld_src, int64_t n, int64_t HS) {
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(dst + j * HSp, src + j * ld_src, HS * sizeof(float));
    for (int64_t e = HS; e < HSp; ++e) dst[j * HSp + e] = 0.f;
  }
}

// Keys a query of sample b may see at most: its length with right padding
// (AttentionArgs::lengths), else all T.
int64_t key_limit(const Tensor& lengths, int64_t b, int64_t T) {
  return lengths.defined() ? lengths.data<int32_t>()[b] : T;
}

// Row-wise causal softmax of the score block in place. Row i (query q0 + i)
// sees keys [0, min(q0 + i + 1, klen)); on return S holds probabilities with
// zeros for masked keys up to kend, and lse[i] the log-sum-exp of the scaled
// scores.
void softmax_block(float* S, int64_t lds, int64_t M, int64_t q0, int64_t kend, int64_t klen, float scale,
                   float* lse) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = S + i * lds;
    const int64_t nv = std::min(q0 + i + 1, klen);
    const float mx = row_max(row, nv) * scale;  // scale > 0
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nv; ++j) {
      const float p = fast_exp(row[j] * scale - mx);
      row[j] = p;
      sum += p;
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < nv; ++j) row[j] *= inv;
    for (int64_t j = nv; j < kend; ++j) row[j] = 0.f;
    lse[i] = mx + std::log(sum);
  }
}

// Attention dropout on probability rows [q0, q0 + M) of head h in batch b
// (keys [0, q0 + i] of row i): P *= mask / (1 - p).
void drop_probs(float* P, int64_t ld, int64_t M, int64_t q0, const DropoutSpec& d, int64_t b, int64_t h) {
  if (d.p == 0.f) return;
  const uint32_t threshold = dropout_threshold(d.p);
  const float scale = dropout_scale(d.p);
  for (int64_t i = 0; i < M; ++i) {
    const uint64_t row = dropout_attn_row(d.stream, d.sample0 + b, d.head0 + h, q0 + i);
    float* r = P + i * ld;
    for (int64_t j = 0; j <= q0 + i; ++j) r[j] *= dropout_factor(row, j, threshold, scale);
  }
}

// K transposed and V rows of every kv head, packed once per forward call and
// shared read-only by the query-block tasks.
struct PackedKV {
  const float* kt;  // (B, NKV, HS, ldT) K^T per kv head, ldT = padded_ld(T)
  const float* vp;  // (B, NKV, T, HSp) V rows per kv head, columns >= HS zero
  int64_t ldT;
};

PackedKV pack_kv(const Tensor& qkv, const AttnDims& d) {
  const int64_t ldT = padded_ld(d.T), W = d.W;
  const int64_t kt_head = d.HS * ldT, vp_head = d.T * d.HSp;
  float* buf = thread_scratch(static_cast<size_t>(d.B * d.NKV * (kt_head + vp_head)), 7);
  float* kt = buf;
  float* vp = buf + d.B * d.NKV * kt_head;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < d.B * d.NKV; ++bk) {
    const int64_t b = bk / d.NKV, kh = bk % d.NKV;
    const float* base = qkv.data<float>() + b * d.T * W + kh * d.HS;  // (T, W) at kv head kh
    pack_transposed(kt + bk * kt_head, ldT, base + d.koff, W, d.T, d.HS);
    pack_rows(vp + bk * vp_head, d.HSp, base + d.voff, W, d.T, d.HS);
  }
  return {kt, vp, ldT};
}

// Forward of one query block [q0, q0 + M) of head h in batch b.
void forward_block(const AttentionArgs& a, const AttnDims& d, const PackedKV& kv, int64_t b,
                   int64_t h, int64_t q0) {
  const int64_t M = std::min(kBq, d.T - q0), kend = q0 + M, kp = round_up(kend, kVecW);
  const int64_t W = d.W, ld = padded_ld(kend), bh = b * d.NH + h, bk = b * d.NKV + h / d.G;
  float* S = thread_scratch(static_cast<size_t>(kBq * ld), 0);      // (M, ld)
  float* ob = thread_scratch(static_cast<size_t>(kBq * d.HSp), 1);  // (M, HSp)
  TileGemm qk;  // S = Q K^T
  qk.M = M, qk.N = kp, qk.K = d.HS;
  qk.a = a.qkv.data<float>() + (b * d.T + q0) * W + h * d.HS, qk.a_rs = W, qk.a_cs = 1;
  qk.b = kv.kt + bk * d.HS * kv.ldT, qk.ldb = kv.ldT, qk.c = S, qk.ldc = ld;
  tile_gemm(qk);
  float* lse = a.lse.data<float>() + bh * d.T + q0;  // (M) of (B, NH, T)
  softmax_block(S, ld, M, q0, kend, key_limit(a.lengths, b, d.T), d.scale, lse);
  drop_probs(S, ld, M, q0, a.dropout, b, h);
  TileGemm pv;  // O = P V
  pv.M = M, pv.N = d.HSp, pv.K = kend;
  pv.a = S, pv.a_rs = ld, pv.a_cs = 1;
  pv.b = kv.vp + bk * d.T * d.HSp, pv.ldb = d.HSp, pv.c = ob, pv.ldc = d.HSp;
  tile_gemm(pv);
  float* out = a.out.data<float>() + (b * d.T + q0) * d.C + h * d.HS;  // (M, C) at head h
  for (int64_t i = 0; i < M; ++i) std::memcpy(out + i * d.C, ob + i * d.HSp, d.HS * sizeof(float));
}

}  // namespace

void attention_forward(const AttentionArgs& args, const Stream&) {
  AttentionArgs a = args;
  a.dropout = dropout_resolve(args.dropout);
  const AttnDims d = attn_dims(a.qkv, a.NH, a.NKV);
  const PackedKV kv = pack_kv(a.qkv, d);
  const int64_t nq = (d.T + kBq - 1) / kBq, ntasks = d.B * d.NH * nq;
  // Later query blocks cost more (causal): hand them out first.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int64_t qb = nq - 1 - task / (d.B * d.NH), bh = task % (d.B * d.NH);
    forward_block(a, d, kv, bh / d.NH, bh % d.NH, qb * kBq);
  }
}

// ---- backward ---------------------------------------------------------------

namespace {

// Per-thread buffers for the backward of one (b, kv head).
struct HeadScratch {
  float* kt;  // (HS, ld) K transposed, ld = padded_ld(T)
  float* vt;  // (HS, ld) V transposed
  float* krows;  // (T, HSp) K rows
  float* dk;  // (T, HSp) dK accumulator
  float* dv;  // (T, HSp) dV accumulator
  float* P;   // (kBq, ld) probabilities
  float* dS;  // (kBq, ld) dP, then dS
  float* qp;  // (kBq, HSp) Q block rows
  float* dop; // (kBq, HSp) dO block rows
  float* dq;  // (kBq, HSp) dQ block
};

HeadScratch head_scratch(const AttnDims& d) {
  const int64_t ldT = padded_ld(d.T);
  HeadScratch s;
  s.kt = thread_scratch(static_cast<size_t>(2 * d.HS * ldT), 0);
  s.vt = s.kt + d.HS * ldT;
  s.krows = thread_scratch(static_cast<size_t>(3 * d.T * d.HSp), 1);
  s.dk = s.krows + d.T * d.HSp;
  s.dv = s.dk + d.T * d.HSp;
  s.P = thread_scratch(static_cast<size_t>(kBq * ldT), 2);
  s.dS = thread_scratch(static_cast<size_t>(kBq * ldT), 3);
  s.qp = thread_scratch(static_cast<size_t>(3 * kBq * d.HSp), 4);
  s.dop = s.qp + kBq * d.HSp;
  s.dq = s.dop + kBq * d.HSp;
  return s;
}

// Recomputes P for the block and turns dP into dS = P * (dP - D) * scale.
// With attention dropout (mask factor m = 0 or 1/(1-p)) the output used
// P~ = P * m: dS = P * (m * dP~ - D) * scale, and P becomes P~ for dV; D =
// dO . O holds either way (O is the dropped output).
// D[i] = sum_e dO[i][e] * O[i][e] (f32, in e order) for the M rows of a block.
template <class T>
void row_dots(float* D, const T* dO, const T* O, int64_t ldo, int64_t M, int64_t HS) {
  for (int64_t i = 0; i < M; ++i) {
    float s = 0.f;
    for (int64_t e = 0; e < HS; ++e) s += to_float(dO[i * ldo + e]) * to_float(O[i * ldo + e]);
    D[i] = s;
  }
}

void block_probs_and_ds(float* P, float* dS, int64_t ld, int64_t M, int64_t q0, int64_t kend, int64_t klen,
                        const float* lse, const float* Dv, float scale, const DropoutSpec& drop, int64_t b,
                        int64_t h) {
  const uint32_t threshold = dropout_threshold(drop.p);
  const float dscale = dropout_scale(drop.p);
  for (int64_t i = 0; i < M; ++i) {
    float* p = P + i * ld;
    float* ds = dS + i * ld;
    const int64_t nv = std::min(q0 + i + 1, klen);
    const float l = lse[i];
    const float D = Dv[i];
    if (drop.p == 0.f) {
#pragma omp simd
      for (int64_t j = 0; j < nv; ++j) {
        const float pj = fast_exp(p[j] * scale - l);
        p[j] = pj;
        ds[j] = pj * (ds[j] - D) * scale;
      }
    } else {
      const uint64_t row = dropout_attn_row(drop.stream, drop.sample0 + b, drop.head0 + h, q0 + i);
      for (int64_t j = 0; j < nv; ++j) {
        const float pj = fast_exp(p[j] * scale - l), m = dropout_factor(row, j, threshold, dscale);
        p[j] = pj * m;
        ds[j] = pj * (m * ds[j] - D) * scale;
      }
    }
    for (int64_t j = nv; j < kend; ++j) p[j] = ds[j] = 0.f;
  }
}

void backward_block(const AttentionBwdArgs& a, const AttnDims& d, const HeadScratch& s,
                    int64_t b, int64_t h, int64_t q0) {
  const int64_t M = std::min(kBq, d.T - q0), kend = q0 + M, kp = round_up(kend, kVecW);
  const int64_t ldT = padded_ld(d.T), W = d.W;
  const float* q = a.qkv.data<float>() + (b * d.T + q0) * W + h * d.HS;     // (M, W)
  const float* dO = a.dout.data<float>() + (b * d.T + q0) * d.C + h * d.HS;  // (M, C)
  const float* O = a.out.data<float>() + (b * d.T + q0) * d.C + h * d.HS;    // (M, C)
  const float* lse = a.lse.data<float>() + (b * d.NH + h) * d.T + q0;        // (M)
  TileGemm g;  // S = Q K^T  -> P
  g.M = M, g.N = kp, g.K = d.HS, g.a = q, g.a_rs = W, g.a_cs = 1;
  g.b = s.kt, g.ldb = ldT, g.c = s.P, g.ldc = ldT;
  tile_gemm(g);
  g.a = dO, g.a_rs = d.C, g.b = s.vt, g.c = s.dS;  // dP = dO V^T
  tile_gemm(g);
  float D[kBq];
  row_dots(D, dO, O, d.C, M, d.HS);
  block_probs_and_ds(s.P, s.dS, ldT, M, q0, kend, key_limit(a.lengths, b, d.T), lse, D, d.scale, a.dropout, b, h);
  TileGemm dq;  // dQ = dS K
  dq.M = M, dq.N = d.HSp, dq.K = kend, dq.a = s.dS, dq.a_rs = ldT, dq.a_cs = 1;
  dq.b = s.krows, dq.ldb = d.HSp, dq.c = s.dq, dq.ldc = d.HSp;
  tile_gemm(dq);
  float* dqkv = a.dqkv.data<float>() + (b * d.T + q0) * W + h * d.HS;  // (M, W)
  for (int64_t i = 0; i < M; ++i)
    std::memcpy(dqkv + i * W, s.dq + i * d.HSp, d.HS * sizeof(float));
  pack_rows(s.qp, d.HSp, q, W, M, d.HS);
  pack_rows(s.dop, d.HSp, dO, d.C, M, d.HS);
  TileGemm dkv;  // dK += dS^T Q, dV += P^T dO (keys [0, kend))
  dkv.M = kend, dkv.N = d.HSp, dkv.K = M, dkv.a = s.dS, dkv.a_rs = 1, dkv.a_cs = ldT;
  dkv.b = s.qp, dkv.ldb = d.HSp, dkv.c = s.dk, dkv.ldc = d.HSp, dkv.accumulate = true;
  tile_gemm(dkv);
  dkv.a = s.P, dkv.b = s.dop, dkv.c = s.dv;
  tile_gemm(dkv);
}

// Kv head kh of batch b: the query heads of its group in order, each block
// by block, accumulating dK and dV.
void backward_kv_head(const AttentionBwdArgs& a, const AttnDims& d, int64_t b, int64_t kh) {
  const HeadScratch s = head_scratch(d);
  const int64_t ldT = padded_ld(d.T), W = d.W;
  const float* base = a.qkv.data<float>() + b * d.T * W + kh * d.HS;  // (T, W) at kv head kh
  pack_transposed(s.kt, ldT, base + d.koff, W, d.T, d.HS);
  pack_transposed(s.vt, ldT, base + d.voff, W, d.T, d.HS);
  pack_rows(s.krows, d.HSp, base + d.koff, W, d.T, d.HS);
  std::memset(s.dk, 0, 2 * d.T * d.HSp * sizeof(float));  // dk and dv
  for (int64_t h = kh * d.G; h < (kh + 1) * d.G; ++h)
    for (int64_t q0 = 0; q0 < d.T; q0 += kBq) backward_block(a, d, s, b, h, q0);
  float* dbase = a.dqkv.data<float>() + b * d.T * W + kh * d.HS;  // (T, W) at kv head kh
  for (int64_t t = 0; t < d.T; ++t) {
    std::memcpy(dbase + t * W + d.koff, s.dk + t * d.HSp, d.HS * sizeof(float));
    std::memcpy(dbase + t * W + d.voff, s.dv + t * d.HSp, d.HS * sizeof(float));
  }
}

}  // namespace

void attention_backward(const AttentionBwdArgs& args, const Stream&) {
  AttentionBwdArgs a = args;
  a.dropout = dropout_resolve(args.dropout);
  const AttnDims d = attn_dims(a.qkv, a.NH, a.NKV);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bk = 0; bk < d.B * d.NKV; ++bk) backward_kv_head(a, d, bk / d.NKV, bk % d.NKV);
}

// ---- bf16 without emulation (ds::cpu::lowp, lib/ops/op_table.h) -----------
// The same blocks and task split as above, with every product a bf16 GEMM
// (bf16 inputs, f32 sums) read straight from the strided rows of qkv, out and
// dout (nothing packed): Q K^T and P V in the forward; Q K^T, dO V^T, dS K,
// dS^T Q and P^T dO in the backward. The scores, softmax, log-sum-exp, dS and
// the dK / dV accumulators stay f32; P and dS are rounded to bf16 before they
// enter a product (as flash attention does on a GPU), and each output once.

namespace {

using Bf16 = uint16_t;

Bf16* bf16_scratch(size_t n, int slot) { return reinterpret_cast<Bf16*>(thread_scratch((n + 1) / 2, slot)); }

// dst (M rows, ldd) = bf16 of the first n columns of src (M rows, lds).
void round_rows(Bf16* dst, int64_t ldd, const float* src, int64_t lds, int64_t M, int64_t n) {
  for (int64_t i = 0; i < M; ++i) {
    Bf16* d = dst + i * ldd;
    const float* s = src + i * lds;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) d[j] = f32_to_bf16(s[j]);
  }
}

// Forward of one query block [q0, q0 + M) of head h in batch b.
void forward_block_bf16(const AttentionArgs& a, const AttnDims& d, int64_t b, int64_t h, int64_t q0) {
  const int64_t M = std::min(kBq, d.T - q0), kend = q0 + M, ld = padded_ld(kend), W = d.W, kh = h / d.G;
  const Bf16* rows = a.qkv.data<Bf16>() + b * d.T * W;  // (T, W) of batch b
  float* S = thread_scratch(static_cast<size_t>(kBq * ld), 0);      // (M, ld)
  float* ob = thread_scratch(static_cast<size_t>(kBq * d.HS), 1);   // (M, HS)
  Bf16* P = bf16_scratch(static_cast<size_t>(kBq * ld), 2);         // (M, ld)
  Bf16Gemm qk;  // S = Q K^T
  qk.M = M, qk.N = kend, qk.K = d.HS;
  qk.a = rows + q0 * W + h * d.HS, qk.a_rs = W, qk.a_cs = 1;
  qk.b = rows + d.koff + kh * d.HS, qk.b_rs = 1, qk.b_cs = W;
  qk.c = S, qk.ldc = ld;
  bf16_gemm(qk);
  float* lse = a.lse.data<float>() + (b * d.NH + h) * d.T + q0;  // (M) of (B, NH, T)
  softmax_block(S, ld, M, q0, kend, key_limit(a.lengths, b, d.T), d.scale, lse);
  drop_probs(S, ld, M, q0, a.dropout, b, h);
  round_rows(P, ld, S, ld, M, kend);
  Bf16Gemm pv;  // O = P V
  pv.M = M, pv.N = d.HS, pv.K = kend;
  pv.a = P, pv.a_rs = ld, pv.a_cs = 1;
  pv.b = rows + d.voff + kh * d.HS, pv.b_rs = W, pv.b_cs = 1;
  pv.c = ob, pv.ldc = d.HS;
  bf16_gemm(pv);
  round_rows(a.out.data<Bf16>() + (b * d.T + q0) * d.C + h * d.HS, d.C, ob, d.HS, M, d.HS);
}

// Kv head kh of batch b: the query heads of its group in order, each block
// by block, accumulating dK and dV in f32.
void backward_kv_head_bf16(const AttentionBwdArgs& a, const AttnDims& d, int64_t b, int64_t kh) {
  const int64_t ldT = padded_ld(d.T), W = d.W, HS = d.HS;
  const Bf16* rows = a.qkv.data<Bf16>() + b * d.T * W;     // (T, W)
  const Bf16* douts = a.dout.data<Bf16>() + b * d.T * d.C;  // (T, C)
  const Bf16* outs = a.out.data<Bf16>() + b * d.T * d.C;    // (T, C)
  Bf16* drows = a.dqkv.data<Bf16>() + b * d.T * W;          // (T, W)
  float* dk = thread_scratch(static_cast<size_t>(2 * d.T * HS), 0);  // (T, HS) dK, then dV
  float* dv = dk + d.T * HS;
  float* P = thread_scratch(static_cast<size_t>(kBq * ldT), 1);   // (M, ldT)
  float* dS = thread_scratch(static_cast<size_t>(kBq * ldT), 2);  // (M, ldT)
  float* dq = thread_scratch(static_cast<size_t>(kBq * HS), 3);   // (M, HS)
  Bf16* P16 = bf16_scratch(static_cast<size_t>(kBq * ldT), 4);
  Bf16* dS16 = bf16_scratch(static_cast<size_t>(kBq * ldT), 5);
  std::memset(dk, 0, 2 * d.T * HS * sizeof(float));
  const Bf16* K = rows + d.koff + kh * HS;  // (T, W) at kv head kh
  const Bf16* V = rows + d.voff + kh * HS;
  for (int64_t h = kh * d.G; h < (kh + 1) * d.G; ++h) {
    for (int64_t q0 = 0; q0 < d.T; q0 += kBq) {
      const int64_t M = std::min(kBq, d.T - q0), kend = q0 + M;
      const Bf16* Q = rows + q0 * W + h * HS;          // (M, W)
      const Bf16* dO = douts + q0 * d.C + h * HS;      // (M, C)
      Bf16Gemm g;  // S = Q K^T -> P
      g.M = M, g.N = kend, g.K = HS;
      g.a = Q, g.a_rs = W, g.a_cs = 1, g.b = K, g.b_rs = 1, g.b_cs = W, g.c = P, g.ldc = ldT;
      bf16_gemm(g);
      g.a = dO, g.a_rs = d.C, g.b = V, g.c = dS;  // dP = dO V^T
      bf16_gemm(g);
      float D[kBq];
      row_dots(D, dO, outs + q0 * d.C + h * HS, d.C, M, HS);
      const float* lse = a.lse.data<float>() + (b * d.NH + h) * d.T + q0;
      block_probs_and_ds(P, dS, ldT, M, q0, kend, key_limit(a.lengths, b, d.T), lse, D, d.scale, a.dropout, b, h);
      round_rows(P16, ldT, P, ldT, M, kend);
      round_rows(dS16, ldT, dS, ldT, M, kend);
      Bf16Gemm gq;  // dQ = dS K
      gq.M = M, gq.N = HS, gq.K = kend;
      gq.a = dS16, gq.a_rs = ldT, gq.a_cs = 1, gq.b = K, gq.b_rs = W, gq.b_cs = 1, gq.c = dq, gq.ldc = HS;
      bf16_gemm(gq);
      round_rows(drows + q0 * W + h * HS, W, dq, HS, M, HS);
      Bf16Gemm gkv;  // dK += dS^T Q, dV += P^T dO (keys [0, kend))
      gkv.M = kend, gkv.N = HS, gkv.K = M, gkv.accumulate = true;
      gkv.a = dS16, gkv.a_rs = 1, gkv.a_cs = ldT, gkv.b = Q, gkv.b_rs = W, gkv.b_cs = 1, gkv.c = dk, gkv.ldc = HS;
      bf16_gemm(gkv);
      gkv.a = P16, gkv.b = dO, gkv.b_rs = d.C, gkv.c = dv;
      bf16_gemm(gkv);
    }
  }
  round_rows(drows + d.koff + kh * HS, W, dk, HS, d.T, HS);
  round_rows(drows + d.voff + kh * HS, W, dv, HS, d.T, HS);
}

}  // namespace

bool lowp::attention_forward(const AttentionArgs& args, const Stream&) {
  if (!bf16_gemm_available() || !is_bf16(args.qkv) || !is_bf16(args.out)) return false;
  AttentionArgs a = args;
  a.dropout = dropout_resolve(args.dropout);
  const AttnDims d = attn_dims(a.qkv, a.NH, a.NKV);
  const int64_t nq = (d.T + kBq - 1) / kBq, ntasks = d.B * d.NH * nq;
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int64_t qb = nq - 1 - task / (d.B * d.NH), bh = task % (d.B * d.NH);
    try {
      forward_block_bf16(a, d, bh / d.NH, bh % d.NH, qb * kBq);
    } catch (...) {
#pragma omp critical(ds_attention_bf16_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
  return true;
}

bool lowp::attention_backward(const AttentionBwdArgs& args, const Stream&) {
  if (!bf16_gemm_available() || !is_bf16(args.qkv) || !is_bf16(args.dqkv) || !is_bf16(args.dout) ||
      !is_bf16(args.out))
    return false;
  AttentionBwdArgs a = args;
  a.dropout = dropout_resolve(args.dropout);
  const AttnDims d = attn_dims(a.qkv, a.NH, a.NKV);
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bk = 0; bk < d.B * d.NKV; ++bk) {
    try {
      backward_kv_head_bf16(a, d, bk / d.NKV, bk % d.NKV);
    } catch (...) {
#pragma omp critical(ds_attention_bf16_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
  return true;
}

}  // namespace ds::cpu
