// Attention against a key/value cache (incremental decoding), CUDA. Two
// kernels: kv_store copies the k and v parts of the new qkv rows into the
// cache at their positions (one thread per element); kv_attend runs one block
// per (query row, head): scores of the cache prefix into shared memory, a
// block max and sum (fixed reduction trees, so results repeat bit for bit),
// then each thread accumulates its output dims over the prefix. Decode steps
// have Tq = 1 and attend to a few thousand positions at most, which this
// handles without tiling; prefill of long prompts would want the flash kernel.
#include <cfloat>
#include <cmath>
#include <string>

#include "cuda/core/common.cuh"
#include "cuda/core/smem.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 128;

template <class T> struct KvParams {
  T* out;             // (B, Tq, NH*HS)
  T* k_cache;         // (B, Tmax, NKV*HS)
  T* v_cache;         // (B, Tmax, NKV*HS)
  const T* qkv;       // (B, Tq, (NH+2*NKV)*HS)
  const int32_t* pos; // (B)
  int64_t B, Tq, Tmax;
  int NH, NKV, HS;
  float scale;
};

template <class T>
__global__ void kv_store_kernel(KvParams<T> p) {
  const int64_t KW = int64_t(p.NKV) * p.HS, W = int64_t(p.NH + 2 * p.NKV) * p.HS;
  const int64_t total = p.B * p.Tq * KW;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % KW, row = i / KW, b = row / p.Tq, t = row % p.Tq;
    const int64_t at = p.pos[b] + t;
    if (at < 0 || at >= p.Tmax) continue;  // the caller keeps positions in range
    const T* src = p.qkv + row * W + int64_t(p.NH) * p.HS;
    p.k_cache[(b * p.Tmax + at) * KW + e] = src[e];
    p.v_cache[(b * p.Tmax + at) * KW + e] = src[KW + e];
  }
}

__device__ float block_reduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffff, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

// Block (row, h): row = b*Tq + t attends to cache positions [0, pos[b] + t].
template <class T>
__global__ void kv_attend_kernel(KvParams<T> p) {
  extern __shared__ float scores[];
  __shared__ float red[kThreads / 32];
  const int h = blockIdx.y;
  const int64_t row = blockIdx.x, b = row / p.Tq, t = row % p.Tq;
  const int64_t n = min(int64_t(p.pos[b]) + t + 1, p.Tmax);
  const int64_t KW = int64_t(p.NKV) * p.HS, W = int64_t(p.NH + 2 * p.NKV) * p.HS;
  const int kvh = h / (p.NH / p.NKV);
  const T* q = p.qkv + row * W + int64_t(h) * p.HS;
  const T* K = p.k_cache + b * p.Tmax * KW + int64_t(kvh) * p.HS;
  const T* V = p.v_cache + b * p.Tmax * KW + int64_t(kvh) * p.HS;
  float mx = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float d = 0.f;
    for (int e = 0; e < p.HS; ++e) d += to_f(q[e]) * to_f(K[j * KW + e]);
    scores[j] = d * p.scale;
    mx = fmaxf(mx, scores[j]);
  }
  mx = block_reduce(mx, red, true);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = __expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, red, false);  // also orders the score writes before the reads below
  const float inv = 1.f / sum;
  T* o = p.out + row * int64_t(p.NH) * p.HS + int64_t(h) * p.HS;
  for (int e = threadIdx.x; e < p.HS; e += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < n; ++j) acc += scores[j] * to_f(V[j * KW + e]);
    o[e] = from_f<T>(acc * inv);
  }
}

}  // namespace

void kv_attention(const KvAttentionArgs& a, const Stream& s) {
  const char* op = "kv_attention";
  const DType dt = a.qkv.dtype();
  expect_compute(a.out, dt, op, "out", "qkv");
  expect_compute(a.k_cache, dt, op, "k_cache", "qkv");
  expect_compute(a.v_cache, dt, op, "v_cache", "qkv");
  const int64_t B = a.qkv.size(0), Tq = a.qkv.size(1), Tmax = a.k_cache.size(1);
  const int NKV = a.NKV == 0 ? a.NH : a.NKV;
  const int HS = int(a.qkv.size(2) / (a.NH + 2 * NKV));
  const int64_t shared = Tmax * int64_t(sizeof(float));  // the scores of one query row
  DS_CUDA_REQUIRE(B * Tq < (int64_t(1) << 31) && a.NH < 65536, "kv_attention: grid too large");
  if (B * Tq == 0) return;
  dispatch_float(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    KvParams<T> p{a.out.data<T>(), a.k_cache.data<T>(), a.v_cache.data<T>(), a.qkv.data<T>(),
                  a.pos.data<int32_t>(), B, Tq, Tmax, a.NH, NKV, HS,
                  float(1.0 / std::sqrt(double(HS)))};
    const int64_t n_store = B * Tq * int64_t(NKV) * HS;
    kv_store_kernel<T><<<grid_for(n_store, 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
    const std::string why = fit_dynamic_smem(kv_attend_kernel<T>, size_t(shared));
    DS_CUDA_REQUIRE(why.empty(), "kv_attention: a cache of " + std::to_string(Tmax) + " positions is too long: "
                                 "the kernel holds one query's scores in shared memory and " + why);
    dim3 grid(unsigned(B * Tq), unsigned(a.NH));
    kv_attend_kernel<T><<<grid, kThreads, size_t(shared), stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::cuda
