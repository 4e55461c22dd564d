// Which library should run the CPU backend's bf16 GEMMs (issue: CPU bf16)?
// Times the GEMMs of one GPT-2 124M training step (B 4, T 256: 1024 tokens;
// each linear layer's forward out = x W^T, and its backward dx = dy W and
// dW = dy^T x) three ways on the same shapes: OpenBLAS sgemm (the f32 path
// dstrain uses today), oneDNN's f32 matmul, and oneDNN's bf16 matmul (bf16
// inputs, f32 accumulation and output), in plain row-major layouts (the
// weights change every step, so nothing is pre-packed). Prints GFLOP/s per
// shape, the ratio of bf16 to sgemm, the step's GEMM time each way, and the
// bf16 result's largest relative error against sgemm's. Threads: OpenMP's
// (OMP_NUM_THREADS) for both libraries.
//   bench_gemm_sources [--tokens N] [--reps N]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <string>
#include <vector>

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double best_of(int reps, const std::function<void()>& f) {
  f();  // warm-up (oneDNN compiles its kernel on first use)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = seconds();
    f();
    best = std::min(best, seconds() - t);
  }
  return best;
}

// round-to-nearest-even f32 -> bf16 bits
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

struct Gemm {
  const char* what;
  int64_t M, N, K;
  bool ta, tb;  // C(M, N) = op(A) op(B), A stored (K, M) when ta, B stored (N, K) when tb
};

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 1024;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) T = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  const int64_t C = 768;
  // The linear layers of one GPT-2 124M block (x12) and the head (x1): in -> out.
  struct Layer {
    const char* name;
    int64_t in, out, count;
  };
  const Layer layers[] = {{"qkv", C, 3 * C, 12}, {"attn proj", C, C, 12}, {"fc", C, 4 * C, 12},
                          {"fc proj", 4 * C, C, 12}, {"lm head", C, 50304, 1}};
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  std::printf("GEMMs of one GPT-2 124M step, %lld tokens; OpenBLAS core %s\n", static_cast<long long>(T),
              openblas_get_corename());
  std::printf("%-10s %-8s %6s %6s %6s %9s %9s %9s %7s %9s\n", "layer", "gemm", "M", "N", "K", "sgemm", "dnnl f32",
              "dnnl bf16", "bf16/s", "rel err");
  double step_s = 0, step_b = 0, step_f = 0;
  std::string isa;
  for (const Layer& l : layers) {
    const Gemm gemms[] = {{"fwd", T, l.out, l.in, false, true},
                          {"dx", T, l.in, l.out, false, false},
                          {"dW", l.out, l.in, T, true, false}};
    for (const Gemm& g : gemms) {
      std::vector<float> a(g.M * g.K), b(g.K * g.N), c(g.M * g.N), cb(g.M * g.N), cf(g.M * g.N);
      uint32_t seed = 12345;  // uniform in [-0.5, 0.5), a linear congruential sequence
      auto next = [&] { return static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.f - 0.5f; };
      for (float& x : a) x = next();
      for (float& x : b) x = next();
      std::vector<uint16_t> a16(a.size()), b16(b.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
      for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
      const double t_s = best_of(reps, [&] {
        cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M, g.N,
                    g.K, 1.f, a.data(), g.ta ? g.M : g.K, b.data(), g.tb ? g.K : g.N, 0.f, c.data(), g.N);
      });
      auto dnnl_time = [&](memory::data_type dt, void* pa, void* pb, float* out) {
        const memory::desc ad({g.M, g.K}, dt, g.ta ? Tag::ba : Tag::ab);
        const memory::desc bd({g.K, g.N}, dt, g.tb ? Tag::ba : Tag::ab);
        const memory::desc cd({g.M, g.N}, memory::data_type::f32, Tag::ab);
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng);
        if (dt == memory::data_type::bf16) isa = pd.impl_info_str();
        dnnl::matmul mm(pd);
        memory am(ad, eng, pa), bm(bd, eng, pb), cm(cd, eng, out);
        return best_of(reps, [&] {
          mm.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
          st.wait();
        });
      };
      const double t_f = dnnl_time(memory::data_type::f32, a.data(), b.data(), cf.data());
      const double t_b = dnnl_time(memory::data_type::bf16, a16.data(), b16.data(), cb.data());
      double err = 0, scale = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        err = std::max(err, static_cast<double>(std::fabs(cb[i] - c[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(c[i])));
      }
      const double fl = 2.0 * g.M * g.N * g.K;
      std::printf("%-10s %-8s %6lld %6lld %6lld %9.1f %9.1f %9.1f %7.2f %9.2e\n", l.name, g.what,
                  static_cast<long long>(g.M), static_cast<long long>(g.N), static_cast<long long>(g.K),
                  fl / t_s / 1e9, fl / t_f / 1e9, fl / t_b / 1e9, t_s / t_b, err / scale);
      step_s += t_s * l.count, step_f += t_f * l.count, step_b += t_b * l.count;
    }
  }
  std::printf("step GEMM time: sgemm %.3f s, oneDNN f32 %.3f s, oneDNN bf16 %.3f s (bf16 %.2fx sgemm); oneDNN bf16 "
              "kernel: %s\n", step_s, step_f, step_b, step_s / step_b, isa.c_str());
  return 0;
}
