// Linear layer (out = inp @ weight^T + bias) on the CPU via OpenBLAS sgemm,
// and in bf16 (bf16 inputs, f32 accumulation) via lib/cpu/bf16_gemm.h.
// All CPU parallelism comes from one OpenMP pool: OpenBLAS is switched to one
// thread and each gemm is cut into tiles of its output, one single-threaded
// gemm call per tile, spread over the OpenMP threads. This avoids two thread
// pools spinning against each other between ops. Tiles are chosen from the
// shape alone (never the thread count), so results do not depend on the
// thread count. The bias gradient is a column sum done per column block in
// row order.
#include <cblas.h>

#include <mutex>
#include <vector>

#include <climits>
#include <cstring>

#include <exception>

#include "lib/cpu/bf16_gemm.h"
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

// Calls tile(i0, j0, mi, nj) for each output tile of an (M, N) x K gemm, on
// the OpenMP threads. An exception in a tile is rethrown after the loop.
template <class Tile>
void parallel_tiles(int64_t M, int64_t N, int64_t K, Tile&& tile) {
  if (M == 0 || N == 0) return;
  const Tiling tl = choose_tiles(M, N, K);
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1) if (tl.tm * tl.tn > 1)
  for (int64_t t = 0; t < tl.tm * tl.tn; ++t) {
    const int64_t i0 = (t / tl.tn) * tl.bm, j0 = (t % tl.tn) * tl.bn;
    try {
      tile(i0, j0, std::min(tl.bm, M - i0), std::min(tl.bn, N - j0));
    } catch (...) {
#pragma omp critical(ds_matmul_tile_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

void parallel_sgemm(const Gemm& g) {
  blas_single_threaded();
  parallel_tiles(g.M, g.N, g.K, [&](int64_t i0, int64_t j0, int64_t mi, int64_t nj) {
    const float* a = g.A + (g.ta == CblasNoTrans ? i0 * g.lda : i0);  // rows i0.. of op(A)
    const float* b = g.B + (g.tb == CblasNoTrans ? j0 : j0 * g.ldb);  // cols j0.. of op(B)
    cblas_sgemm(CblasRowMajor, g.ta, g.tb, static_cast<int>(mi), static_cast<int>(nj),
                static_cast<int>(g.K), 1.f, a, static_cast<int>(g.lda), b,
                static_cast<int>(g.ldb), g.beta, g.C + i0 * g.ldc + j0, static_cast<int>(g.ldc));
  });
}

// ---- bf16: bf16 inputs, f32 accumulation, f32 or bf16 output ----

// Where a bf16 gemm's (M, N) result goes: f32 or bf16 `out` (leading
// dimension ld), which it overwrites, or adds onto (add), or which it sets to
// bias[j] + the product (bias: f32, N values). A bf16 out is computed in an
// f32 tile (its old values or the bias first, when asked) and rounded to
// nearest even, as the emulation and the GPU kernels round what they write.
struct Bf16Out {
  void* out = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;
  bool add = false;
  const float* bias = nullptr;
};

// f32 scratch of the calling thread, n floats.
float* tile_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// g: the whole gemm's operands (c, ldc and accumulate are set per tile).
void parallel_bf16_gemm(const Bf16Gemm& g, const Bf16Out& o) {
  parallel_tiles(g.M, g.N, g.K, [&](int64_t i0, int64_t j0, int64_t mi, int64_t nj) {
    Bf16Gemm t = g;
    t.M = mi, t.N = nj;
    t.a = g.a + i0 * g.a_rs;
    t.b = g.b + j0 * g.b_cs;
    t.accumulate = o.add || o.bias;
    float* f32_out = o.dtype == DType::F32 ? static_cast<float*>(o.out) + i0 * o.ld + j0 : nullptr;
    uint16_t* bf16_out = o.dtype == DType::BF16 ? static_cast<uint16_t*>(o.out) + i0 * o.ld + j0 : nullptr;
    if (f32_out) {
      t.c = f32_out, t.ldc = o.ld;
    } else {
      t.c = tile_scratch(mi * nj), t.ldc = nj;
      if (o.add)
        for (int64_t i = 0; i < mi; ++i) {
          float* c = t.c + i * nj;
          const uint16_t* src = bf16_out + i * o.ld;
#pragma omp simd
          for (int64_t j = 0; j < nj; ++j) c[j] = bf16_to_f32(src[j]);
        }
    }
    if (o.bias)
      for (int64_t i = 0; i < mi; ++i) std::memcpy(t.c + i * t.ldc, o.bias + j0, nj * sizeof(float));
    bf16_gemm(t);
    if (bf16_out)
      for (int64_t i = 0; i < mi; ++i) {
        const float* c = t.c + i * nj;
        uint16_t* dst = bf16_out + i * o.ld;
#pragma omp simd
        for (int64_t j = 0; j < nj; ++j) dst[j] = f32_to_bf16(c[j]);
      }
  });
}

bool is_f32_or_bf16(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::F32 || t.dtype() == DType::BF16);
}

// An f32 copy of a bias vector (f32 or bf16).
std::vector<float> f32_vector(const Tensor& t) {
  std::vector<float> v(t.numel());
  if (t.dtype() == DType::F32) {
    std::memcpy(v.data(), t.data<float>(), v.size() * sizeof(float));
  } else {
    const uint16_t* p = t.data<uint16_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(p[i]);
  }
  return v;
}

const uint16_t* bf16_data(const Tensor& t) { return t.data<uint16_t>(); }

// A forward with fewer rows than this (decoding: one row per sequence) runs
// as dot products of the rows with the weight rows: a GEMM kernel would copy
// (reorder) each weight slice for a handful of rows, and the forward is bound
// by reading the weight once. In f32 (and emulated fp16) the bound is higher:
// every row's sums then come out the same whatever the number of rows, so
// generation gives the same samples at any micro-batch up to 16. (OpenBLAS
// sgemm does not promise that: on AVX2 CPUs its results for a row change
// with the number of rows of a small GEMM.)
constexpr int64_t kFewRows = 8, kFewRowsF32 = 17;

float to_f32(float x) { return x; }
float to_f32(uint16_t x) { return bf16_to_f32(x); }

// out (N, OC) = inp (N, C) @ w^T (+ bias), N < kFewRows: per block of 64
// outputs (in parallel), each row's dot product in f32 with 16 lanes (lane
// l sums the products at k = l mod 16 in k order, then the lanes in order).
// The input rows are f32 (widened once) and each 16-wide slice of a weight
// row (bf16 or f32) is widened once for all NR rows (the weights are read
// once per call).
template <int NR, class W>
void few_rows_forward_n(const float* x, const W* w, const float* bias, const Tensor& out, const MatmulDims& d) {
  constexpr int64_t kCols = 64;
  const int64_t nblocks = (d.OC + kCols - 1) / kCols, C = d.C;
  const bool out_bf16 = out.dtype() == DType::BF16;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    for (int64_t j = blk * kCols; j < std::min(d.OC, (blk + 1) * kCols); ++j) {
      const W* wj = w + j * C;
      float lanes[NR][16] = {};
      int64_t k = 0;
      for (; k + 16 <= C; k += 16) {
        float wk[16];
#pragma omp simd
        for (int l = 0; l < 16; ++l) wk[l] = to_f32(wj[k + l]);
        for (int n = 0; n < NR; ++n) {
#pragma omp simd
          for (int l = 0; l < 16; ++l) lanes[n][l] += x[n * C + k + l] * wk[l];
        }
      }
      for (; k < C; ++k)
        for (int n = 0; n < NR; ++n) lanes[n][k % 16] += x[n * C + k] * to_f32(wj[k]);
      for (int n = 0; n < NR; ++n) {
        float s = 0.f;
        for (int l = 0; l < 16; ++l) s += lanes[n][l];
        if (bias) s = bias[j] + s;
        if (out_bf16) out.data<uint16_t>()[n * d.OC + j] = f32_to_bf16(s);
        else out.data<float>()[n * d.OC + j] = s;
      }
    }
  }
}

template <int Limit, int NR = 1, class W>
void few_rows_dispatch(int64_t N, const float* x, const W* w, const float* bias, const Tensor& out,
                       const MatmulDims& d) {
  if constexpr (NR < Limit) {
    if (N == NR) return few_rows_forward_n<NR>(x, w, bias, out, d);
    return few_rows_dispatch<Limit, NR + 1>(N, x, w, bias, out, d);
  }
}

void few_rows_forward(const uint16_t* inp, const uint16_t* w, const float* bias, const Tensor& out,
                      const MatmulDims& d) {
  std::vector<float> x(static_cast<size_t>(d.N * d.C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(inp[i]);
  few_rows_dispatch<kFewRows>(d.N, x.data(), w, bias, out, d);
}

// The same with the roles of the operands swapped: out (N, OC) = inp (N, C)
// @ w^T (+ bias) with OC < kFewRows weight rows (generation's output layer:
// logits^T = the head (V, C) @ the samples' last rows^T). The few weight rows
// are widened once, each input row once per 16-wide slice, and every output
// is summed in the few-rows kernels' order (16 lanes by k mod 16, then the
// lanes in order); the input is read once, rows in parallel.
template <int NO>
void few_cols_forward_n(const uint16_t* x, const float* w, const float* bias, const Tensor& out,
                        const MatmulDims& d) {
  const int64_t C = d.C;
  const bool out_bf16 = out.dtype() == DType::BF16;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) {
    const uint16_t* xn = x + n * C;
    float lanes[NO][16] = {};
    int64_t k = 0;
    for (; k + 16 <= C; k += 16) {
      float xk[16];
#pragma omp simd
      for (int l = 0; l < 16; ++l) xk[l] = bf16_to_f32(xn[k + l]);
      for (int o = 0; o < NO; ++o) {
#pragma omp simd
        for (int l = 0; l < 16; ++l) lanes[o][l] += w[o * C + k + l] * xk[l];
      }
    }
    for (; k < C; ++k)
      for (int o = 0; o < NO; ++o) lanes[o][k % 16] += w[o * C + k] * bf16_to_f32(xn[k]);
    for (int o = 0; o < NO; ++o) {
      float s = 0.f;
      for (int l = 0; l < 16; ++l) s += lanes[o][l];
      if (bias) s = bias[o] + s;
      if (out_bf16) out.data<uint16_t>()[n * d.OC + o] = f32_to_bf16(s);
      else out.data<float>()[n * d.OC + o] = s;
    }
  }
}

template <int NO = 1>
void few_cols_dispatch(const uint16_t* x, const float* w, const float* bias, const Tensor& out, const MatmulDims& d) {
  if constexpr (NO < kFewRows) {
    if (d.OC == NO) return few_cols_forward_n<NO>(x, w, bias, out, d);
    return few_cols_dispatch<NO + 1>(x, w, bias, out, d);
  }
}

void few_cols_forward(const uint16_t* inp, const uint16_t* w, const float* bias, const Tensor& out,
                      const MatmulDims& d) {
  std::vector<float> wf(static_cast<size_t>(d.OC * d.C));
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(w[i]);
  few_cols_dispatch(inp, wf.data(), bias, out, d);
}

}  // namespace

void matmul_forward(const MatmulArgs& a, const Stream&) {
  const char* op = "matmul_forward";
  const MatmulDims d = matmul_dims(op, a.inp, a.weight);
  const float* inp = a.inp.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();  // (OC, C)
  float* out = a.out.data<float>();  // (N, OC)
  if (d.N < kFewRowsF32 && d.N >= 1) {
    few_rows_dispatch<kFewRowsF32>(d.N, inp, w, a.bias.defined() ? a.bias.data<float>() : nullptr, a.out, d);
    return;
  }
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

namespace {

// Sums of each column of dout (N, OC) in double, per block of 64 columns in
// row order (f32 or bf16 dout: the same sums of the same values); done(c, sum)
// receives each.
template <class T, class Done>
void column_sums(const T* dout, int64_t N, int64_t OC, Done&& done) {
  constexpr int64_t kCols = 64;
  const int64_t nblocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kCols, nc = std::min(kCols, OC - c0);
    double acc[kCols] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* g = dout + n * OC + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) acc[c] += to_f32(g[c]);
    }
    for (int64_t c = 0; c < nc; ++c) done(c0 + c, acc[c]);
  }
}

}  // namespace

void matmul_bias_grad(float* dbias /* (OC) += */, const float* dout /* (N, OC) */, int64_t N, int64_t OC) {
  column_sums(dout, N, OC, [&](int64_t c, double sum) { dbias[c] = static_cast<float>(dbias[c] + sum); });
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

// ---- bf16 without emulation (ds::cpu::lowp, lib/ops/op_table.h) ----
// Taken when the bf16 GEMM is on (bf16_gemm_mode) and the GEMM operands are
// bf16; outputs may be f32 or bf16 (as the emulation: f32 sums rounded once).
// Anything else (f16, mixed operands) declines and runs emulated.

bool lowp::matmul_forward(const MatmulArgs& a, const Stream&) {
  if (!bf16_gemm_available() || !is_bf16(a.inp) || !is_bf16(a.weight) || !is_f32_or_bf16(a.out) ||
      (a.bias.defined() && !is_f32_or_bf16(a.bias)))
    return false;
  const MatmulDims d = matmul_dims("matmul_forward", a.inp, a.weight);
  const std::vector<float> bias = a.bias.defined() ? f32_vector(a.bias) : std::vector<float>();
  if (d.N < kFewRows) {
    few_rows_forward(bf16_data(a.inp), bf16_data(a.weight), bias.empty() ? nullptr : bias.data(), a.out, d);
    return true;
  }
  if (d.OC < kFewRows && d.OC >= 1) {
    few_cols_forward(bf16_data(a.inp), bf16_data(a.weight), bias.empty() ? nullptr : bias.data(), a.out, d);
    return true;
  }
  Bf16Gemm g;  // out (N, OC) = inp (N, C) @ w^T
  g.M = d.N, g.N = d.OC, g.K = d.C;
  g.a = bf16_data(a.inp), g.a_rs = d.C, g.a_cs = 1;
  g.b = bf16_data(a.weight), g.b_rs = 1, g.b_cs = d.C;
  parallel_bf16_gemm(g, {.out = a.out.raw(), .dtype = a.out.dtype(), .ld = d.OC,
                         .bias = a.bias.defined() ? bias.data() : nullptr});
  return true;
}

bool lowp::matmul_backward(const MatmulBwdArgs& a, const Stream&) {
  if (!bf16_gemm_available() || !is_bf16(a.dout) || (a.dinp.defined() && (!is_bf16(a.weight) || !is_f32_or_bf16(a.dinp))) ||
      (a.dweight.defined() && (!is_bf16(a.inp) || !is_f32_or_bf16(a.dweight))) ||
      (a.dbias.defined() && !is_f32_or_bf16(a.dbias)))
    return false;
  const MatmulDims d = matmul_dims("matmul_backward", a.inp, a.weight);
  if (d.N == 0) return true;
  const uint16_t* dout = bf16_data(a.dout);  // (N, OC)
  if (a.dinp.defined()) {
    Bf16Gemm g;  // dinp (N, C) (+)= dout (N, OC) @ w (OC, C)
    g.M = d.N, g.N = d.C, g.K = d.OC;
    g.a = dout, g.a_rs = d.OC, g.a_cs = 1;
    g.b = bf16_data(a.weight), g.b_rs = d.C, g.b_cs = 1;
    parallel_bf16_gemm(g, {.out = a.dinp.raw(), .dtype = a.dinp.dtype(), .ld = d.C, .add = a.accum == Accum::Add});
  }
  if (a.dweight.defined()) {
    Bf16Gemm g;  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    g.M = d.OC, g.N = d.C, g.K = d.N;
    g.a = dout, g.a_rs = 1, g.a_cs = d.OC;
    g.b = bf16_data(a.inp), g.b_rs = d.C, g.b_cs = 1;
    parallel_bf16_gemm(g, {.out = a.dweight.raw(), .dtype = a.dweight.dtype(), .ld = d.C, .add = true});
  }
  if (a.dbias.defined()) {
    if (a.dbias.dtype() == DType::F32) {
      float* db = a.dbias.data<float>();
      column_sums(dout, d.N, d.OC, [&](int64_t c, double sum) { db[c] = static_cast<float>(db[c] + sum); });
    } else {
      uint16_t* db = a.dbias.data<uint16_t>();
      column_sums(dout, d.N, d.OC, [&](int64_t c, double sum) {
        db[c] = f32_to_bf16(static_cast<float>(bf16_to_f32(db[c]) + sum));
      });
    }
  }
  return true;
}

}  // namespace ds::cpu
