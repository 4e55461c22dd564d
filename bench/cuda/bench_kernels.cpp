// Kernel benchmark of the CUDA backend: times each op through the same
// launchers the trainer uses (ds::ops::*) and prints achieved GB/s or TFLOP/s
// next to the floor time (bytes / measured copy bandwidth, flops / measured
// bf16 GEMM rate, and the device's nominal peak), each row as a fraction of
// its floor, and last the row furthest from its floor. Prints a skip line and exits
// 0 without a device. Usage: bench_cuda_kernels [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/blas/lt_gemm.h"
#include "cuda/cuda_api.h"
#include "lib/core/rng.h"
#include "lib/ops/ops.h"

using namespace ds;

namespace {

// Median milliseconds of `reps` runs after `warm` warm-up runs.
double time_ms(const std::function<void()>& fn, int warm = 3, int reps = 20) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ts;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// Random device tensor (never time on zeros): N(0,1) * scale in dtype dt.
// The values repeat with period 1000003 (a prime, so no row of a power-of-two
// width repeats another): one period is drawn and rounded, then tiled, so the
// host spends milliseconds, not minutes, on the largest shapes.
Tensor rand_dev(const Shape& shape, DType dt, uint64_t seed, float scale = 1.0f) {
  constexpr int64_t kPeriod = 1000003;
  Tensor t = Tensor::empty(shape, dt);
  const int64_t n = t.numel(), p = std::min(n, kPeriod);
  const size_t es = dtype_size(dt);
  std::vector<unsigned char> period(static_cast<size_t>(p) * es);
  for (int64_t i = 0; i < p; ++i) {
    const float v = float(normal_at(seed, 3, uint64_t(i))) * scale;
    if (dt == DType::F32) {
      std::memcpy(period.data() + i * es, &v, es);
    } else {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(period.data() + i * es, &h, es);
    }
  }
  auto* out = static_cast<unsigned char*>(t.raw());
  for (int64_t at = 0; at < n; at += p)
    std::memcpy(out + at * es, period.data(), static_cast<size_t>(std::min(p, n - at)) * es);
  return t.to(Device::cuda(0));
}

struct Ceilings {
  double gbps = 0;    // measured device copy bandwidth (read + write)
  double tflops = 0;  // measured bf16 GEMM rate
  double peak = 0;    // nominal bf16 peak from device properties
};

// Every row as a fraction of its floor (bytes / measured copy bandwidth for
// memory-bound kernels, FLOPs / measured bf16 GEMM rate for GEMM-like ones);
// the summary names the row furthest from its floor.
struct Report {
  Ceilings c;
  struct Row {
    std::string name;
    double frac;  // floor time / measured time
  };
  std::vector<Row> rows;

  void bytes(const std::string& name, double ms, double bytes) {
    double gbps = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-44s %9.3f ms %9.1f GB/s  floor %8.3f ms (bytes %.3g / %.0f GB/s)  %5.1f%% of copy\n",
                name.c_str(), ms, gbps, bytes / (c.gbps * 1e9) * 1e3, bytes, c.gbps, 100.0 * gbps / c.gbps);
    rows.push_back({name, gbps / c.gbps});
  }
  void flops(const std::string& name, double ms, double flops) {
    double tf = flops / (ms * 1e-3) / 1e12;
    std::printf("%-44s %9.3f ms %9.1f TFLOP/s floor %8.3f ms (flops %.3g / %.0f TFLOP/s)  %5.1f%% "
                "of GEMM, %5.1f%% of peak %.0f\n",
                name.c_str(), ms, tf, flops / (c.tflops * 1e12) * 1e3, flops, c.tflops,
                100.0 * tf / c.tflops, 100.0 * tf / c.peak, c.peak);
    rows.push_back({name, tf / c.tflops});
  }
  void summary() const {
    if (rows.empty()) return;
    const Row* worst = &rows[0];
    int below = 0;
    for (const Row& r : rows) {
      if (r.frac < worst->frac) worst = &r;
      below += r.frac < 0.8;
    }
    std::printf("furthest from its floor: %s at %.1f%% (%d of %zu rows below 80%%)\n", worst->name.c_str(),
                100.0 * worst->frac, below, rows.size());
  }
};

Ceilings measure_ceilings() {
  Ceilings c;
  size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  cudaMemset(src, 1, bytes);
  double ms = time_ms([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  c.gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
  cudaFree(src);
  cudaFree(dst);
  const int64_t n = 8192;
  Tensor a = rand_dev({n, n}, DType::BF16, 1), w = rand_dev({n, n}, DType::BF16, 2, 0.01f);
  Tensor o = Tensor::empty({n, n}, DType::BF16, Device::cuda(0));
  ms = time_ms([&] { ops::matmul_forward(MatmulArgs{o, a, w, Tensor{}}); }, 2, 10);
  c.tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  c.peak = ds::cuda::peak_bf16_tflops();
  std::printf("ceilings: copy %.0f GB/s (1 GiB D2D, read+write), bf16 GEMM %.0f TFLOP/s "
              "(8192^3 through matmul_forward), nominal peak %.0f TFLOP/s\n",
              c.gbps, c.tflops, c.peak);
  return c;
}

// A bf16 view `off` elements into a fresh buffer (parameters are views into
// one flat buffer: odd offsets take the vectorised kernels' scalar paths).
Tensor offset_view(const Tensor& t, int64_t off) {
  Tensor big = Tensor::empty({t.numel() + off}, t.dtype(), Device::cuda(0));
  Tensor v = big.view(off, t.shape());
  v.copy_from(t);
  return v;
}

void bench_norms(Report& r) {
  const DType bf = DType::BF16;
  for (int64_t C : {768, 4096}) {
    const int64_t N = 16384;
    const double act = double(N) * C * 2;  // one bf16 activation
    Tensor x = rand_dev({N, C}, bf, 3), y = Tensor::empty({N, C}, bf, Device::cuda(0));
    Tensor w = rand_dev({C}, bf, 4), bias = rand_dev({C}, bf, 5);
    Tensor mean = Tensor::empty({N}, DType::F32, Device::cuda(0)), rstd = mean.clone();
    const std::string shape = " bf16 16384x" + std::to_string(C);
    double ms = time_ms([&] { ops::layernorm_forward(LayerNormArgs{y, mean, rstd, x, w, bias}); });
    r.bytes("layernorm_forward" + shape, ms, 2.0 * act);
    Tensor dx = Tensor::empty({N, C}, bf, Device::cuda(0));
    Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda(0)), db = dw.clone();
    ms = time_ms([&] { ops::layernorm_backward(LayerNormBwdArgs{dx, dw, db, y, x, w, mean, rstd}); });
    r.bytes("layernorm_backward" + shape, ms, 3.0 * act);  // x, dout read once; dinp written
    ms = time_ms([&] { ops::rmsnorm_forward(RMSNormArgs{y, rstd, x, w}); });
    r.bytes("rmsnorm_forward" + shape, ms, 2.0 * act);
    ms = time_ms([&] { ops::rmsnorm_backward(RMSNormBwdArgs{dx, dw, y, x, w, rstd}); });
    r.bytes("rmsnorm_backward" + shape, ms, 3.0 * act);
    // Fused residual add + norm: reads a, b; writes sum and out. Beside it
    // the unfused pair it replaces (add, then the norm re-reading sum).
    Tensor res = rand_dev({N, C}, bf, 21), sum = Tensor::empty({N, C}, bf, Device::cuda(0));
    ms = time_ms([&] {
      ops::add_norm_forward(AddNormArgs{.sum = sum, .out = y, .mean = mean, .rstd = rstd, .a = x, .b = res,
                                        .weight = w, .bias = bias});
    });
    r.bytes("add_norm_forward (layernorm)" + shape, ms, 4.0 * act);
    ms = time_ms([&] {
      ops::add_norm_forward(AddNormArgs{.sum = sum, .out = y, .rstd = rstd, .a = x, .b = res, .weight = w,
                                        .norm = NormType::RMSNorm});
    });
    r.bytes("add_norm_forward (rmsnorm)" + shape, ms, 4.0 * act);
    ms = time_ms([&] {
      ops::add(AddArgs{sum, x, res});
      ops::layernorm_forward(LayerNormArgs{y, mean, rstd, sum, w, bias});
    });
    r.bytes("add + layernorm_forward, unfused" + shape, ms, 4.0 * act);
  }
}

// The bias gradient of a linear layer (matmul_backward asked for dbias only:
// the column reduction of cuda/core/reduce.cuh) at GPT-2 124M's fc and proj
// widths, and at offset 1 (element by element); then a LayerNorm backward
// with rows too long for the one-pass kernel (column reduction + dinp
// kernel). Bytes: dout read once (the f32 partials are R x OC, small).
void bench_column_reduce(Report& r) {
  const DType bf = DType::BF16;
  const Device dev = Device::cuda(0);
  const int64_t N = 16384, C = 8;  // inp and weight are not read for dbias alone
  Tensor inp = rand_dev({N, C}, bf, 41);
  for (int64_t OC : {3072, 768}) {
    Tensor dout = rand_dev({N, OC}, bf, 42), w = rand_dev({OC, C}, bf, 43);
    Tensor db = Tensor::zeros({OC}, DType::F32, dev);
    const std::string shape = " bf16 16384x" + std::to_string(OC);
    auto bias_grad = [&](const Tensor& g) {
      ops::matmul_backward(
          MatmulBwdArgs{.dinp = Tensor{}, .dweight = Tensor{}, .dbias = db, .dout = g, .inp = inp, .weight = w});
    };
    double ms = time_ms([&] { bias_grad(dout); });
    r.bytes("bias grad (column reduction)" + shape, ms, double(N) * OC * 2);
    if (OC != 3072) continue;
    Tensor d1 = offset_view(dout, 1);
    ms = time_ms([&] { bias_grad(d1); });
    r.bytes("bias grad" + shape + " (offset 1: scalar)", ms, double(N) * OC * 2);
  }
  const int64_t NL = 2048, CL = 16384;
  const double act = double(NL) * CL * 2;
  Tensor x = rand_dev({NL, CL}, bf, 44), dy = rand_dev({NL, CL}, bf, 45);
  Tensor dx = Tensor::empty({NL, CL}, bf, dev);
  Tensor w = rand_dev({CL}, bf, 46), mean = rand_dev({NL}, DType::F32, 47, 0.1f);
  Tensor rstd = rand_dev({NL}, DType::F32, 48, 0.1f);
  Tensor dw = Tensor::zeros({CL}, DType::F32, dev), db = dw.clone();
  double ms = time_ms([&] { ops::layernorm_backward(LayerNormBwdArgs{dx, dw, db, dy, x, w, mean, rstd}); });
  r.bytes("layernorm_backward bf16 2048x16384 (long rows)", ms, 3.0 * act);  // op floor: x, dout, dinp
}

void bench_elementwise(Report& r) {
  const DType bf = DType::BF16;
  const int64_t N = 16384, C = 768, F = 4 * C;
  const double h = double(N) * F * 2;  // one bf16 (N, 4C) tensor
  Tensor x = rand_dev({N, F}, bf, 6), y = Tensor::empty({N, F}, bf, Device::cuda(0));
  Tensor d = rand_dev({N, F}, bf, 16);
  double ms = time_ms([&] { ops::gelu_forward(GeluArgs{y, x, Tensor{}}); });
  r.bytes("gelu_forward bf16 16384x3072", ms, 2.0 * h);
  ms = time_ms([&] { ops::gelu_backward(GeluArgs{y, x, d}); });
  r.bytes("gelu_backward bf16 16384x3072", ms, 3.0 * h);
  Tensor gu = rand_dev({N, 2 * F}, bf, 17), dgu = Tensor::empty({N, 2 * F}, bf, Device::cuda(0));
  ms = time_ms([&] { ops::swiglu_forward(SwigluArgs{y, gu}); });
  r.bytes("swiglu_forward bf16 16384x(2x3072)", ms, 3.0 * h);
  ms = time_ms([&] { ops::swiglu_backward(SwigluBwdArgs{dgu, d, gu}); });
  r.bytes("swiglu_backward bf16 16384x(2x3072)", ms, 5.0 * h);
  ms = time_ms([&] { ops::add(AddArgs{y, x, d}); });
  r.bytes("add bf16 16384x3072", ms, 3.0 * h);
  Tensor xo = offset_view(x, 1), dof = offset_view(d, 1), yo = offset_view(y, 1);
  ms = time_ms([&] { ops::add(AddArgs{yo, xo, dof}); });
  r.bytes("add bf16 16384x3072 (offset 1: head/tail)", ms, 3.0 * h);
  Tensor d3 = offset_view(d, 3);
  ms = time_ms([&] { ops::add(AddArgs{yo, xo, d3}); });
  r.bytes("add bf16 16384x3072 (phases differ: scalar)", ms, 3.0 * h);
  ms = time_ms([&] { ops::scale(ScaleArgs{y, 0.999f}); });
  r.bytes("scale bf16 16384x3072", ms, 2.0 * h);
  Tensor f = rand_dev({N, F}, DType::F32, 18);
  ms = time_ms([&] { ops::cast(CastArgs{y, f}); });
  r.bytes("cast f32->bf16 16384x3072", ms, 3.0 * h);
  Tensor xc = rand_dev({8, 2048, C}, bf, 19), rc = rand_dev({8, 2048, C}, bf, 20);
  Tensor oc = Tensor::empty({8, 2048, C}, bf, Device::cuda(0));
  DropoutSpec dsp;
  dsp.p = 0.1f;
  ms = time_ms([&] { ops::dropout_forward(DropoutArgs{oc, xc, rc, dsp}); });
  r.bytes("dropout_forward+residual bf16 16384x768", ms, 3.0 * N * C * 2);
  Tensor acc = Tensor::zeros({1}, DType::F32, Device::cuda(0));
  ms = time_ms([&] { ops::sum_squares(SumSquaresArgs{acc, f}); });
  r.bytes("sum_squares f32 16384x3072", ms, 2.0 * h);
  ms = time_ms([&] { ops::nonfinite_check(NonFiniteArgs{acc, x}); });
  r.bytes("nonfinite_check bf16 16384x3072", ms, h);
}

// Vocab-parallel cross-entropy, one rank of tp 2 at GPT-2's padded vocab
// (Vl 25152 of 50304, the second shard: 25105 real columns, the padding
// masked inside the last vector), bf16, each phase on its own and the three
// together (the all-reduces between them are not timed), then all three
// with the logits and dlogits at offset 1 (the element-by-element path).
// Bytes: max and stats read the logits once, finish reads them and writes
// dlogits.
void bench_vocab_parallel(Report& r) {
  const DType bf = DType::BF16;
  const int64_t NL = 8192, Vl = 25152, V = 50257, start = Vl;
  const Device dev = Device::cuda(0);
  Tensor tgt = Tensor::empty({NL}, DType::I32);
  for (int64_t i = 0; i < NL; ++i) tgt.data<int32_t>()[i] = int32_t((i * 7919) % V);
  tgt = tgt.to(dev);
  Tensor logits = rand_dev({NL, Vl}, bf, 41, 3.0f), dl = Tensor::empty({NL, Vl}, bf, dev);
  Tensor rowmax = Tensor::empty({NL}, DType::F32, dev), stats = Tensor::empty({2, NL}, DType::F32, dev);
  Tensor losses = Tensor::empty({NL}, DType::F32, dev);
  auto phase = [&](VocabCEPhase ph, const Tensor& x, const Tensor& d) {
    ops::vocab_parallel_cross_entropy(VocabParallelCEArgs{.phase = ph, .logits = x, .targets = tgt, .rowmax = rowmax,
                                                          .stats = stats, .losses = losses, .dlogits = d,
                                                          .vocab_start = start, .V = V, .dloss = 1.0f});
  };
  const double row = double(NL) * Vl * 2;
  double ms = time_ms([&] { phase(VocabCEPhase::Max, logits, Tensor{}); });
  r.bytes("vocab_parallel_ce max bf16 8192x25152", ms, row);
  ms = time_ms([&] { phase(VocabCEPhase::Stats, logits, Tensor{}); });
  r.bytes("vocab_parallel_ce stats bf16 8192x25152", ms, row);
  ms = time_ms([&] { phase(VocabCEPhase::Finish, logits, dl); });
  r.bytes("vocab_parallel_ce finish+grad bf16 8192x25152", ms, 2.0 * row);
  auto all = [&](const Tensor& x, const Tensor& d) {
    phase(VocabCEPhase::Max, x, Tensor{});
    phase(VocabCEPhase::Stats, x, Tensor{});
    phase(VocabCEPhase::Finish, x, d);
  };
  ms = time_ms([&] { all(logits, dl); });
  r.bytes("vocab_parallel_ce 3 phases bf16 8192x25152", ms, 4.0 * row);
  Tensor xo = offset_view(logits, 1), dlo = offset_view(dl, 1);
  ms = time_ms([&] { all(xo, dlo); });
  r.bytes("vocab_parallel_ce 3 phases (offset 1: scalar)", ms, 4.0 * row);
}

void bench_loss_optim(Report& r) {
  const DType bf = DType::BF16;
  const int64_t V = 50304, Vp = 50304;
  const int64_t NL = 8192;
  Tensor logits = rand_dev({NL, Vp}, bf, 7);
  Tensor losses = Tensor::empty({NL}, DType::F32, Device::cuda(0));
  Tensor tgt = Tensor::empty({NL}, DType::I32);
  for (int64_t i = 0; i < NL; ++i) tgt.data<int32_t>()[i] = int32_t((i * 7919) % V);
  tgt = tgt.to(Device::cuda(0));
  Tensor dl = Tensor::empty({NL, Vp}, bf, Device::cuda(0));
  double ms = time_ms([&] { ops::cross_entropy(CrossEntropyArgs{losses, dl, logits, tgt, V, 1.0f}); });
  r.bytes("cross_entropy+grad bf16 8192x50304", ms, 3.0 * NL * Vp * 2);
  const int64_t P = 124000000;
  Tensor param = rand_dev({P}, DType::F32, 8, 0.02f), grad = rand_dev({P}, bf, 9, 1e-3f);
  Tensor m = Tensor::zeros({P}, DType::F32, Device::cuda(0)), v = m.clone();
  Tensor lowp = Tensor::empty({P}, bf, Device::cuda(0));
  AdamWArgs aw;
  aw.param = param; aw.grad = grad; aw.m = m; aw.v = v; aw.param_lowp = lowp; aw.lr = 1e-4f;
  const double adam_bytes = double(P) * (4 * 6 + 2 + 2);
  ms = time_ms([&] { ops::adamw_step(aw); });
  r.bytes("adamw_step 124M f32 master, bf16 grad", ms, adam_bytes);
  // The optimizer's form: one call with a segment per parameter of a
  // GPT-2 124M-like layout (12 layers x 12 tensors + 4), decay alternating.
  std::vector<int64_t> seg;
  const int64_t nseg = 12 * 12 + 4;
  for (int64_t i = 0, b = 0; i < nseg; ++i) {
    const int64_t e = i + 1 == nseg ? P : b + (i % 2 ? 768 + 3 : (P / nseg) * 2 - 800);
    seg.insert(seg.end(), {b, std::min(e, P), i % 2 ? 0 : 1});
    b = std::min(e, P);
  }
  Tensor segs = Tensor::empty({nseg, 3}, DType::I64);
  std::copy(seg.begin(), seg.end(), segs.data<int64_t>());
  aw.segments = segs.to(Device::cuda(0));
  ms = time_ms([&] { ops::adamw_step(aw); });
  r.bytes("adamw_step 124M, 148 segments, one launch", ms, adam_bytes);
}

// GPT-2 token tensors: spread (a multiplicative hash, few repeats) or skewed
// (row = V * u^4: a few rows take a large share, as frequent tokens do).
Tensor gpt2_tokens(int64_t B, int64_t T, int64_t V, bool skewed) {
  Tensor tok = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < tok.numel(); ++i) {
    const double u = double((i * 2654435761ll) % 1000003) / 1000003.0;
    tok.data<int32_t>()[i] = skewed ? int32_t(double(V) * u * u * u * u) : int32_t((i * 104729) % V);
  }
  return tok.to(Device::cuda(0));
}

// Embedding backward at GPT-2 shapes (V 50304, C 768, bf16 dout, f32 dwte):
// the sorted kernel (the default) beside the scan kernel it replaced. Bytes:
// dout read once, one f32 dwte row read and written per token (an upper bound).
void bench_embedding(Report& r) {
  const int64_t C = 768, V = 50304;
  Tensor dwte = Tensor::zeros({V, C}, DType::F32, Device::cuda(0));
  for (int64_t T : {1024, 2048})
    for (bool skewed : {false, true}) {
      const int64_t B = 8, N = B * T;
      Tensor tok = gpt2_tokens(B, T, V, skewed);
      Tensor dout = rand_dev({B, T, C}, DType::BF16, 10);
      for (auto algo : {ds::cuda::EmbeddingBackward::Sorted, ds::cuda::EmbeddingBackward::Scan}) {
        ds::cuda::set_embedding_backward(algo);
        const double ms = time_ms([&] { ops::embedding_backward(EmbeddingBwdArgs{dwte, Tensor{}, dout, tok}); });
        char name[96];
        std::snprintf(name, sizeof(name), "embedding_backward %s %ld tok%s",
                      algo == ds::cuda::EmbeddingBackward::Sorted ? "sorted" : "scan", long(N),
                      skewed ? " skewed" : "");
        r.bytes(name, ms, double(N) * C * 2 + 2.0 * N * C * 4);
      }
    }
  ds::cuda::set_embedding_backward(ds::cuda::EmbeddingBackward::Sorted);
  // The forward (bf16 tables, 8x1024 spread tokens) with the learned
  // positions, then with wte at offset 1 (the element-by-element path).
  // Bytes: out written, one wte row per token, the T wpe rows once (the
  // batch re-reads them from L2).
  const int64_t B = 8, T = 1024, N = B * T;
  Tensor tok = gpt2_tokens(B, T, V, false);
  Tensor wte = rand_dev({V, C}, DType::BF16, 36), wpe = rand_dev({T, C}, DType::BF16, 37);
  Tensor out = Tensor::empty({B, T, C}, DType::BF16, Device::cuda(0));
  const double fwd_bytes = 2.0 * N * C * 2 + double(T) * C * 2;
  double ms = time_ms([&] { ops::embedding_forward(EmbeddingArgs{out, tok, wte, wpe}); });
  r.bytes("embedding_forward bf16 8192 tok, wpe", ms, fwd_bytes);
  Tensor wte1 = offset_view(wte, 1);
  ms = time_ms([&] { ops::embedding_forward(EmbeddingArgs{out, tok, wte1, wpe}); });
  r.bytes("embedding_forward bf16 8192 tok (offset 1: scalar)", ms, fwd_bytes);
  // The backward with dwpe (f32): the wte part as above plus dout read
  // again and the T dwpe rows read and written.
  Tensor dout = rand_dev({B, T, C}, DType::BF16, 38), dwpe = Tensor::zeros({T, C}, DType::F32, Device::cuda(0));
  ms = time_ms([&] { ops::embedding_backward(EmbeddingBwdArgs{dwte, dwpe, dout, tok}); });
  r.bytes("embedding_backward sorted 8192 tok + dwpe", ms,
          double(N) * C * 2 + 2.0 * N * C * 4 + double(N) * C * 2 + 2.0 * T * C * 4);
}

// RoPE on packed qkv, bf16: forward out of place (reads and writes every
// element), backward in place (reads and writes q and k only).
void bench_rope(Report& r) {
  struct R { int64_t B, T; int NH, NKV, HS; const char* what; };
  for (const R& c : {R{8, 2048, 12, 12, 64, "NH12 HS64"}, R{2, 4096, 32, 8, 128, "NH32 NKV8 HS128"}}) {
    const int64_t W = int64_t(c.NH + 2 * c.NKV) * c.HS, N = c.B * c.T;
    Tensor x = rand_dev({c.B, c.T, W}, DType::BF16, 24), y = Tensor::empty({c.B, c.T, W}, DType::BF16, Device::cuda(0));
    char name[96];
    double ms = time_ms([&] { ops::rope_forward(RopeArgs{.out = y, .inp = x, .NH = c.NH, .NKV = c.NKV}); });
    std::snprintf(name, sizeof(name), "rope_forward bf16 %ld tok %s", long(N), c.what);
    r.bytes(name, ms, 2.0 * N * W * 2);
    ms = time_ms([&] { ops::rope_backward(RopeArgs{.out = y, .inp = y, .NH = c.NH, .NKV = c.NKV}); });
    std::snprintf(name, sizeof(name), "rope_backward in place bf16 %ld tok %s", long(N), c.what);
    r.bytes(name, ms, 2.0 * N * (c.NH + c.NKV) * c.HS * 2);
  }
}

void bench_matmul_attention(Report& r, bool quick) {
  const int64_t N = 16384, C = 768, OC = 3072;
  Tensor x = rand_dev({N, C}, DType::BF16, 11), w = rand_dev({OC, C}, DType::BF16, 12, 0.02f);
  Tensor o = Tensor::empty({N, OC}, DType::BF16, Device::cuda(0));
  double ms = time_ms([&] { ops::matmul_forward(MatmulArgs{o, x, w, Tensor{}}); });
  r.flops("matmul_forward bf16 16384x768->3072", ms, 2.0 * N * C * OC);
  struct A { int64_t B, T; int NH, HS; };
  std::vector<A> cases = {{8, 1024, 12, 64}, {4, 2048, 16, 128}, {2, 4096, 16, 128}};
  if (!quick) cases.push_back({1, 8192, 16, 128});
  using ds::cuda::AttentionBackend;
  using ds::cuda::Flash2Dq;
  struct Impl {
    AttentionBackend backend;
    Flash2Dq dq;
    const char* name;
  };
  // flash2o: flash2 with the ordered 5-GEMM dQ (docs/cuda.md).
  // flash2o last: its ordered dQ relies on in-order block dispatch, unverified
  // until a device runs it; if it hangs, the other rows are already out.
  const Impl impls[] = {{AttentionBackend::Flash2, Flash2Dq::Recompute, "flash2"},
                        {AttentionBackend::Flash, Flash2Dq::Recompute, "flash"},
                        {AttentionBackend::Cudnn, Flash2Dq::Recompute, "cudnn"},
                        {AttentionBackend::Plain, Flash2Dq::Recompute, "plain"},
                        {AttentionBackend::Flash2, Flash2Dq::Ordered, "flash2o"}};
  for (const Impl& impl : impls) {
    const AttentionBackend backend = impl.backend;
    ds::cuda::set_attention_backend(backend);
    ds::cuda::set_flash2_dq_mode(impl.dq);
    const char* bname = impl.name;
    for (const A& a : cases) {
      if (backend == AttentionBackend::Plain && a.T > 2048) continue;
      int64_t O = int64_t(a.NH) * a.HS;
      Tensor qkv = rand_dev({a.B, a.T, 3 * O}, DType::BF16, 13);
      Tensor out = Tensor::empty({a.B, a.T, O}, DType::BF16, Device::cuda(0));
      Tensor lse = Tensor::empty({a.B, a.NH, a.T}, DType::F32, Device::cuda(0));
      Tensor dout = rand_dev({a.B, a.T, O}, DType::BF16, 14);
      Tensor dqkv = Tensor::empty({a.B, a.T, 3 * O}, DType::BF16, Device::cuda(0));
      double fwd_flops = 4.0 * a.B * a.NH * double(a.T) * a.T * a.HS / 2;  // causal
      char name[96];
      std::snprintf(name, sizeof(name), "attn %s fwd B%ld T%ld NH%d HS%d", bname, long(a.B),
                    long(a.T), a.NH, a.HS);
      ms = time_ms([&] { ops::attention_forward(AttentionArgs{out, lse, qkv, a.NH}); });
      r.flops(name, ms, fwd_flops);
      std::snprintf(name, sizeof(name), "attn %s bwd B%ld T%ld NH%d HS%d", bname, long(a.B),
                    long(a.T), a.NH, a.HS);
      ms = time_ms([&] {
        ops::attention_backward(AttentionBwdArgs{dqkv, dout, out, lse, qkv, a.NH});
      });
      r.flops(name, ms, 2.5 * fwd_flops);
      // Forward + backward, the training step's cost (3.5x the forward's
      // FLOPs, counted the usual way: the backward's recomputation is not).
      // Not for plain: the sum of its two lines, and slow enough to strain
      // the bundle's time budget.
      if (backend == AttentionBackend::Plain) continue;
      std::snprintf(name, sizeof(name), "attn %s fwd+bwd B%ld T%ld NH%d HS%d", bname, long(a.B),
                    long(a.T), a.NH, a.HS);
      ms = time_ms([&] {
        ops::attention_forward(AttentionArgs{out, lse, qkv, a.NH});
        ops::attention_backward(AttentionBwdArgs{dqkv, dout, out, lse, qkv, a.NH});
      });
      r.flops(name, ms, 3.5 * fwd_flops);
    }
  }
  ds::cuda::set_attention_backend(AttentionBackend::Flash);
  ds::cuda::set_flash2_dq_mode(Flash2Dq::Recompute);
}

// The GPT-2 124M MLP's GELU GEMMs (N 16384, C 768, F 3072, bf16) with the
// cuBLASLt epilogues and with the separate GEMM + GELU kernels. A row whose
// epilogue was refused says so (it then times the fallback).
void bench_mlp_epilogues(Report& r) {
  const DType bf = DType::BF16;
  const int64_t N = 16384, C = 768, F = 4 * C;
  const Device dev = Device::cuda(0);
  Tensor x = rand_dev({N, C}, bf, 31), wfc = rand_dev({F, C}, bf, 32, 0.02f), bfc = rand_dev({F}, bf, 33, 0.02f);
  Tensor wproj = rand_dev({C, F}, bf, 34, 0.02f), dy = rand_dev({N, C}, bf, 35);
  Tensor act = Tensor::empty({N, F}, bf, dev), pre = Tensor::empty({N, F}, bf, dev);
  Tensor dfc = Tensor::empty({N, F}, bf, dev), dbfc = Tensor::zeros({F}, DType::F32, dev);
  const double flops = 2.0 * N * C * F;
  const ds::cuda::GemmEpilogues prev = ds::cuda::gemm_epilogues();
  for (auto mode : {ds::cuda::GemmEpilogues::Fused, ds::cuda::GemmEpilogues::Unfused}) {
    ds::cuda::set_gemm_epilogues(mode);
    const bool want = mode == ds::cuda::GemmEpilogues::Fused;
    const ds::cuda::EpiloguePathCounts c0 = ds::cuda::epilogue_path_counts();
    double ms = time_ms([&] {
      ops::matmul_bias_gelu_forward(MatmulGeluArgs{act, pre, x, wfc, bfc});
    });
    const ds::cuda::EpiloguePathCounts c1 = ds::cuda::epilogue_path_counts();
    const bool fwd_fused = c1.fused_fwd > c0.fused_fwd;
    std::string name = std::string("fc+gelu fwd bf16 16384x768->3072 ") +
                       (fwd_fused ? "(GELU_AUX_BIAS)" : want ? "(epilogue refused: unfused)" : "(unfused)");
    r.flops(name, ms, flops);
    ms = time_ms([&] {
      ops::matmul_dgelu_bgrad(MatmulDgeluArgs{dfc, dbfc, dy, wproj, pre});
    });
    const bool bwd_fused = ds::cuda::epilogue_path_counts().fused_bwd > c1.fused_bwd;
    name = std::string("proj dinp+dgelu+dbias bf16 16384x768->3072 ") +
           (bwd_fused ? "(DGELU_BGRAD)" : want ? "(epilogue refused: unfused)" : "(unfused)");
    r.flops(name, ms, flops);
  }
  ds::cuda::set_gemm_epilogues(prev);
}

}  // namespace

static int run(bool quick);

int main(int argc, char** argv) {
  // Line-buffered: a run killed by its time limit keeps every row measured.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!ds::cuda::device_available()) {
    std::printf("SKIP: no CUDA device (%s)\n", ds::cuda::unavailable_reason().c_str());
    return 0;
  }
  try {
    return run(quick);
  } catch (const std::exception& e) {  // the rows so far are out; say why the rest is missing
    std::printf("ERROR: %s\n", e.what());
    return 1;
  }
}

static int run(bool quick) {
  ds::cuda::init_device(0);
  std::printf("device: %s\n", ds::cuda::device_name().c_str());
  Report r{measure_ceilings(), {}};
  bench_norms(r);
  bench_column_reduce(r);
  bench_elementwise(r);
  bench_loss_optim(r);
  bench_vocab_parallel(r);
  bench_embedding(r);
  bench_rope(r);
  bench_matmul_attention(r, quick);
  bench_mlp_epilogues(r);
  r.summary();
  std::printf("max allocated: %.2f GiB\n", ds::cuda::max_allocated_bytes() / double(1 << 30));
  return 0;
}
