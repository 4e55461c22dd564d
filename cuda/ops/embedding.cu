// Token (+ learned position) embedding forward and a deterministic backward.
//
// Forward: out row n = wte row (tokens[n] - vocab_start), or 0 for another
// rank's token, + wpe row (n % T + pos_offset). One thread per 16-byte vector
// of out (VW channels of one token; the wte/wpe reads in their own widths)
// when C is a multiple of VW and out, wte and wpe all start aligned (they may
// be views into a flat parameter buffer at any offset, checked per call),
// else one element per thread. The same f32 sum per element on both paths:
// the bits do not depend on which one ran.
// wte backward (the default, EmbeddingBackward::Sorted): the call's tokens
// are bucketed by vocabulary row once, then each row's gradient is summed
// from its own positions only: O(N*C) work instead of the scan kernel's
// O(V/32 * N).
//  1. Bucketing: a stable LSD radix sort of (row, position) pairs, 8 bits a
//     pass (2 passes up to 65535 local rows). A pass is a per-tile digit
//     histogram, one exclusive scan of the (digit, tile) table, and a stable
//     scatter: each warp walks its 256 consecutive tokens 32 at a time,
//     ranking equal digits with __match_any_sync, so a token's slot depends
//     only on the tokens before it. Integer counts only, no atomics on the
//     output order: the result is the same permutation on every run, with
//     positions ascending inside a row. Tokens outside this rank's vocabulary
//     shard (vocab-parallel) get the key Vlocal and sort to the end.
//  2. Sums: the sorted pairs are cut into tiles of kSumTile. A block sums
//     each run of equal rows in its tile (dout rows in ascending position,
//     16-byte vectors over C). A run that is a whole row is added to dwte at
//     once; a row crossing tile boundaries leaves per-tile partial sums (the
//     piece that starts it, the pieces that continue it), and a second kernel
//     adds them in tile order. No float atomics: bit-identical run to run.
// The bucketing runs once per call: one call per micro-batch, whose tokens
// are not reused, so there is nothing to cache across calls.
// The scan kernel (EmbeddingBackward::Scan, kept as the benchmark baseline):
// each block owns kRows vocab rows x kThreads channels, scans all tokens in
// order and adds the dout rows of its own tokens in position order.
// dwpe: one thread per (t, VW channels) sums over the batch in order and adds
// the sum to dwpe; vectors under the forward's conditions (dout and dwpe),
// else VW = 1. Bit-identical either way.
#include <atomic>

#include "cuda/core/allocator.h"
#include "cuda/core/vec.cuh"
#include "cuda/cuda_api.h"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

std::atomic<int> g_emb_bwd{static_cast<int>(EmbeddingBackward::Sorted)};

constexpr int kThreads = 256;
constexpr int kRows = 32;

template <class T> struct EmbFwdParams {
  T* out;                 // (B, T, C)
  const int32_t* tokens;  // (B, T)
  AnyPtr wte;             // (Vlocal, C)
  AnyPtr wpe;             // (maxT, C) or null
  int64_t N, T_, C, Vlocal, vocab_start, pos_offset;
};

// One thread per VW consecutive channels of one token (VW divides C, so a
// vector never leaves its row). VW = 1 is the element-by-element path; both
// compute y = wte (or 0 for another rank's token) + wpe in f32 per element.
template <class T, int VW>
__global__ void embedding_forward_kernel(EmbFwdParams<T> p) {
  const int64_t nvec = p.N * p.C / VW;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < nvec;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = j * VW, n = i / p.C, c = i - n * p.C;
    const int64_t v = int64_t(p.tokens[n]) - p.vocab_start;
    float y[VW];
    if (v >= 0 && v < p.Vlocal) {
      load_any<VW>(p.wte, v * p.C + c, y);
    } else {
#pragma unroll
      for (int k = 0; k < VW; ++k) y[k] = 0.f;
    }
    if (p.wpe.p) {
      float w[VW];
      load_any<VW>(p.wpe, (n % p.T_ + p.pos_offset) * p.C + c, w);
#pragma unroll
      for (int k = 0; k < VW; ++k) y[k] += w[k];
    }
    store_f<VW>(p.out, i, y);
  }
}

// ---- wte backward, scan kernel (baseline) -----------------------------------

template <class T> struct WteBwdParams {
  AnyPtr dwte;            // (Vlocal, C) +=
  const T* dout;          // (N, C)
  const int32_t* tokens;  // (N)
  int64_t N, C, Vlocal, vocab_start;
};

// grid: (ceil(Vlocal / kRows), ceil(C / kThreads)), block: kThreads.
template <class T>
__global__ void wte_backward_scan_kernel(WteBwdParams<T> p) {
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

// ---- wte backward, bucketing: stable radix sort of (row, position) ----------

constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kSortThreads = 256;
constexpr int kSortWarps = kSortThreads / 32;
constexpr int kSortTile = 2048;                      // tokens per block
constexpr int kPerWarp = kSortTile / kSortWarps;     // consecutive tokens per warp
constexpr int kScanThreads = 1024;

struct SortPass {
  const int32_t* tokens;    // (N) first pass: keys come from the tokens, values are positions
  const int32_t* keys_in;   // (N) later passes
  const int32_t* vals_in;   // (N)
  int32_t* keys_out;        // (N)
  int32_t* vals_out;        // (N)
  int32_t* table;           // (kBins, ntiles): digit counts, then their exclusive prefix
  int64_t N, vocab_start, Vlocal;
  int shift, ntiles;
};

// Local row of token i, or Vlocal when another rank owns it.
__device__ __forceinline__ int32_t sort_key(const SortPass& p, int64_t i) {
  if (!p.tokens) return p.keys_in[i];
  const int64_t v = int64_t(p.tokens[i]) - p.vocab_start;
  return int32_t(v >= 0 && v < p.Vlocal ? v : p.Vlocal);
}
__device__ __forceinline__ int32_t sort_val(const SortPass& p, int64_t i) {
  return p.tokens ? int32_t(i) : p.vals_in[i];
}

// grid: ntiles, block: kSortThreads. table[d][tile] = count of digit d in the tile.
__global__ void sort_histogram_kernel(SortPass p) {
  __shared__ int hist[kBins];
  for (int d = threadIdx.x; d < kBins; d += blockDim.x) hist[d] = 0;
  __syncthreads();
  const int64_t t0 = int64_t(blockIdx.x) * kSortTile;
  const unsigned below = (1u << (threadIdx.x & 31)) - 1u;
  // Warp-aggregated integer counts (order-free): one shared atomic per
  // distinct digit in a warp, so a frequent token does not serialise a tile.
  for (int64_t i = t0 + threadIdx.x; i < t0 + kSortTile; i += blockDim.x) {
    const int d = i < p.N ? (sort_key(p, i) >> p.shift) & (kBins - 1) : kBins;
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    if (d < kBins && (peers & below) == 0) atomicAdd(&hist[d], __popc(peers));
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kBins; d += blockDim.x) p.table[int64_t(d) * p.ntiles + blockIdx.x] = hist[d];
}

// One block: exclusive prefix sum of the n table entries in place. Thread t
// owns a contiguous slice; the slices' totals are scanned across the block.
__global__ void exclusive_scan_kernel(int32_t* a, int64_t n) {
  __shared__ int32_t warp_tot[kScanThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t b = min(n, tid * per), e = min(n, b + per);
  int32_t s = 0;
  for (int64_t i = b; i < e; ++i) s += a[i];
  int32_t incl = s;  // inclusive scan of s over the warp
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  int32_t run = incl - s;
  for (int w = 0; w < warp; ++w) run += warp_tot[w];
  for (int64_t i = b; i < e; ++i) {
    const int32_t c = a[i];
    a[i] = run;
    run += c;
  }
}

// grid: ntiles, block: kSortThreads. Stable scatter of the tile: warp w owns
// tokens [w*kPerWarp, (w+1)*kPerWarp) of the tile; slot = the digit's offset
// for the tile + the counts of earlier warps + the rank inside the warp.
__global__ void sort_scatter_kernel(SortPass p) {
  __shared__ int base[kSortWarps][kBins];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = threadIdx.x; d < kBins; d += blockDim.x)
    for (int w = 0; w < kSortWarps; ++w) base[w][d] = 0;
  __syncthreads();
  const int64_t w0 = int64_t(blockIdx.x) * kSortTile + int64_t(warp) * kPerWarp;
  const unsigned below = (1u << lane) - 1u;
  for (int s = 0; s < kPerWarp; s += 32) {  // this warp's count of each digit
    const int64_t i = w0 + s + lane;
    const int d = i < p.N ? (sort_key(p, i) >> p.shift) & (kBins - 1) : kBins;
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    if (d < kBins && (peers & below) == 0) base[warp][d] += __popc(peers);
    __syncwarp();  // the next step's first lane of a group may be another lane
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kBins; d += blockDim.x) {
    int run = p.table[int64_t(d) * p.ntiles + blockIdx.x];
    for (int w = 0; w < kSortWarps; ++w) {
      const int c = base[w][d];
      base[w][d] = run;
      run += c;
    }
  }
  __syncthreads();
  for (int s = 0; s < kPerWarp; s += 32) {
    const int64_t i = w0 + s + lane;
    const int32_t key = i < p.N ? sort_key(p, i) : 0;
    const int d = i < p.N ? (key >> p.shift) & (kBins - 1) : kBins;
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    if (d < kBins) {
      const int slot = base[warp][d] + __popc(peers & below);
      p.keys_out[slot] = key;
      p.vals_out[slot] = sort_val(p, i);
    }
    __syncwarp();  // every lane has read base[warp][d] before its group's first lane moves it
    if (d < kBins && (peers & below) == 0) base[warp][d] += __popc(peers);
    __syncwarp();
  }
}

// ---- wte backward, sums over the sorted pairs -------------------------------

constexpr int kSumTile = 32;      // sorted pairs per block
constexpr int kSumThreads = 128;  // each owns V channels

template <class T> struct WteSumParams {
  AnyPtr dwte;           // (Vlocal, C) +=
  const T* dout;         // (N, C)
  const int32_t* keys;   // (N) sorted rows; Vlocal: another rank's token
  const int32_t* pos;    // (N) positions, ascending within a row
  float* first;          // (ntiles, C) a tile's first run when its row began in an earlier tile
  float* last;           // (ntiles, C) a tile's last run when it begins its row and the row goes on
  int64_t N, C, Vlocal;
  int ntiles;
};

template <int V> __device__ __forceinline__ void add_to_row(AnyPtr dst, int64_t i, const float (&acc)[V]) {
  float x[V];
  load_any<V>(dst, i, x);
#pragma unroll
  for (int k = 0; k < V; ++k) x[k] += acc[k];
  store_any<V>(dst, i, x);
}

// Sum of dout rows pos[b..e) (ascending) over channels [c, c + V).
template <int V, class T>
__device__ __forceinline__ void sum_rows(const T* dout, const int32_t* pos, int b, int e, int64_t C, int64_t c,
                                         float (&acc)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
#pragma unroll 4
  for (int j = b; j < e; ++j) {
    float x[V];
    load_f<V>(dout, int64_t(pos[j]) * C + c, x);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += x[k];
  }
}

// grid: (ntiles, ceil(C / (kSumThreads*V))), block: kSumThreads.
template <class T, int V>
__global__ void wte_tile_sum_kernel(WteSumParams<T> p) {
  __shared__ int32_t keys[kSumTile], pos[kSumTile];
  const int64_t k0 = int64_t(blockIdx.x) * kSumTile;
  const int n = int(min(int64_t(kSumTile), p.N - k0));
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    keys[j] = p.keys[k0 + j];
    pos[j] = p.pos[k0 + j];
  }
  __syncthreads();
  const int64_t c = (int64_t(blockIdx.y) * kSumThreads + threadIdx.x) * V;
  if (c >= p.C) return;
  for (int b = 0; b < n;) {
    const int32_t row = keys[b];
    int e = b + 1;
    while (e < n && keys[e] == row) ++e;
    if (row < p.Vlocal) {
      float acc[V];
      sum_rows<V>(p.dout, pos, b, e, p.C, c, acc);
      const bool starts = k0 + b == 0 || p.keys[k0 + b - 1] != row;
      const bool ends = k0 + e == p.N || p.keys[k0 + e] != row;
      if (starts && ends) add_to_row<V>(p.dwte, int64_t(row) * p.C + c, acc);
      else store_f<V>(starts ? p.last : p.first, int64_t(blockIdx.x) * p.C + c, acc);
    }
    b = e;
  }
}

// grid: (ntiles, ceil(C / (kSumThreads*V))), block: kSumThreads. For a tile
// whose last run begins a row that continues: that run + the continuing
// tiles' first runs, in tile order, added to dwte.
template <class T, int V>
__global__ void wte_span_sum_kernel(WteSumParams<T> p) {
  const int64_t t = blockIdx.x, k0 = t * kSumTile, k1 = min(p.N, k0 + kSumTile);
  const int64_t c = (int64_t(blockIdx.y) * kSumThreads + threadIdx.x) * V;
  if (c >= p.C || k1 >= p.N) return;
  const int32_t row = p.keys[k1 - 1];
  if (row >= p.Vlocal || p.keys[k1] != row) return;                        // no run continues
  if (p.keys[k0] == row && k0 > 0 && p.keys[k0 - 1] == row) return;        // began before this tile
  float acc[V], x[V];
  load_f<V>(p.last, t * p.C + c, acc);
  for (int64_t u = t + 1; u < p.ntiles; ++u) {
    load_f<V>(p.first, u * p.C + c, x);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += x[k];
    const int64_t next = (u + 1) * kSumTile;
    if (next >= p.N || p.keys[next] != row) break;
  }
  add_to_row<V>(p.dwte, int64_t(row) * p.C + c, acc);
}

// Workspace of the sorted path, carved from the stream's Ops workspace.
struct SortBuffers {
  int32_t *keys[2], *vals[2], *table;
  float *first, *last;
  int sort_tiles, sum_tiles;
};

size_t align_up(size_t b) { return (b + 255) / 256 * 256; }

SortBuffers sort_buffers(int64_t N, int64_t C, const Stream& s) {
  SortBuffers sb;
  sb.sort_tiles = int((N + kSortTile - 1) / kSortTile);
  sb.sum_tiles = int((N + kSumTile - 1) / kSumTile);
  const size_t pairs = align_up(size_t(N) * 4), table = align_up(size_t(kBins) * sb.sort_tiles * 4);
  const size_t partial = align_up(size_t(sb.sum_tiles) * C * 4);
  char* w = static_cast<char*>(stream_workspace(s, 4 * pairs + table + 2 * partial));
  for (int k = 0; k < 2; ++k) {
    sb.keys[k] = reinterpret_cast<int32_t*>(w + (2 * k) * pairs);
    sb.vals[k] = reinterpret_cast<int32_t*>(w + (2 * k + 1) * pairs);
  }
  sb.table = reinterpret_cast<int32_t*>(w + 4 * pairs);
  sb.first = reinterpret_cast<float*>(w + 4 * pairs + table);
  sb.last = reinterpret_cast<float*>(w + 4 * pairs + table + partial);
  return sb;
}

// Sorts the call's (row, position) pairs; returns the buffer index holding them.
int bucket_tokens(const int32_t* tokens, int64_t N, int64_t Vlocal, int64_t vocab_start, const SortBuffers& sb,
                  const Stream& s) {
  int bits = 1;  // keys are in [0, Vlocal]
  while ((int64_t(1) << bits) <= Vlocal) ++bits;
  const int passes = (bits + kDigitBits - 1) / kDigitBits;
  int cur = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const int in = pass == 0 ? 0 : cur, out = pass == 0 ? 0 : 1 - cur;
    SortPass p{pass == 0 ? tokens : nullptr, sb.keys[in], sb.vals[in], sb.keys[out], sb.vals[out], sb.table, N,
               vocab_start, Vlocal, pass * kDigitBits, sb.sort_tiles};
    sort_histogram_kernel<<<sb.sort_tiles, kSortThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
    exclusive_scan_kernel<<<1, kScanThreads, 0, stream_of(s)>>>(sb.table, int64_t(kBins) * sb.sort_tiles);
    DS_CUDA_CHECK_LAUNCH();
    sort_scatter_kernel<<<sb.sort_tiles, kSortThreads, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
    cur = out;
  }
  return cur;
}

template <class T, int V> void launch_sums(const WteSumParams<T>& p, const Stream& s) {
  const dim3 grid(unsigned(p.ntiles), unsigned((p.C + kSumThreads * V - 1) / (kSumThreads * V)));
  wte_tile_sum_kernel<T, V><<<grid, kSumThreads, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
  wte_span_sum_kernel<T, V><<<grid, kSumThreads, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

template <class T>
void wte_backward_sorted(const EmbeddingBwdArgs& a, int64_t N, int64_t C, int64_t V, const Stream& s) {
  const SortBuffers sb = sort_buffers(N, C, s);
  const int k = bucket_tokens(a.tokens.data<int32_t>(), N, V, a.vocab_start, sb, s);
  WteSumParams<T> p{any_ptr(a.dwte), a.dout.data<T>(), sb.keys[k], sb.vals[k], sb.first, sb.last, N, C, V,
                    sb.sum_tiles};
  constexpr int W = vec_width(sizeof(T));
  // Vectors need every dout row and dwte row aligned (the partials are ours).
  const bool vec = rows_vectorisable(a.dout.raw(), sizeof(T), C, W) &&
                   rows_vectorisable(a.dwte.raw(), int(dtype_size(a.dwte.dtype())), C, W);
  if (vec) launch_sums<T, W>(p, s);
  else launch_sums<T, 1>(p, s);
}

template <class T>
void wte_backward_scan(const EmbeddingBwdArgs& a, int64_t N, int64_t C, int64_t V, const Stream& s) {
  WteBwdParams<T> p{any_ptr(a.dwte), a.dout.data<T>(), a.tokens.data<int32_t>(), N, C, V, a.vocab_start};
  dim3 grid(unsigned((V + kRows - 1) / kRows), unsigned((C + kThreads - 1) / kThreads));
  wte_backward_scan_kernel<T><<<grid, kThreads, 0, stream_of(s)>>>(p);
  DS_CUDA_CHECK_LAUNCH();
}

// One thread per VW consecutive channels of one position (VW divides C):
// the batch's dout rows summed in order b = 0..B-1, then added to dwpe.
template <class T, int VW>
__global__ void wpe_backward_kernel(AnyPtr dwpe /* (maxT, C) += */, const T* dout /* (B, T, C) */,
                                    int64_t B, int64_t T_, int64_t C, int64_t pos_offset) {
  const int64_t nvec = T_ * C / VW;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < nvec;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = j * VW, t = i / C, c = i - t * C;
    float s[VW], x[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) s[k] = 0.f;
    for (int64_t b = 0; b < B; ++b) {
      load_f<VW>(dout, (b * T_ + t) * C + c, x);
#pragma unroll
      for (int k = 0; k < VW; ++k) s[k] += x[k];
    }
    add_to_row<VW>(dwpe, (t + pos_offset) * C + c, s);
  }
}

}  // namespace

void set_embedding_backward(EmbeddingBackward a) { g_emb_bwd.store(static_cast<int>(a)); }
EmbeddingBackward embedding_backward_algorithm() { return static_cast<EmbeddingBackward>(g_emb_bwd.load()); }

void embedding_forward(const EmbeddingArgs& a, const Stream& s) {
  const char* op = "embedding_forward";
  int64_t Bn = a.tokens.size(0), Tn = a.tokens.size(1), N = Bn * Tn;
  int64_t V = a.wte.size(0), C = a.wte.size(1);
  DS_CUDA_REQUIRE((a.pad_row < 0 || !a.lengths.defined()) && !a.shifts.defined(), std::string(op) + ": padding positions (lengths, shifts) run on the CPU backend only");
  if (N * C == 0) return;
  dispatch_float(a.out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EmbFwdParams<T> p{a.out.data<T>(), a.tokens.data<int32_t>(), any_ptr(a.wte), any_ptr(a.wpe),
                      N, Tn, C, V, a.vocab_start, a.row_offset + a.pos_offset};
    // Vectors when every row of out, wte and wpe starts aligned (the tables
    // may be views into a flat parameter buffer at any offset).
    constexpr int W = vec_width(sizeof(T));
    const bool vec = rows_vectorisable(a.out.raw(), sizeof(T), C, W) &&
                     rows_vectorisable(a.wte.raw(), elem_bytes(p.wte), C, W) &&
                     rows_vectorisable(a.wpe.defined() ? a.wpe.raw() : nullptr, elem_bytes(p.wpe), C, W);
    if (vec)
      embedding_forward_kernel<T, W><<<grid_for(N * C / W, 256), 256, 0, stream_of(s)>>>(p);
    else
      embedding_forward_kernel<T, 1><<<grid_for(N * C, 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward(const EmbeddingBwdArgs& a, const Stream& s) {
  const char* op = "embedding_backward";
  int64_t Bn = a.tokens.size(0), Tn = a.tokens.size(1), N = Bn * Tn;
  int64_t V = a.dwte.size(0), C = a.dwte.size(1);
  // Mixed precision: bf16/f16 dout with f32 dwte/dwpe (AnyPtr).
  DS_CUDA_REQUIRE((a.pad_row < 0 || !a.lengths.defined()) && !a.shifts.defined(), std::string(op) + ": padding positions (lengths, shifts) run on the CPU backend only");
  expect_grad(a.dwte, a.dout.dtype(), op, "dwte");
  if (a.dwpe.defined()) expect_grad(a.dwpe, a.dout.dtype(), op, "dwpe");
  DS_CUDA_REQUIRE(N < (int64_t(1) << 31) && V < (int64_t(1) << 31) - 1, std::string(op) + ": too many tokens or rows");
  if (N * C == 0) return;
  dispatch_float(a.dout.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (V > 0) {
      if (embedding_backward_algorithm() == EmbeddingBackward::Scan) wte_backward_scan<T>(a, N, C, V, s);
      else wte_backward_sorted<T>(a, N, C, V, s);
    }
    if (a.dwpe.defined()) {
      constexpr int W = vec_width(sizeof(T));
      const AnyPtr dwpe = any_ptr(a.dwpe);
      if (rows_vectorisable(a.dout.raw(), sizeof(T), C, W) && rows_vectorisable(a.dwpe.raw(), elem_bytes(dwpe), C, W))
        wpe_backward_kernel<T, W><<<grid_for(Tn * C / W, 256), 256, 0, stream_of(s)>>>(
            dwpe, a.dout.data<T>(), Bn, Tn, C, a.row_offset + a.pos_offset);
      else
        wpe_backward_kernel<T, 1><<<grid_for(Tn * C, 256), 256, 0, stream_of(s)>>>(
            dwpe, a.dout.data<T>(), Bn, Tn, C, a.row_offset + a.pos_offset);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::cuda
