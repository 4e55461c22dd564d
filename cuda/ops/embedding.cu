// Token (+ learned position) embedding forward and a deterministic backward.
// Backward for wte: each block owns kRows vocab rows x kThreads channels and
// keeps their sums in shared memory. It scans all tokens in order, compacts
// the ones that fall in its rows (warp ballots keep position order), and adds
// their dout rows in position order, so results repeat bit for bit with no
// float atomics. dwpe: one thread per (t, c) sums over the batch in order.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 32;

template <class T> struct EmbFwdParams {
  T* out;                 // (B, T, C)
  const int32_t* tokens;  // (B, T)
  AnyPtr wte;             // (Vlocal, C)
  AnyPtr wpe;             // (maxT, C) or null
  int64_t N, T_, C, Vlocal, vocab_start, pos_offset;
};

template <class T>
__global__ void embedding_forward_kernel(EmbFwdParams<T> p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.N * p.C;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n = i / p.C, c = i - n * p.C;
    int64_t v = int64_t(p.tokens[n]) - p.vocab_start;
    float y = (v >= 0 && v < p.Vlocal) ? load(p.wte, v * p.C + c) : 0.f;
    if (p.wpe.p) y += load(p.wpe, (n % p.T_ + p.pos_offset) * p.C + c);
    p.out[i] = from_f<T>(y);
  }
}

template <class T> struct WteBwdParams {
  AnyPtr dwte;            // (Vlocal, C) +=
  const T* dout;          // (N, C)
  const int32_t* tokens;  // (N)
  int64_t N, C, Vlocal, vocab_start;
};

// grid: (ceil(Vlocal / kRows), ceil(C / kThreads)), block: kThreads.
template <class T>
__global__ void wte_backward_kernel(WteBwdParams<T> p) {
  __shared__ float acc[kRows][kThreads];
  __shared__ int match_pos[kThreads];
  __shared__ int match_row[kThreads];
  __shared__ int warp_count[kThreads / 32];
  __shared__ int touched[kRows];
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int64_t r0 = int64_t(blockIdx.x) * kRows;
  int64_t c = int64_t(blockIdx.y) * kThreads + tid;
  for (int r = 0; r < kRows; ++r) acc[r][tid] = 0.f;
  if (tid < kRows) touched[tid] = 0;
  for (int64_t base = 0; base < p.N; base += kThreads) {
    int64_t i = base + tid;
    int row = -1;
    if (i < p.N) {
      int64_t v = int64_t(p.tokens[i]) - p.vocab_start - r0;
      if (v >= 0 && v < kRows && r0 + v < p.Vlocal) row = int(v);
    }
    unsigned ballot = __ballot_sync(0xffffffffu, row >= 0);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) offset += warp_count[w];
      total += warp_count[w];
    }
    if (row >= 0) {
      int k = offset + __popc(ballot & ((1u << lane) - 1u));
      match_pos[k] = int(i);
      match_row[k] = row;
      touched[row] = 1;
    }
    __syncthreads();
    if (c < p.C)
      for (int k = 0; k < total; ++k)
        acc[match_row[k]][tid] += to_f(p.dout[int64_t(match_pos[k]) * p.C + c]);
    __syncthreads();
  }
  if (c >= p.C) return;
  for (int r = 0; r < kRows; ++r) {
    if (!touched[r] || r0 + r >= p.Vlocal) continue;
    int64_t idx = (r0 + r) * p.C + c;
    store(p.dwte, idx, load(p.dwte, idx) + acc[r][tid]);
  }
}

template <class T>
__global__ void wpe_backward_kernel(AnyPtr dwpe /* (maxT, C) += */, const T* dout /* (B, T, C) */,
                                    int64_t B, int64_t T_, int64_t C, int64_t pos_offset) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T_ * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / C, c = i - t * C;
    float s = 0.f;
    for (int64_t b = 0; b < B; ++b) s += to_f(dout[(b * T_ + t) * C + c]);
    int64_t idx = (t + pos_offset) * C + c;
    store(dwpe, idx, load(dwpe, idx) + s);
  }
}

}  // namespace

void embedding_forward(const EmbeddingArgs& a, const Stream& s) {
  const char* op = "embedding_forward";
  int64_t Bn = a.tokens.size(0), Tn = a.tokens.size(1), N = Bn * Tn;
  int64_t V = a.wte.size(0), C = a.wte.size(1);
  if (N * C == 0) return;
  dispatch_float(a.out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EmbFwdParams<T> p{a.out.data<T>(), a.tokens.data<int32_t>(), any_ptr(a.wte), any_ptr(a.wpe),
                      N, Tn, C, V, a.vocab_start, a.pos_offset};
    embedding_forward_kernel<T><<<grid_for(N * C, 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward(const EmbeddingBwdArgs& a, const Stream& s) {
  const char* op = "embedding_backward";
  int64_t Bn = a.tokens.size(0), Tn = a.tokens.size(1), N = Bn * Tn;
  int64_t V = a.dwte.size(0), C = a.dwte.size(1);
  // Mixed precision: bf16/f16 dout with f32 dwte/dwpe (AnyPtr).
  expect_grad(a.dwte, a.dout.dtype(), op, "dwte");
  if (a.dwpe.defined()) expect_grad(a.dwpe, a.dout.dtype(), op, "dwpe");
  DS_CUDA_REQUIRE(N < (int64_t(1) << 31), std::string(op) + ": too many tokens");
  if (N * C == 0) return;
  dispatch_float(a.dout.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (V > 0) {
      WteBwdParams<T> p{any_ptr(a.dwte), a.dout.data<T>(), a.tokens.data<int32_t>(), N, C, V,
                        a.vocab_start};
      dim3 grid(unsigned((V + kRows - 1) / kRows), unsigned((C + kThreads - 1) / kThreads));
      wte_backward_kernel<T><<<grid, kThreads, 0, stream_of(s)>>>(p);
      DS_CUDA_CHECK_LAUNCH();
    }
    if (a.dwpe.defined()) {
      wpe_backward_kernel<T><<<grid_for(Tn * C, 256), 256, 0, stream_of(s)>>>(
          any_ptr(a.dwpe), a.dout.data<T>(), Bn, Tn, C, a.pos_offset);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::cuda
