// Plain (non-fused) causal attention, the debugging reference on the GPU.
// Forward: one block per query row (b, h, i) keeps the row's scores in shared
// memory, then softmax, lse and out = P V. Backward in two kernels with no
// atomics: per query row dq (and D_i = dout_i . out_i), then per key row of a
// kv head dk, dv by walking the query rows i >= j of every query head of its
// group (grouped-query attention) in chunks. Slow but simple.
// Attention dropout multiplies probability (i, j) by the hashed mask factor m
// (lib/ops/dropout_mask.h): out uses P*m, dS = P * (m * dP - D), dV uses P*m.
#include "cuda/attn/attention.h"
#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"
#include "cuda/core/smem.cuh"

namespace ds::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHS = 256;  // 2 accumulators per thread in the dk/dv kernel

template <class T> struct PlainFwdParams {
  T* out;           // (B, T, NH*HS)
  float* lse;       // (B, NH, T)
  const T* qkv;     // (B, T, (NH+2*NKV)*HS)
  int64_t T_;
  int NH, NKV, HS;
  float scale;
  DropoutSpec drop;
  uint32_t threshold;
  float dscale;
};

// The dropout factor of probability (query i, key j) of head h in batch b.
template <class P>
__device__ __forceinline__ float drop_factor(const P& p, int64_t b, int h, int64_t i, int64_t j) {
  if (p.drop.p == 0.f) return 1.f;
  return dropout_factor(dropout_attn_row(p.drop.stream, p.drop.sample0 + b, p.drop.head0 + h, i), j, p.threshold,
                        p.dscale);
}

// Offset of head h of part 0 (q: a query head) or 1, 2 (k, v: a kv head) of
// token t in the packed (B, T, (NH+2*NKV)*HS) buffer.
__device__ __forceinline__ int64_t qkv_off(int64_t b, int64_t t, int64_t T_, int NH, int NKV, int HS,
                                           int part, int h) {
  const int64_t col = part == 0 ? int64_t(h) * HS : int64_t(NH + (part - 1) * NKV + h) * HS;
  return (b * T_ + t) * int64_t(NH + 2 * NKV) * HS + col;
}

template <class T>
__device__ __forceinline__ float dot_row(const float* a_sh, const T* b, int HS) {
  float s = 0.f;
  for (int d = 0; d < HS; ++d) s += a_sh[d] * to_f(b[d]);
  return s;
}

// grid: (T, NH, B); dynamic smem: T floats.
template <class T>
__global__ void plain_forward_kernel(PlainFwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  extern __shared__ float sc[];  // (T) scores, then probabilities
  __shared__ float q[kMaxHS];
  int64_t i = blockIdx.x, b = blockIdx.z;
  int h = blockIdx.y, kh = h / (p.NH / p.NKV);
  const T* qr = p.qkv + qkv_off(b, i, p.T_, p.NH, p.NKV, p.HS, 0, h);
  for (int d = threadIdx.x; d < p.HS; d += kThreads) q[d] = to_f(qr[d]);
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += kThreads) {
    float v = dot_row(q, p.qkv + qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 1, kh), p.HS) * p.scale;
    sc[j] = v;
    mx = fmaxf(mx, v);
  }
  float M = block_max(mx);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j <= i; j += kThreads) {
    float e = expf(sc[j] - M);
    sc[j] = e;
    sum += e;
  }
  float S = block_sum(sum);  // also orders the sc[] writes before the reads below
  if (threadIdx.x == 0) p.lse[(b * p.NH + h) * p.T_ + i] = M + logf(S);
  if (p.drop.p != 0.f) {
    for (int64_t j = threadIdx.x; j <= i; j += kThreads) sc[j] *= drop_factor(p, b, h, i, j);
    __syncthreads();
  }
  T* o = p.out + (b * p.T_ + i) * int64_t(p.NH) * p.HS + int64_t(h) * p.HS;
  for (int d = threadIdx.x; d < p.HS; d += kThreads) {
    float acc = 0.f;
    for (int64_t j = 0; j <= i; ++j)
      acc += sc[j] * to_f(p.qkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 2, kh) + d]);
    o[d] = from_f<T>(acc / S);
  }
}

template <class T> struct PlainBwdParams {
  T* dqkv;            // (B, T, (NH+2*NKV)*HS)
  float* Drow;        // (B, NH, T) scratch: dout_i . out_i
  const T* dout;      // (B, T, NH*HS)
  const T* out;       // (B, T, NH*HS)
  const float* lse;   // (B, NH, T)
  const T* qkv;       // (B, T, (NH+2*NKV)*HS)
  int64_t T_;
  int NH, NKV, HS;
  float scale;
  DropoutSpec drop;
  uint32_t threshold;
  float dscale;
};

// grid: (T, NH, B); dynamic smem: T floats. Writes dq and Drow.
template <class T>
__global__ void plain_dq_kernel(PlainBwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  extern __shared__ float ds[];  // (T)
  __shared__ float q[kMaxHS], g[kMaxHS];
  int64_t i = blockIdx.x, b = blockIdx.z;
  int h = blockIdx.y, kh = h / (p.NH / p.NKV);
  int64_t orow = (b * p.T_ + i) * int64_t(p.NH) * p.HS + int64_t(h) * p.HS;
  const T* qr = p.qkv + qkv_off(b, i, p.T_, p.NH, p.NKV, p.HS, 0, h);
  float part = 0.f;
  for (int d = threadIdx.x; d < p.HS; d += kThreads) {
    q[d] = to_f(qr[d]);
    g[d] = to_f(p.dout[orow + d]);
    part += g[d] * to_f(p.out[orow + d]);
  }
  float Di = block_sum(part);  // also orders q[], g[] writes
  int64_t li = (b * p.NH + h) * p.T_ + i;
  float lse = p.lse[li];
  if (threadIdx.x == 0) p.Drow[li] = Di;
  for (int64_t j = threadIdx.x; j <= i; j += kThreads) {
    float s = dot_row(q, p.qkv + qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 1, kh), p.HS) * p.scale;
    float pr = expf(s - lse);
    float dp = dot_row(g, p.qkv + qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 2, kh), p.HS);
    ds[j] = pr * (drop_factor(p, b, h, i, j) * dp - Di);
  }
  __syncthreads();
  T* dq = p.dqkv + qkv_off(b, i, p.T_, p.NH, p.NKV, p.HS, 0, h);
  for (int d = threadIdx.x; d < p.HS; d += kThreads) {
    float acc = 0.f;
    for (int64_t j = 0; j <= i; ++j)
      acc += ds[j] * to_f(p.qkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 1, kh) + d]);
    dq[d] = from_f<T>(acc * p.scale);
  }
}

// grid: (T, NKV, B); one block per key row j of kv head kh, walking the
// query heads of its group in order. Needs Drow from plain_dq_kernel.
template <class T>
__global__ void plain_dkv_kernel(PlainBwdParams<T> p) {
  p.drop = dropout_resolve(p.drop);  // a per-step key in memory, read once
  __shared__ float k[kMaxHS], v[kMaxHS];
  __shared__ float pr[kThreads], ds[kThreads];
  int64_t j = blockIdx.x, b = blockIdx.z;
  int kh = blockIdx.y, G = p.NH / p.NKV;
  for (int d = threadIdx.x; d < p.HS; d += kThreads) {
    k[d] = to_f(p.qkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 1, kh) + d]);
    v[d] = to_f(p.qkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 2, kh) + d]);
  }
  __syncthreads();
  float dk[2] = {0.f, 0.f}, dv[2] = {0.f, 0.f};
  for (int h = kh * G; h < (kh + 1) * G; ++h) {
    for (int64_t i0 = j; i0 < p.T_; i0 += kThreads) {
      int64_t i = i0 + threadIdx.x;
      float pv = 0.f, dsv = 0.f;
      if (i < p.T_) {
        int64_t li = (b * p.NH + h) * p.T_ + i;
        int64_t orow = (b * p.T_ + i) * int64_t(p.NH) * p.HS + int64_t(h) * p.HS;
        const T* qr = p.qkv + qkv_off(b, i, p.T_, p.NH, p.NKV, p.HS, 0, h);
        float s = 0.f, dp = 0.f;
        for (int d = 0; d < p.HS; ++d) {
          s += to_f(qr[d]) * k[d];
          dp += to_f(p.dout[orow + d]) * v[d];
        }
        const float m = drop_factor(p, b, h, i, j);
        pv = expf(s * p.scale - p.lse[li]);
        dsv = pv * (m * dp - p.Drow[li]);
        pv *= m;
      }
      pr[threadIdx.x] = pv;
      ds[threadIdx.x] = dsv;
      __syncthreads();
      int64_t n = p.T_ - i0 < kThreads ? p.T_ - i0 : kThreads;
      for (int r = 0; r < 2; ++r) {
        int d = threadIdx.x + r * kThreads;
        if (d >= p.HS) break;
        for (int64_t t = 0; t < n; ++t) {
          int64_t i2 = i0 + t;
          dv[r] += pr[t] * to_f(p.dout[(b * p.T_ + i2) * int64_t(p.NH) * p.HS + int64_t(h) * p.HS + d]);
          dk[r] += ds[t] * to_f(p.qkv[qkv_off(b, i2, p.T_, p.NH, p.NKV, p.HS, 0, h) + d]);
        }
      }
      __syncthreads();
    }
  }
  for (int r = 0; r < 2; ++r) {
    int d = threadIdx.x + r * kThreads;
    if (d >= p.HS) break;
    p.dqkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 1, kh) + d] = from_f<T>(dk[r] * p.scale);
    p.dqkv[qkv_off(b, j, p.T_, p.NH, p.NKV, p.HS, 2, kh) + d] = from_f<T>(dv[r]);
  }
}

// A launch of `kernel` with `bytes` of dynamic shared memory (T floats of
// scores), or the clean "unsupported" line for sequences the device cannot
// hold in one block beside the kernel's static arrays.
template <class K>
void allow_smem(K kernel, size_t bytes, int64_t T, const char* op) {
  const std::string why = fit_dynamic_smem(kernel, bytes);
  DS_CUDA_REQUIRE(why.empty(), std::string(op) + ": unsupported sequence length " + std::to_string(T) +
                                   " for the plain attention kernel: it " + why);
}

}  // namespace

void plain_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  dispatch_float(a.qkv.dtype(), "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    PlainFwdParams<T> p{a.out.data<T>(), a.lse.data<float>(), a.qkv.data<T>(), sh.T, sh.NH,
                        sh.NKV, sh.HS, 1.0f / sqrtf(float(sh.HS)), a.dropout, dropout_threshold(a.dropout.p),
                        dropout_scale(a.dropout.p)};
    size_t smem = sizeof(float) * size_t(sh.T);
    allow_smem(plain_forward_kernel<T>, smem, sh.T, "attention_forward");
    dim3 grid(unsigned(sh.T), unsigned(sh.NH), unsigned(sh.B));
    plain_forward_kernel<T><<<grid, kThreads, smem, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void plain_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  auto* Drow = static_cast<float*>(
      stream_workspace(s, sizeof(float) * size_t(sh.B * sh.NH * sh.T), WorkspaceSlot::Attn));
  dispatch_float(a.qkv.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    PlainBwdParams<T> p{a.dqkv.data<T>(), Drow, a.dout.data<T>(), a.out.data<T>(),
                        a.lse.data<float>(), a.qkv.data<T>(), sh.T, sh.NH, sh.NKV, sh.HS,
                        1.0f / sqrtf(float(sh.HS)), a.dropout, dropout_threshold(a.dropout.p),
                        dropout_scale(a.dropout.p)};
    size_t smem = sizeof(float) * size_t(sh.T);
    allow_smem(plain_dq_kernel<T>, smem, sh.T, "attention_backward");
    dim3 grid(unsigned(sh.T), unsigned(sh.NH), unsigned(sh.B));
    plain_dq_kernel<T><<<grid, kThreads, smem, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
    dim3 kv_grid(unsigned(sh.T), unsigned(sh.NKV), unsigned(sh.B));
    plain_dkv_kernel<T><<<kv_grid, kThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
