// Kernel benchmark of the CUDA backend: times each op through the same
// launchers the trainer uses (ds::ops::*) and prints achieved GB/s or TFLOP/s
// next to the floor time (bytes / measured copy bandwidth, flops / measured
// bf16 GEMM rate, and the device's nominal peak). Prints a skip line and exits
// 0 without a device. Usage: bench_cuda_kernels [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

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
Tensor rand_dev(const Shape& shape, DType dt, uint64_t seed, float scale = 1.0f) {
  Tensor h = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < h.numel(); ++i)
    h.data<float>()[i] = float(normal_at(seed, 3, uint64_t(i % 1000003))) * scale;
  Tensor t = Tensor::empty(shape, dt);
  if (dt == DType::F32) t = h;
  else
    for (int64_t i = 0; i < h.numel(); ++i)
      t.data<uint16_t>()[i] =
          dt == DType::BF16 ? f32_to_bf16(h.data<float>()[i]) : f32_to_f16(h.data<float>()[i]);
  return t.to(Device::cuda(0));
}

struct Ceilings {
  double gbps = 0;    // measured device copy bandwidth (read + write)
  double tflops = 0;  // measured bf16 GEMM rate
  double peak = 0;    // nominal bf16 peak from device properties
};

void report_bytes(const char* name, double ms, double bytes, const Ceilings& c) {
  double gbps = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-34s %9.3f ms %9.1f GB/s  floor %8.3f ms (bytes %.3g / %.0f GB/s)  %5.1f%%\n",
              name, ms, gbps, bytes / (c.gbps * 1e9) * 1e3, bytes, c.gbps, 100.0 * gbps / c.gbps);
}

void report_flops(const char* name, double ms, double flops, const Ceilings& c) {
  double tf = flops / (ms * 1e-3) / 1e12;
  std::printf("%-34s %9.3f ms %9.1f TFLOP/s floor %8.3f ms (flops %.3g / %.0f TFLOP/s)  %5.1f%% "
              "of GEMM, %5.1f%% of peak %.0f\n",
              name, ms, tf, flops / (c.tflops * 1e12) * 1e3, flops, c.tflops,
              100.0 * tf / c.tflops, 100.0 * tf / c.peak, c.peak);
}

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

void bench_memory_bound(const Ceilings& c) {
  const int64_t N = 16384, C = 768, V = 50304, Vp = 50304;
  const DType bf = DType::BF16;
  Tensor x = rand_dev({N, C}, bf, 3), y = Tensor::empty({N, C}, bf, Device::cuda(0));
  Tensor w = rand_dev({C}, bf, 4), bias = rand_dev({C}, bf, 5);
  Tensor mean = Tensor::empty({N}, DType::F32, Device::cuda(0)), rstd = mean.clone();
  double ms = time_ms([&] { ops::layernorm_forward(LayerNormArgs{y, mean, rstd, x, w, bias}); });
  report_bytes("layernorm_forward bf16 16384x768", ms, 2.0 * N * C * 2, c);
  Tensor dx = Tensor::empty({N, C}, bf, Device::cuda(0));
  Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda(0)), db = dw.clone();
  ms = time_ms([&] {
    ops::layernorm_backward(LayerNormBwdArgs{dx, dw, db, y, x, w, mean, rstd});
  });
  report_bytes("layernorm_backward bf16 16384x768", ms, 5.0 * N * C * 2, c);
  Tensor h = rand_dev({N, 4 * C}, bf, 6), g = Tensor::empty({N, 4 * C}, bf, Device::cuda(0));
  ms = time_ms([&] { ops::gelu_forward(GeluArgs{g, h, Tensor{}}); });
  report_bytes("gelu_forward bf16 16384x3072", ms, 2.0 * N * 4 * C * 2, c);
  const int64_t NL = 8192;
  Tensor logits = rand_dev({NL, Vp}, bf, 7);
  Tensor losses = Tensor::empty({NL}, DType::F32, Device::cuda(0));
  Tensor tgt = Tensor::empty({NL}, DType::I32);
  for (int64_t i = 0; i < NL; ++i) tgt.data<int32_t>()[i] = int32_t((i * 7919) % V);
  tgt = tgt.to(Device::cuda(0));
  Tensor dl = Tensor::empty({NL, Vp}, bf, Device::cuda(0));
  ms = time_ms([&] { ops::cross_entropy(CrossEntropyArgs{losses, dl, logits, tgt, V, 1.0f}); });
  report_bytes("cross_entropy+grad bf16 8192x50304", ms, 3.0 * NL * Vp * 2, c);
  const int64_t P = 124000000;
  Tensor param = rand_dev({P}, DType::F32, 8, 0.02f), grad = rand_dev({P}, bf, 9, 1e-3f);
  Tensor m = Tensor::zeros({P}, DType::F32, Device::cuda(0)), v = m.clone();
  Tensor lowp = Tensor::empty({P}, bf, Device::cuda(0));
  AdamWArgs aw;
  aw.param = param; aw.grad = grad; aw.m = m; aw.v = v; aw.param_lowp = lowp; aw.lr = 1e-4f;
  ms = time_ms([&] { ops::adamw_step(aw); });
  report_bytes("adamw_step 124M f32 master, bf16 grad", ms, double(P) * (4 * 6 + 2 + 2), c);
  Tensor tok = Tensor::empty({8, 2048}, DType::I32);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.data<int32_t>()[i] = int32_t((i * 104729) % V);
  tok = tok.to(Device::cuda(0));
  Tensor dwte = Tensor::zeros({V, C}, DType::F32, Device::cuda(0));
  Tensor dout = rand_dev({8, 2048, C}, bf, 10);
  ms = time_ms([&] { ops::embedding_backward(EmbeddingBwdArgs{dwte, Tensor{}, dout, tok}); });
  report_bytes("embedding_backward bf16 16384 tok", ms, 16384.0 * C * 2 + 2.0 * 16384 * C * 4, c);
}

void bench_matmul_attention(const Ceilings& c, bool quick) {
  const int64_t N = 16384, C = 768, OC = 3072;
  Tensor x = rand_dev({N, C}, DType::BF16, 11), w = rand_dev({OC, C}, DType::BF16, 12, 0.02f);
  Tensor o = Tensor::empty({N, OC}, DType::BF16, Device::cuda(0));
  double ms = time_ms([&] { ops::matmul_forward(MatmulArgs{o, x, w, Tensor{}}); });
  report_flops("matmul_forward bf16 16384x768->3072", ms, 2.0 * N * C * OC, c);
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
  const Impl impls[] = {{AttentionBackend::Flash2, Flash2Dq::Recompute, "flash2"},
                        {AttentionBackend::Flash2, Flash2Dq::Ordered, "flash2o"},
                        {AttentionBackend::Flash, Flash2Dq::Recompute, "flash"},
                        {AttentionBackend::Plain, Flash2Dq::Recompute, "plain"}};
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
      report_flops(name, ms, fwd_flops, c);
      std::snprintf(name, sizeof(name), "attn %s bwd B%ld T%ld NH%d HS%d", bname, long(a.B),
                    long(a.T), a.NH, a.HS);
      ms = time_ms([&] {
        ops::attention_backward(AttentionBwdArgs{dqkv, dout, out, lse, qkv, a.NH});
      });
      report_flops(name, ms, 2.5 * fwd_flops, c);
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
      report_flops(name, ms, 3.5 * fwd_flops, c);
    }
  }
  ds::cuda::set_attention_backend(AttentionBackend::Flash);
  ds::cuda::set_flash2_dq_mode(Flash2Dq::Recompute);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!ds::cuda::device_available()) {
    std::printf("SKIP: no CUDA device (%s)\n", ds::cuda::unavailable_reason().c_str());
    return 0;
  }
  ds::cuda::init_device(0);
  std::printf("device: %s\n", ds::cuda::device_name().c_str());
  Ceilings c = measure_ceilings();
  bench_memory_bound(c);
  bench_matmul_attention(c, quick);
  std::printf("max allocated: %.2f GiB\n", ds::cuda::max_allocated_bytes() / double(1 << 30));
  return 0;
}
