// Linear layer (out = inp @ weight^T + bias) on the CPU via OpenBLAS sgemm.
// All CPU parallelism comes from one OpenMP pool: OpenBLAS is switched to one
// thread and each gemm is cut into tiles of its output, one sgemm call per
// tile, spread over the OpenMP threads. This avoids two thread pools spinning
// against each other between ops. Tiles are chosen from the shape alone (never
// the thread count), so results do not depend on the thread count. The bias
// gradient is a column sum done per column block in row order.
#include <cblas.h>

#include <mutex>

#include <climits>
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"
#include "lib/cpu/matmul.h"

namespace ds::cpu {
namespace {

struct MatmulDims {
  int64_t N, C, OC;
};

// Dimensions of a validated call (lib/ops/op_validate.cpp); OpenBLAS takes int.
MatmulDims matmul_dims(const char* op, const Tensor& inp, const Tensor& weight) {
  const MatmulDims d{rows_of(inp), weight.size(1), weight.size(0)};
  DS_CHECK(d.N < INT_MAX && d.C < INT_MAX && d.OC < INT_MAX, "{}: dimensions exceed BLAS int", op);
  return d;
}

// C (M, N) = op(A) (M, K) @ op(B) (K, N) + beta * C, row-major, in parallel
// over fixed output tiles.
struct Gemm {
  CBLAS_TRANSPOSE ta = CblasNoTrans, tb = CblasNoTrans;
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.f;
  float* C = nullptr;
  int64_t ldc = 0;
};

// Tiles are chosen from the shape alone (never the thread count). Each tile
// is one single-threaded sgemm that packs its own slices of op(A) and op(B),
// so packing costs about (1/bm + 1/bn) per multiply-add: tiles must be big in
// both directions.
//  - Large gemms (both output sides >= kMinSide, >= kLargeMacs multiply-adds):
//    the longer side is cut into an even number (>= 2) of pieces of at most
//    ~kSplit, the shorter side is kept whole up to kWhole. For a linear layer
//    (M = tokens) each tile then packs a disjoint slice of the weight plus the
//    small activation panel, e.g. out (512 x 2304) -> 4 tiles of 512 x 576.
//  - Small gemms: tiles start at 1024 x 1024 and are halved, larger side
//    first, down to 128 until there are at least kMinTiles of them.
constexpr int64_t kMaxTile = 1024, kMinTile = 128, kMinTiles = 64;
constexpr int64_t kMinSide = 256, kSplit = 768, kWhole = 2048, kAlign = 16;
constexpr int64_t kLargeMacs = int64_t{1} << 25;

struct Tiling {
  int64_t bm, bn, tm, tn;  // tile sizes and counts along M and N
};

// Piece length when cutting `len` into `pieces` parts, rounded up to kAlign.
int64_t piece(int64_t len, int64_t pieces) {
  const int64_t p = (len + pieces - 1) / pieces;
  return std::min(len, (p + kAlign - 1) / kAlign * kAlign);
}

Tiling choose_tiles(int64_t M, int64_t N, int64_t K) {
  Tiling t{kMaxTile, kMaxTile, 0, 0};
  auto count = [&] {
    t.tm = (M + t.bm - 1) / t.bm;
    t.tn = (N + t.bn - 1) / t.bn;
    return t.tm * t.tn;
  };
  if (std::min(M, N) >= kMinSide && static_cast<double>(M) * N * K >= kLargeMacs) {
    const int64_t lo = std::min(M, N), hi = std::max(M, N);
    int64_t cuts = std::max<int64_t>(2, (hi + kSplit - 1) / kSplit);
    cuts += cuts & 1;  // even, so two threads get equal shares
    const int64_t b_hi = piece(hi, cuts), b_lo = piece(lo, (lo + kWhole - 1) / kWhole);
    t.bm = M >= N ? b_hi : b_lo;
    t.bn = M >= N ? b_lo : b_hi;
    count();
    return t;
  }
  while (count() < kMinTiles && (t.bm > kMinTile || t.bn > kMinTile)) {
    const bool halve_m = t.bm > kMinTile && (t.bm >= t.bn || t.bn <= kMinTile);
    if (halve_m) t.bm /= 2; else t.bn /= 2;
  }
  return t;
}

void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void parallel_sgemm(const Gemm& g) {
  if (g.M == 0 || g.N == 0) return;
  blas_single_threaded();
  const Tiling tl = choose_tiles(g.M, g.N, g.K);
#pragma omp parallel for schedule(dynamic, 1) if (tl.tm * tl.tn > 1)
  for (int64_t t = 0; t < tl.tm * tl.tn; ++t) {
    const int64_t i0 = (t / tl.tn) * tl.bm, j0 = (t % tl.tn) * tl.bn;
    const int64_t mi = std::min(tl.bm, g.M - i0), nj = std::min(tl.bn, g.N - j0);
    const float* a = g.A + (g.ta == CblasNoTrans ? i0 * g.lda : i0);  // rows i0.. of op(A)
    const float* b = g.B + (g.tb == CblasNoTrans ? j0 : j0 * g.ldb);  // cols j0.. of op(B)
    cblas_sgemm(CblasRowMajor, g.ta, g.tb, static_cast<int>(mi), static_cast<int>(nj),
                static_cast<int>(g.K), 1.f, a, static_cast<int>(g.lda), b,
                static_cast<int>(g.ldb), g.beta, g.C + i0 * g.ldc + j0, static_cast<int>(g.ldc));
  }
}

}  // namespace

void matmul_forward(const MatmulArgs& a, const Stream&) {
  const char* op = "matmul_forward";
  const MatmulDims d = matmul_dims(op, a.inp, a.weight);
  const float* inp = a.inp.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();  // (OC, C)
  float* out = a.out.data<float>();  // (N, OC)
  float beta = 0.f;
  if (a.bias.defined()) {
    const float* bias = a.bias.data<float>();  // (OC)
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < d.N; ++n) std::memcpy(out + n * d.OC, bias, d.OC * sizeof(float));
    beta = 1.f;
  }
  Gemm g;  // out (N, OC) = inp (N, C) @ w^T
  g.tb = CblasTrans, g.M = d.N, g.N = d.OC, g.K = d.C;
  g.A = inp, g.lda = d.C, g.B = w, g.ldb = d.C, g.beta = beta, g.C = out, g.ldc = d.OC;
  parallel_sgemm(g);
}

void matmul_bias_grad(float* dbias /* (OC) += */, const float* dout /* (N, OC) */, int64_t N, int64_t OC) {
  constexpr int64_t kCols = 64;
  const int64_t nblocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kCols, nc = std::min(kCols, OC - c0);
    double acc[kCols] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* g = dout + n * OC + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) acc[c] += g[c];
    }
    for (int64_t c = 0; c < nc; ++c) dbias[c0 + c] = static_cast<float>(dbias[c0 + c] + acc[c]);
  }
}

// dweight may be undefined (the fused GELU backward asks for dinp only).
void matmul_backward(const MatmulBwdArgs& a, const Stream&) {
  const char* op = "matmul_backward";
  const MatmulDims d = matmul_dims(op, a.inp, a.weight);
  const float* dout = a.dout.data<float>();  // (N, OC)
  const float* w = a.weight.data<float>();   // (OC, C)
  if (d.N == 0) return;
  if (a.dinp.defined()) {
    Gemm g;  // dinp (N, C) (+)= dout (N, OC) @ w (OC, C)
    g.M = d.N, g.N = d.C, g.K = d.OC, g.A = dout, g.lda = d.OC, g.B = w, g.ldb = d.C;
    g.beta = a.accum == Accum::Add ? 1.f : 0.f, g.C = a.dinp.data<float>(), g.ldc = d.C;
    parallel_sgemm(g);
  }
  if (a.dweight.defined()) {
    Gemm g;  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    g.ta = CblasTrans, g.M = d.OC, g.N = d.C, g.K = d.N;
    g.A = dout, g.lda = d.OC, g.B = a.inp.data<float>(), g.ldb = d.C, g.beta = 1.f;
    g.C = a.dweight.data<float>(), g.ldc = d.C;
    parallel_sgemm(g);
  }
  if (a.dbias.defined()) matmul_bias_grad(a.dbias.data<float>(), dout, d.N, d.OC);
}

}  // namespace ds::cpu
