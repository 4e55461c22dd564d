// GPU tests of the CUDA ops (all but attention) against the CPU reference ops
// on seeded random inputs with odd shapes, in f32, bf16 and f16: each case is
// an OpCase (test/ops_harness/op_case.h) whose field list comes from the op's
// declaration, run in the harness's CUDA-vs-CPU mode. Skipped (exit 77) when
// no device is present.
#include <cmath>
#include <cstring>

#include "cuda/core/check.h"
#include "cuda/cuda_api.h"
#include "lib/cpu/cpu_ops.h"
#include "lib/ops/ops.h"
#include "test/ops_harness/op_case_cuda.h"
#include "test/cuda/norm_stats.h"
#include "test/ops_harness/op_cases.h"

using namespace ds;
using namespace ds::test;

namespace {

const DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

const Tensor zeros_f32(const Shape& s) { return Tensor::zeros(s, DType::F32); }

// Row lengths of the norm tests: odd (scalar lanes), a multiple of 8 (16-byte
// vectors), long rows that need several vectors per thread in the one-pass
// backward (5000: 3 per thread in bf16, 5 in f32), and one past its limit of
// 8192 (the two-pass fallback).
struct NormShape {
  int64_t N, C;
};
const NormShape kNormShapes[] = {{37, 203}, {29, 768}, {5, 5000}, {3, 8200}};

}  // namespace

TEST_CASE("cuda layernorm forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes)
    for (const NormShape& sh : kNormShapes) {
      const int64_t N = sh.N, C = sh.C;
      INFO("N " << N << " C " << C);
      check_cuda_vs_cpu_offsets(
          layernorm_forward_case({.out = zeros_f32({N, C}), .mean = zeros_f32({N}), .rstd = zeros_f32({N}),
                                  .inp = randn({N, C}, 1, 2.0f), .weight = randn({C}, 2), .bias = randn({C}, 3)}),
          dt);
      // Backward: mean/rstd from the f32 inputs (exact statistics), grads accumulate.
      Tensor inp = randn({N, C}, 4, 1.5f), mean, rstd, unused;
      norm_stats(inp, mean, rstd, unused);
      for (Accum acc : {Accum::Overwrite, Accum::Add}) {
        OpCase bw = make_case("layernorm_backward",
                              LayerNormBwdArgs{.dinp = randn({N, C}, 5), .dweight = randn({C}, 6),
                                               .dbias = randn({C}, 7), .dout = randn({N, C}, 8),
                                               .inp = inp, .weight = randn({C}, 9), .mean = mean,
                                               .rstd = rstd, .accum = acc},
                              ops::layernorm_backward);
        check_cuda_vs_cpu_offsets(set_kind(bw, {"mean", "rstd"}, Kind::F32), dt);
      }
      // Input gradient only, and weight gradients only.
      OpCase dx = make_case("layernorm_backward (dinp only)",
                            LayerNormBwdArgs{.dinp = randn({N, C}, 5), .dout = randn({N, C}, 8), .inp = inp,
                                             .weight = randn({C}, 9), .mean = mean, .rstd = rstd},
                            ops::layernorm_backward);
      check_cuda_vs_cpu(set_kind(dx, {"mean", "rstd"}, Kind::F32), dt);
      OpCase dw = make_case("layernorm_backward (dweight/dbias only)",
                            LayerNormBwdArgs{.dweight = randn({C}, 6), .dbias = randn({C}, 7),
                                             .dout = randn({N, C}, 8), .inp = inp, .weight = randn({C}, 9),
                                             .mean = mean, .rstd = rstd},
                            ops::layernorm_backward);
      check_cuda_vs_cpu(set_kind(dw, {"mean", "rstd"}, Kind::F32), dt);
    }
}

TEST_CASE("cuda layernorm backward: many rows, repeatable bits") {
  if (!gpu_or_skip()) return;
  // More rows than the one-pass kernel has chunks (512): several rows per block.
  const int64_t N = 1537, C = 264;
  Tensor inp = randn({N, C}, 201, 1.5f), mean, rstd, unused;
  norm_stats(inp, mean, rstd, unused);
  for (DType dt : kAllTypes) {
    OpCase bw = make_case("layernorm_backward (1537 rows)",
                          LayerNormBwdArgs{.dinp = randn({N, C}, 202), .dweight = randn({C}, 203),
                                           .dbias = randn({C}, 204), .dout = randn({N, C}, 205), .inp = inp,
                                           .weight = randn({C}, 206), .mean = mean, .rstd = rstd},
                          ops::layernorm_backward);
    check_cuda_vs_cpu(set_kind(bw, {"mean", "rstd", "dweight", "dbias"}, Kind::F32), dt);
  }
  Tensor dout = upload(randn({N, C}, 205), DType::BF16), x = upload(inp, DType::BF16);
  Tensor w = upload(randn({C}, 206), DType::BF16), dm = upload(mean, DType::F32), dr = upload(rstd, DType::F32);
  Tensor first;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda(0)), db = dw.clone();
    Tensor dx = Tensor::zeros({N, C}, DType::BF16, Device::cuda(0));
    ops::layernorm_backward(LayerNormBwdArgs{dx, dw, db, dout, x, w, dm, dr});
    Tensor h = dw.to(Device::cpu());
    if (rep == 0) first = h;
    else REQUIRE(std::memcmp(h.raw(), first.raw(), h.nbytes()) == 0);
  }
}

TEST_CASE("cuda rmsnorm forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes)
    for (const NormShape& sh : kNormShapes) {
      const int64_t N = sh.N, C = sh.C;
      INFO("N " << N << " C " << C);
      check_cuda_vs_cpu_offsets(rmsnorm_forward_case({.out = zeros_f32({N, C}), .rstd = zeros_f32({N}),
                                                      .inp = randn({N, C}, 11, 3.0f), .weight = randn({C}, 12)}),
                                dt);
      Tensor inp = randn({N, C}, 13), unused1, unused2, rstd;
      norm_stats(inp, unused1, unused2, rstd);
      for (Accum acc : {Accum::Overwrite, Accum::Add}) {
        OpCase bw = make_case("rmsnorm_backward",
                              RMSNormBwdArgs{.dinp = randn({N, C}, 14), .dweight = randn({C}, 15),
                                             .dout = randn({N, C}, 16), .inp = inp,
                                             .weight = randn({C}, 17), .rstd = rstd, .accum = acc},
                              ops::rmsnorm_backward);
        check_cuda_vs_cpu_offsets(set_kind(bw, {"rstd"}, Kind::F32), dt);
      }
    }
}

// The fused residual add + norm against the CPU's add then norm: sum and out
// compared like any op; odd and vector-friendly row lengths, misaligned views.
TEST_CASE("cuda add_norm_forward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes)
    for (const NormShape& sh : {NormShape{37, 203}, NormShape{29, 768}, NormShape{3, 4096}})
      for (NormType nt : {NormType::LayerNorm, NormType::RMSNorm}) {
        const int64_t N = sh.N, C = sh.C;
        const bool ln = nt == NormType::LayerNorm;
        AddNormArgs a{.sum = zeros_f32({N, C}), .out = zeros_f32({N, C}), .rstd = zeros_f32({N}),
                      .a = randn({N, C}, 151, 2.0f), .b = randn({N, C}, 152), .weight = randn({C}, 153),
                      .norm = nt};
        if (ln) {
          a.mean = zeros_f32({N});
          a.bias = randn({C}, 154);
        }
        OpCase c = make_case(ln ? "add_norm_forward (layernorm)" : "add_norm_forward (rmsnorm)", a,
                             ops::add_norm_forward);
        for (const char* in : {"a", "b", "weight", "bias"})
          if (c.fields.count(in)) c.fields.at(in).output = false;  // Native role: inputs by name
        set_kind(c, ln ? std::vector<std::string>{"mean", "rstd"} : std::vector<std::string>{"rstd"}, Kind::F32);
        INFO("N " << N << " C " << C);
        check_cuda_vs_cpu_offsets(c, dt);
      }
}

TEST_CASE("cuda embedding forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t B = 3, T = 45, C = 291, V = 70, maxT = 64, vs = 10, off = 5;
    // Tokens in [0, 90): some fall outside this rank's rows [10, 80).
    Tensor tokens = randint({B, T}, 21, 0, 90);
    for (bool with_wpe : {true, false}) {
      EmbeddingArgs f{.out = zeros_f32({B, T, C}), .tokens = tokens, .wte = randn({V, C}, 22),
                      .vocab_start = vs, .pos_offset = off};
      if (with_wpe) f.wpe = randn({maxT, C}, 23);
      check_cuda_vs_cpu(make_case("embedding_forward", f, ops::embedding_forward), dt);
      EmbeddingBwdArgs b{.dwte = randn({V, C}, 24), .dout = randn({B, T, C}, 25), .tokens = tokens,
                         .vocab_start = vs, .pos_offset = off};
      if (with_wpe) b.dwpe = randn({maxT, C}, 26);
      check_cuda_vs_cpu(make_case("embedding_backward", b, ops::embedding_backward), dt);
    }
  }
}

TEST_CASE("cuda embedding backward is deterministic") {
  if (!gpu_or_skip()) return;
  const int64_t B = 4, T = 513, C = 96, V = 50;
  Tensor tokens = upload(randint({B, T}, 31, 0, 8), DType::F32);  // many repeats
  Tensor dout = upload(randn({B, T, C}, 32), DType::F32);
  Tensor first;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor dwte = Tensor::zeros({V, C}, DType::F32, Device::cuda(0));
    ops::embedding_backward(EmbeddingBwdArgs{dwte, Tensor{}, dout, tokens, 0, 0});
    Tensor h = dwte.to(Device::cpu());
    if (rep == 0) first = h;
    else REQUIRE(std::memcmp(h.raw(), first.raw(), h.nbytes()) == 0);
  }
}


// The wte backward on token patterns that stress the bucketing, with both
// algorithms (sorted: radix sort + per-row sums; scan: the baseline) against
// the CPU op: repeats across several sort tiles (2048 tokens) and many sum
// tiles (32 pairs), one token everywhere (its row spans every tile), a
// vocab-parallel shard (tokens outside are skipped), 70000 rows (3 radix
// passes) with C = 13 (no vectors), a single token. dwte f32 as in mixed
// precision; every field also as a misaligned view (scalar path).
TEST_CASE("cuda embedding backward: repeated, uniform and sharded tokens, both algorithms") {
  if (!gpu_or_skip()) return;
  struct EmbCase {
    const char* what;
    int64_t B, T, C, V, vocab_start;
    int lo, hi;  // tokens uniform in [lo, hi)
  };
  const EmbCase cases[] = {{"8 distinct tokens, 3000 positions", 3, 1000, 96, 50, 0, 0, 8},
                           {"one token everywhere", 1, 1500, 203, 40, 0, 7, 8},
                           {"vocab shard [300, 700) of [0, 1000)", 2, 777, 768, 400, 300, 0, 1000},
                           {"70000 rows, C 13", 1, 300, 13, 70000, 0, 0, 70000},
                           {"a single token", 1, 1, 8, 5, 0, 3, 4}};
  for (cuda::EmbeddingBackward algo : {cuda::EmbeddingBackward::Sorted, cuda::EmbeddingBackward::Scan}) {
    cuda::set_embedding_backward(algo);
    for (const EmbCase& ec : cases)
      for (DType dt : kAllTypes) {
        INFO(ec.what << (algo == cuda::EmbeddingBackward::Scan ? " (scan)" : " (sorted)"));
        EmbeddingBwdArgs b{.dwte = randn({ec.V, ec.C}, 61), .dout = randn({ec.B, ec.T, ec.C}, 62),
                           .tokens = randint({ec.B, ec.T}, 63, ec.lo, ec.hi), .vocab_start = ec.vocab_start};
        OpCase c = make_case("embedding_backward", b, ops::embedding_backward);
        set_kind(c, {"dwte"}, Kind::F32);
        check_cuda_vs_cpu_offsets(c, dt);
      }
  }
  cuda::set_embedding_backward(cuda::EmbeddingBackward::Sorted);
}

// Bit-reproducibility of the sorted wte backward: two runs give the same
// bytes (bf16 dout, f32 dwte; repeats, one row spanning all tiles, a shard),
// and the scalar path (dwte a misaligned view) gives the vector path's bytes.
TEST_CASE("cuda embedding backward (sorted) repeats bit for bit, vector and scalar paths alike") {
  if (!gpu_or_skip()) return;
  cuda::set_embedding_backward(cuda::EmbeddingBackward::Sorted);
  struct Rep {
    int64_t N, V, vocab_start;
    int lo, hi;
  };
  for (const Rep& r : {Rep{5000, 64, 0, 0, 9}, Rep{4100, 16, 0, 5, 6}, Rep{3000, 500, 250, 0, 1000}}) {
    INFO("N " << r.N << " tokens [" << r.lo << ", " << r.hi << ") rows from " << r.vocab_start);
    const int64_t C = 256;
    Tensor tokens = upload(randint({1, r.N}, 71, r.lo, r.hi), DType::F32);
    Tensor dout = upload(randn({1, r.N, C}, 72), DType::BF16);
    Tensor init = randn({r.V, C}, 73);
    auto run = [&](int64_t offset) {
      Tensor big = Tensor::zeros({r.V * C + offset}, DType::F32, Device::cuda(0));
      Tensor dwte = big.view(offset, {r.V, C});
      dwte.copy_from(init.to(Device::cuda(0)));
      ops::embedding_backward(EmbeddingBwdArgs{.dwte = dwte, .dout = dout, .tokens = tokens, .vocab_start = r.vocab_start});
      return dwte.to(Device::cpu());
    };
    const Tensor first = run(0), second = run(0), scalar = run(1);
    CHECK(std::memcmp(first.raw(), second.raw(), first.nbytes()) == 0);
    CHECK(std::memcmp(first.raw(), scalar.raw(), first.nbytes()) == 0);
    CHECK(std::memcmp(first.raw(), init.raw(), first.nbytes()) != 0);  // the op did write
  }
}

TEST_CASE("cuda matmul forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 67, C = 129, OC = 45;
    for (bool bias : {true, false}) {
      MatmulArgs f{.out = zeros_f32({N, OC}), .inp = randn({N, C}, 41),
                   .weight = randn({OC, C}, 42, 0.1f)};
      if (bias) f.bias = randn({OC}, 43);
      check_cuda_vs_cpu(matmul_forward_case(f), dt);
    }
    for (Accum acc : {Accum::Overwrite, Accum::Add}) {
      check_cuda_vs_cpu(make_case("matmul_backward",
                                  MatmulBwdArgs{.dinp = randn({N, C}, 44), .dweight = randn({OC, C}, 45),
                                                .dbias = randn({OC}, 46), .dout = randn({N, OC}, 47),
                                                .inp = randn({N, C}, 48),
                                                .weight = randn({OC, C}, 49, 0.1f), .accum = acc},
                                  ops::matmul_backward),
                        dt);
    }
  }
}

TEST_CASE("cuda rope forward and backward") {
  if (!gpu_or_skip()) return;
  struct RopeCase {
    int NH, NKV, R;  // kv heads, rotated dims (0: all)
    float theta;
  };
  // Multi-head, grouped-query with LLaMA-3's base, partial rotation (GPT-NeoX's rotary_pct).
  for (const RopeCase& rc : {RopeCase{3, 3, 0, 10000.f}, RopeCase{4, 2, 0, 500000.f}, RopeCase{4, 1, 8, 10000.f}})
    for (DType dt : kAllTypes) {
      const int64_t B = 2, T = 37;
      const int HS = 18, W = (rc.NH + 2 * rc.NKV) * HS;
      for (bool fwd : {true, false}) {
        const RopeArgs a{.out = zeros_f32({B, T, W}), .inp = randn({B, T, W}, 51), .NH = rc.NH,
                         .pos_offset = 1000, .theta = rc.theta, .NKV = rc.NKV, .rot_dims = rc.R};
        check_cuda_vs_cpu(fwd ? make_case("rope_forward", a, ops::rope_forward)
                              : make_case("rope_backward", a, ops::rope_backward),
                          dt);
      }
    }
}

// The vectorised RoPE (V pairs per thread) against the CPU op: head sizes
// 64 and 128 (16-byte vectors), partial rotation with R/2 = 8 or 16, grouped
// query heads, HS 18 (R/2 = 9: scalar) and an odd head size 9 (R = 6); every
// field also as a misaligned view (scalar path).
TEST_CASE("cuda rope, vectorised and scalar paths") {
  if (!gpu_or_skip()) return;
  struct RopeCase {
    int NH, NKV, HS, R;
  };
  for (const RopeCase& rc : {RopeCase{4, 4, 64, 0}, RopeCase{4, 2, 128, 0}, RopeCase{2, 1, 64, 16},
                             RopeCase{2, 2, 128, 32}, RopeCase{3, 3, 18, 0}, RopeCase{2, 2, 9, 6}})
    for (DType dt : kAllTypes)
      for (bool fwd : {true, false}) {
        INFO("NH " << rc.NH << " NKV " << rc.NKV << " HS " << rc.HS << " R " << rc.R);
        const int64_t B = 2, T = 21, W = (rc.NH + 2 * rc.NKV) * rc.HS;
        const RopeArgs a{.out = zeros_f32({B, T, W}), .inp = randn({B, T, W}, 81), .NH = rc.NH,
                         .pos_offset = 4000, .theta = 10000.f, .NKV = rc.NKV, .rot_dims = rc.R};
        check_cuda_vs_cpu_offsets(fwd ? make_case("rope_forward", a, ops::rope_forward)
                                      : make_case("rope_backward", a, ops::rope_backward),
                                  dt);
      }
}

// The per-pair arithmetic is shared by both paths: the vector path (aligned),
// the scalar path (a misaligned view) and the in-place call (out = inp, the
// backward's form) give the same bytes.
TEST_CASE("cuda rope: vector, scalar and in-place calls give the same bits") {
  if (!gpu_or_skip()) return;
  for (DType dt : {DType::F32, DType::BF16})
    for (int R : {0, 32}) {
      INFO(dtype_name(dt) << " R " << R);
      const int NH = 4, NKV = 2, HS = 64;
      const int64_t B = 2, T = 33, W = (NH + 2 * NKV) * HS;
      const Tensor x = upload(randn({B, T, W}, 82), dt);
      auto rope = [&](const Tensor& out, const Tensor& inp) {
        ops::rope_forward(RopeArgs{.out = out, .inp = inp, .NH = NH, .pos_offset = 77, .NKV = NKV, .rot_dims = R});
        return out.to(Device::cpu());
      };
      const Tensor vec = rope(Tensor::empty({B, T, W}, dt, Device::cuda(0)), x);
      Tensor big_in = Tensor::empty({x.numel() + 1}, dt, Device::cuda(0));
      Tensor big_out = Tensor::empty({x.numel() + 1}, dt, Device::cuda(0));
      Tensor xin = big_in.view(1, {B, T, W});
      xin.copy_from(x);
      const Tensor scalar = rope(big_out.view(1, {B, T, W}), xin);
      Tensor inplace = x.clone();
      const Tensor inpl = rope(inplace, inplace);
      CHECK(std::memcmp(vec.raw(), scalar.raw(), vec.nbytes()) == 0);
      CHECK(std::memcmp(vec.raw(), inpl.raw(), vec.nbytes()) == 0);
    }
}

// The model fuses a layer's closing residual add with the next norm1 and
// re-runs that norm unfused in a full recompute, so add_norm_forward must
// equal add then the norm bit for bit on the GPU: sum, out, mean and rstd,
// with vectors (C 768), without (C 203), and with `a` misaligned (the
// element-wise loads inside the vector partition).
TEST_CASE("cuda add_norm_forward equals add then the norm bit for bit") {
  if (!gpu_or_skip()) return;
  const auto same = [](const Tensor& x, const Tensor& y) {
    const Tensor hx = x.to(Device::cpu()), hy = y.to(Device::cpu());
    return std::memcmp(hx.raw(), hy.raw(), hx.nbytes()) == 0;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t C : {768, 203})
      for (int64_t a_off : {0, 1})
        for (NormType nt : {NormType::LayerNorm, NormType::RMSNorm}) {
          const bool ln = nt == NormType::LayerNorm;
          INFO(dtype_name(dt) << " C " << C << " a offset " << a_off << (ln ? " layernorm" : " rmsnorm"));
          const int64_t N = 67;
          auto dev = [&](const Shape& s, DType t) { return Tensor::empty(s, t, Device::cuda(0)); };
          Tensor big = dev({N * C + a_off}, dt), a = big.view(a_off, {N, C});
          a.copy_from(upload(randn({N, C}, 91, 3.0f), dt));
          const Tensor b = upload(randn({N, C}, 92), dt), w = upload(randn({C}, 93), DType::F32);
          const Tensor bias = ln ? upload(randn({C}, 94), DType::F32) : Tensor();
          Tensor sum1 = dev({N, C}, dt), out1 = dev({N, C}, dt), rstd1 = dev({N}, DType::F32);
          Tensor mean1 = ln ? dev({N}, DType::F32) : Tensor();
          ops::add_norm_forward({.sum = sum1, .out = out1, .mean = mean1, .rstd = rstd1, .a = a, .b = b,
                                 .weight = w, .bias = bias, .norm = nt});
          Tensor sum2 = dev({N, C}, dt), out2 = dev({N, C}, dt), rstd2 = dev({N}, DType::F32);
          Tensor mean2 = ln ? dev({N}, DType::F32) : Tensor();
          ops::add({.out = sum2, .a = a, .b = b});
          if (ln)
            ops::layernorm_forward({.out = out2, .mean = mean2, .rstd = rstd2, .inp = sum2, .weight = w, .bias = bias});
          else
            ops::rmsnorm_forward({.out = out2, .rstd = rstd2, .inp = sum2, .weight = w});
          CHECK(same(sum1, sum2));
          CHECK(same(out1, out2));
          CHECK(same(rstd1, rstd2));
          if (ln) CHECK(same(mean1, mean2));
        }
}

TEST_CASE("cuda gelu, relu and swiglu forward and backward") {
  if (!gpu_or_skip()) return;
  // F = 157: odd sizes (vector body plus a scalar tail for gelu, all scalar
  // for swiglu); F = 256: whole vectors. Each at aligned and odd offsets.
  for (DType dt : kAllTypes)
  for (int64_t F : {157, 256}) {
    const int64_t N = 13;
    GeluArgs g{.out = zeros_f32({N, F}), .inp = randn({N, F}, 61, 2.0f)};
    check_cuda_vs_cpu_offsets(make_case("gelu_forward", g, ops::gelu_forward), dt);
    g.dout = randn({N, F}, 62);
    check_cuda_vs_cpu_offsets(make_case("gelu_backward", g, ops::gelu_backward), dt);
    check_cuda_vs_cpu_offsets(make_case("relu_forward", GeluArgs{.out = zeros_f32({N, F}), .inp = g.inp},
                                        ops::relu_forward),
                              dt);
    check_cuda_vs_cpu_offsets(make_case("relu_backward", g, ops::relu_backward), dt);
    check_cuda_vs_cpu_offsets(make_case("swiglu_forward",
                                SwigluArgs{.out = zeros_f32({N, F}), .inp = randn({N, 2 * F}, 63, 2.0f)},
                                ops::swiglu_forward),
                      dt);
    check_cuda_vs_cpu_offsets(make_case("swiglu_backward",
                                SwigluBwdArgs{.dinp = zeros_f32({N, 2 * F}), .dout = randn({N, F}, 64),
                                              .inp = randn({N, 2 * F}, 65, 2.0f)},
                                ops::swiglu_backward),
                      dt);
  }
}

TEST_CASE("cuda add, scale, sum_squares, nonfinite_check") {
  if (!gpu_or_skip()) return;
  // 10007: vector body + tail; 7: shorter than one vector; 1024: whole vectors.
  for (DType dt : kAllTypes)
  for (int64_t n : {10007, 7, 1024}) {
    check_cuda_vs_cpu_offsets(
        make_case("add", AddArgs{.out = zeros_f32({n}), .a = randn({n}, 71), .b = randn({n}, 72)}, ops::add),
        dt);
    check_cuda_vs_cpu_offsets(make_case("scale", ScaleArgs{.x = randn({n}, 73), .s = 0.37f}, ops::scale), dt);
    Tensor init = Tensor::empty({1}, DType::F32);
    init.data<float>()[0] = 3.5f;
    OpCase ss = make_case("sum_squares", SumSquaresArgs{.out = init, .x = randn({3 * n + 1}, 74)},
                          ops::sum_squares);
    check_cuda_vs_cpu_offsets(set_kind(ss, {"out"}, Kind::F32), dt);
    // A bad value in the head, the body and the tail of the vector plan, at
    // an aligned and a misaligned start.
    for (int64_t off : {0, 3})
      for (int64_t at : {int64_t(0), n / 2, n - 1})
        for (float bad : {0.0f, INFINITY, NAN}) {
          Tensor x = randn({n}, 75);
          x.data<float>()[at] = bad == 0.0f ? 1.0f : bad;
          Tensor big = Tensor::zeros({n + off}, dt, Device::cuda(0));
          Tensor xv = big.view(off, {n});
          xv.copy_from(upload(x, dt));
          Tensor flag = Tensor::zeros({1}, DType::F32, Device::cuda(0));
          ops::nonfinite_check(NonFiniteArgs{flag, xv});
          float got = flag.to(Device::cpu()).data<float>()[0];
          INFO("n " << n << " offset " << off << " at " << at << " value " << bad);
          CHECK(got == (bad == 0.0f ? 0.0f : 1.0f));
        }
  }
}

TEST_CASE("cuda masked_mean matches the CPU's") {
  if (!gpu_or_skip()) return;
  // 7: fewer rows than threads; 1001: a partial last stride; 70001: many
  // strides per thread. Ignored rows (-1, -100) throughout; then all ignored.
  for (int64_t n : {7, 1001, 70001}) {
    INFO("n " << n);
    Tensor losses = randn({n}, 91, 3.0);
    Tensor targets = randint({n}, 92, 0, 50);
    for (int64_t i = 0; i < n; i += 5) targets.data<int32_t>()[i] = i % 2 ? -1 : -100;
    Tensor cpu_out = Tensor::empty({1}, DType::F32);
    cpu_out.data<float>()[0] = 0.75f;
    Tensor gpu_out = cpu_out.to(Device::cuda(0));
    const Tensor gl = losses.to(Device::cuda(0)), gt = targets.to(Device::cuda(0));
    for (float w : {0.125f, 1.0f}) {  // accumulates across calls, as over a step's micro-batches
      ops::masked_mean(MaskedMeanArgs{.out = cpu_out, .losses = losses, .targets = targets, .weight = w});
      ops::masked_mean(MaskedMeanArgs{.out = gpu_out, .losses = gl, .targets = gt, .weight = w});
    }
    const float want = cpu_out.data<float>()[0], got = gpu_out.to(Device::cpu()).data<float>()[0];
    INFO("cpu " << want << " cuda " << got);
    CHECK(want != 0.75f);
    CHECK(std::fabs(got - want) <= 1e-6f * std::fabs(want));
    // Every target ignored: the sum stays exactly what it was.
    Tensor all_ignored = targets.clone();
    for (int64_t i = 0; i < n; ++i) all_ignored.data<int32_t>()[i] = -1;
    ops::masked_mean(
        MaskedMeanArgs{.out = gpu_out, .losses = gl, .targets = all_ignored.to(Device::cuda(0)), .weight = 1.f});
    CHECK(gpu_out.to(Device::cpu()).data<float>()[0] == got);
  }
}

TEST_CASE("cuda cross entropy") {
  if (!gpu_or_skip()) return;
  // Vp = 1024: 16-byte vectors with the padded columns masked inside the last
  // ones; Vp = 1001: element by element. Both at misaligned offsets too.
  for (DType dt : kAllTypes)
  for (int64_t Vp : {1024, 1001}) {
    const int64_t N = 19, V = 1001;
    Tensor targets = randint({N}, 81, 0, int(V));
    targets.data<int32_t>()[3] = -1;  // ignored row
    targets.data<int32_t>()[7] = -100;
    targets.data<int32_t>()[5] = 500;  // row 5 starts with -inf logits (below)
    for (bool grad : {false, true}) {
      CrossEntropyArgs a{.losses = zeros_f32({N}), .logits = randn({N, Vp}, 82, 3.0f),
                         .targets = targets, .V = V, .dloss = 1.0f / 17};
      // -inf logits (a masked vocabulary entry) where a thread's running max
      // is still -inf: they add exp(-inf) = 0, never NaN.
      for (int64_t j = 0; j < 16; ++j) a.logits.data<float>()[5 * Vp + j] = -INFINITY;
      if (grad) a.dlogits = zeros_f32({N, Vp});
      check_cuda_vs_cpu_offsets(make_case("cross_entropy", a, ops::cross_entropy), dt);
    }
  }
}

TEST_CASE("cuda kd loss vs cpu") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes)
    for (bool grad : {false, true}) {
      const int64_t N = 13, V = 1001, Vp = 1024;
      KdLossArgs a{.losses = zeros_f32({N}), .logits = randn({N, Vp}, 83, 3.0f), .teacher = randn({N, Vp}, 84, 3.0f),
                   .V = V, .temp = 2.0f, .dscale = 1.0f / 7};
      if (grad) a.dlogits = zeros_f32({N, Vp});
      check_cuda_vs_cpu_offsets(make_case("kd_loss", a, ops::kd_loss), dt);
    }
}

TEST_CASE("cuda cross entropy: a loss scale read from the device gives the by-value bits") {
  if (!gpu_or_skip()) return;
  // dloss x *dloss_scale (a power of two, as the fp16 loss scale of a
  // captured step) against dloss x scale passed by value; and CUDA vs CPU.
  const Device gpu = Device::cuda(0);
  for (DType dt : kAllTypes) {
    const int64_t N = 13, V = 1001, Vp = 1024;
    Tensor targets = randint({N}, 83, 0, int(V));
    targets.data<int32_t>()[2] = -1;
    const Tensor logits = upload(randn({N, Vp}, 84, 3.0f), dt);
    Tensor scale = Tensor::empty({1}, DType::F32);
    scale.data<float>()[0] = 4096.f;
    const float dloss = 1.0f / 23;
    auto grads = [&](float w, const Tensor& s) {
      CrossEntropyArgs a{.losses = zeros_f32({N}).to(gpu), .dlogits = upload(zeros_f32({N, Vp}), dt),
                         .logits = logits, .targets = targets.to(gpu), .V = V, .dloss = w, .dloss_scale = s};
      ops::cross_entropy(a);
      return std::make_pair(a.losses.to(Device::cpu()), a.dlogits.to(Device::cpu()));
    };
    const auto by_value = grads(dloss * 4096.f, Tensor()), on_device = grads(dloss, scale.to(gpu));
    CHECK(std::memcmp(by_value.first.raw(), on_device.first.raw(), by_value.first.nbytes()) == 0);
    CHECK(std::memcmp(by_value.second.raw(), on_device.second.raw(), by_value.second.nbytes()) == 0);
    CrossEntropyArgs a{.losses = zeros_f32({N}), .dlogits = zeros_f32({N, Vp}), .logits = randn({N, Vp}, 85, 3.0f),
                       .targets = targets, .V = V, .dloss = dloss, .dloss_scale = scale};
    OpCase c = make_case("cross_entropy scaled", a, ops::cross_entropy);
    check_cuda_vs_cpu_offsets(set_kind(c, {"dloss_scale"}, Kind::F32), dt);
  }
}

TEST_CASE("cuda adamw step") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t n = 5003;
    Tensor v = randn({n}, 94);
    for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::fabs(v.data<float>()[i]) * 1e-3f;
    AdamWArgs a{.param = randn({n}, 91), .grad = randn({n}, 92, 0.01f), .m = randn({n}, 93, 1e-3f),
                .v = v, .lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 7};
    if (dt != DType::F32) a.param_lowp = zeros_f32({n});
    OpCase c = make_case("adamw_step", a, ops::adamw_step);
    check_cuda_vs_cpu_offsets(set_kind(c, {"param", "m", "v"}, Kind::F32), dt);
    // One call over several parameters (the optimizer's flat range): segments
    // with and without decay, gaps left untouched, tiny segments inside one
    // vector, a segment ending at n.
    Tensor seg = Tensor::empty({6, 3}, DType::I64);
    const int64_t rows[6][3] = {{0, 1, 1}, {1, 3, 0}, {5, 700, 1}, {700, 701, 0}, {701, 4000, 0}, {4001, n, 1}};
    std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
    a.segments = seg;
    OpCase cs = make_case("adamw_step (segments)", a, ops::adamw_step);
    cs.fields.at("segments").output = false;
    check_cuda_vs_cpu_offsets(set_kind(cs, {"param", "m", "v"}, Kind::F32), dt);
  }
}

TEST_CASE("cuda optim_step rules (L2 Adam, AdamW, SGD, Adagrad, Lion, Lamb's passes, 1-bit and 0/1 Adam's, 1-bit Lamb's) match the CPU") {
  if (!gpu_or_skip()) return;
  const int64_t n = 5003;
  Tensor seg = Tensor::empty({4, 3}, DType::I64);
  const int64_t rows[4][3] = {{0, 1, 1}, {5, 700, 0}, {700, 4000, 1}, {4001, n, 0}};
  std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
  Tensor v = randn({n}, 94);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::fabs(v.data<float>()[i]) * 1e-3f;
  OptimTerms t{.lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.5f, .step_size = 2e-3f, .inv_sqrt_bc2 = 1.5f,
               .momentum = 0.9f, .dampening = 0.1f};
  const OptimRule rules[] = {OptimRule::AdamL2, OptimRule::AdamW, OptimRule::Sgd, OptimRule::Adagrad,
                             OptimRule::Lion, OptimRule::LambMoments, OptimRule::LambApply,
                             OptimRule::OneBitMoments, OptimRule::OneBitMomentum, OptimRule::OneBitApply,
                             OptimRule::ZeroOneUnwind, OptimRule::ZeroOneSync, OptimRule::OneBitLambMomentum,
                             OptimRule::OneBitLambFresh};
  for (OptimRule r : rules) {
    for (DType dt : kAllTypes) {
      const bool zero_one = r == OptimRule::ZeroOneUnwind || r == OptimRule::ZeroOneSync;
      const bool lamb1 = r == OptimRule::OneBitLambMomentum, lamb2 = r == OptimRule::OneBitLambFresh;
      const bool two = r == OptimRule::AdamL2 || r == OptimRule::AdamW || r == OptimRule::LambMoments ||
                       r == OptimRule::LambApply || r == OptimRule::OneBitMoments || r == OptimRule::OneBitApply ||
                       zero_one || lamb2;
      const bool no_grad = r == OptimRule::LambApply || r == OptimRule::OneBitApply || zero_one || lamb2;
      const bool acc = zero_one || r == OptimRule::OneBitApply;  // 0/1 Adam's accumulator
      OptimStepArgs a{.param = randn({n}, 91), .grad = no_grad ? Tensor() : randn({n}, 92, 0.01f),
                      .s1 = randn({n}, 93, 1e-3f), .s2 = two ? v.clone() : Tensor(), .segments = seg, .rule = r, .t = t};
      if (r == OptimRule::Adagrad) a.s1 = v.clone();
      if (r == OptimRule::LambMoments) a.seg_stats = zeros_f32({4, 2});
      if (r == OptimRule::LambApply) a.seg_stats = randn({4}, 95, 1.f);
      if (dt != DType::F32 && r != OptimRule::LambMoments && !lamb1 && !lamb2) a.param_lowp = zeros_f32({n});
      if (acc) a.s3 = randn({n}, 96, 1e-3f);
      if (lamb1) a.seg_stats = randn({4}, 97, 1.f);  // the momentum scales
      if (lamb2) {  // the fresh variance (>= 0), the momentum before the step and the scales in column 0
        a.s3 = v.clone();
        for (int64_t i = 0; i < n; ++i) a.s3.data<float>()[i] *= 1.f + 0.5f * std::sin(static_cast<float>(i));
        a.seg_stats = zeros_f32({4, 4});
        for (int k = 0; k < 4; ++k) a.seg_stats.data<float>()[4 * k] = 0.5f + 0.4f * static_cast<float>(k);
      }
      if (lamb1 || lamb2) a.prev = randn({n}, 98, 1e-3f);
      if (r == OptimRule::ZeroOneSync) a.t.step_size = 0.25f;  // the learning rates' sum
      OpCase c = make_case("optim_step", a, ops::optim_step);
      c.fields.at("segments").output = false;
      std::vector<std::string> f32 = {"param", "s1"};
      if (two) f32.push_back("s2");
      if (acc || lamb2) f32.push_back("s3");
      if (lamb1 || lamb2) f32.push_back("prev");
      if (r == OptimRule::LambMoments || lamb2) f32.push_back("seg_stats");
      if (r == OptimRule::LambApply || lamb1) c.fields.at("seg_stats").output = false;
      if (lamb2) c.fields.at("prev").output = false;
      check_cuda_vs_cpu(set_kind(c, f32, Kind::F32), dt);
    }
  }
}

TEST_CASE("cuda token_gather and token_scatter match the CPU") {
  if (!gpu_or_skip()) return;
  // C 8: 16-byte words in bf16/f16 (and f32); C 7: 2-byte words in bf16/f16.
  for (const int64_t C : {8, 7, 264})
    for (DType dt : kAllTypes) {
      const int64_t B = 3, T = 50, R = 17;
      Tensor ix = Tensor::empty({B, R}, DType::I32);  // distinct per row: 3 and T are coprime
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < R; ++j) ix.data<int32_t>()[b * R + j] = static_cast<int32_t>((j * 3 + b) % T);
      const TokenRowsArgs a{.full = randn({B, T, C}, 5), .part = randn({B, R, C}, 6), .index = ix};
      INFO("C " << C << " " << dtype_name(dt));
      check_cuda_vs_cpu(token_gather_case(a), dt);
      check_cuda_vs_cpu(token_scatter_case(a), dt);
    }
}

TEST_CASE("cuda cast between float dtypes") {
  if (!gpu_or_skip()) return;
  const int64_t n = 1031;
  Tensor x = randn({n}, 101, 5.0f);
  // Offsets (source, destination): aligned, same misalignment, different phases.
  const int64_t offs[][2] = {{0, 0}, {3, 3}, {1, 0}, {0, 5}};
  for (DType from : kAllTypes) {
    for (DType to : kAllTypes) {
      for (const auto& o : offs) {
        Tensor sbig = Tensor::zeros({n + o[0]}, from, Device::cuda(0));
        Tensor src = sbig.view(o[0], {n});
        src.copy_from(upload(x, from));
        Tensor dbig = Tensor::zeros({n + o[1]}, to, Device::cuda(0));
        Tensor dst = dbig.view(o[1], {n});
        ops::cast(CastArgs{dst, src});
        Tensor got = download_f32(dst);
        Tensor want = round_to(round_to(x, from), to);
        INFO("cast " << dtype_name(from) << " -> " << dtype_name(to) << " offsets " << o[0] << ", " << o[1]);
        CHECK(rel_err(got, want) == 0.0);
      }
    }
  }
}

// Mixed precision as the trainer runs it: bf16/f16 activations and weights,
// f32 weight/bias gradients that accumulate. Same tolerance rules: the GPU
// error against the f32 CPU op on the unrounded inputs is at most 2x that of
// the CPU op run in f32 on the rounded (upcast) activations.
TEST_CASE("cuda mixed precision: low-precision activations, f32 weight grads") {
  if (!gpu_or_skip()) return;
  for (DType dt : {DType::BF16, DType::F16}) {
    {
      const int64_t N = 67, C = 129, OC = 45;
      for (Accum acc : {Accum::Overwrite, Accum::Add}) {
        OpCase bw = make_case("matmul_backward (f32 dweight/dbias)",
                              MatmulBwdArgs{.dinp = randn({N, C}, 144), .dweight = randn({OC, C}, 145),
                                            .dbias = randn({OC}, 146), .dout = randn({N, OC}, 147),
                                            .inp = randn({N, C}, 148),
                                            .weight = randn({OC, C}, 149, 0.1f), .accum = acc},
                              ops::matmul_backward);
        check_cuda_vs_cpu(set_kind(bw, {"dweight", "dbias"}, Kind::F32), dt);
      }
    }
    {
      const int64_t N = 37, C = 203;
      Tensor inp = randn({N, C}, 104, 1.5f), mean = Tensor::empty({N}, DType::F32),
             rstd = Tensor::empty({N}, DType::F32), rrstd = Tensor::empty({N}, DType::F32);
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, v = 0, ss = 0;
        for (int64_t c = 0; c < C; ++c) s += inp.data<float>()[n * C + c];
        double m = s / C;
        for (int64_t c = 0; c < C; ++c) {
          v += std::pow(inp.data<float>()[n * C + c] - m, 2);
          ss += std::pow(inp.data<float>()[n * C + c], 2);
        }
        mean.data<float>()[n] = float(m);
        rstd.data<float>()[n] = float(1.0 / std::sqrt(v / C + 1e-5));
        rrstd.data<float>()[n] = float(1.0 / std::sqrt(ss / C + 1e-5));
      }
      OpCase ln = make_case("layernorm_backward (f32 dweight/dbias)",
                            LayerNormBwdArgs{.dinp = randn({N, C}, 105), .dweight = randn({C}, 106),
                                             .dbias = randn({C}, 107), .dout = randn({N, C}, 108),
                                             .inp = inp, .weight = randn({C}, 109), .mean = mean,
                                             .rstd = rstd, .accum = Accum::Add},
                            ops::layernorm_backward);
      check_cuda_vs_cpu(set_kind(ln, {"dweight", "dbias", "mean", "rstd"}, Kind::F32), dt);
      OpCase rms = make_case("rmsnorm_backward (f32 dweight)",
                             RMSNormBwdArgs{.dinp = randn({N, C}, 114), .dweight = randn({C}, 115),
                                            .dout = randn({N, C}, 116), .inp = inp,
                                            .weight = randn({C}, 117), .rstd = rrstd,
                                            .accum = Accum::Overwrite},
                             ops::rmsnorm_backward);
      check_cuda_vs_cpu(set_kind(rms, {"dweight", "rstd"}, Kind::F32), dt);
    }
    {
      const int64_t B = 3, T = 45, C = 291, V = 70, maxT = 64, vs = 10, off = 5;
      Tensor tokens = randint({B, T}, 121, 0, 90);
      for (bool with_wpe : {true, false}) {
        EmbeddingBwdArgs b{.dwte = randn({V, C}, 124), .dout = randn({B, T, C}, 125),
                           .tokens = tokens, .vocab_start = vs, .pos_offset = off};
        if (with_wpe) b.dwpe = randn({maxT, C}, 126);
        OpCase bw = make_case("embedding_backward (f32 dwte/dwpe)", b, ops::embedding_backward);
        check_cuda_vs_cpu(set_kind(bw, with_wpe ? std::vector<std::string>{"dwte", "dwpe"}
                                                : std::vector<std::string>{"dwte"},
                                   Kind::F32),
                          dt);
      }
    }
  }
}

TEST_CASE("cuda mixed precision: genuinely wrong dtype combinations are rejected") {
  if (!gpu_or_skip()) return;
  const int64_t N = 8, C = 16, OC = 4;
  auto dev = [](const Shape& s, DType dt) { return Tensor::zeros(s, dt, Device::cuda(0)); };
  // f16 weight gradient with bf16 activations: neither f32 nor the compute dtype.
  MatmulBwdArgs mm{dev({N, C}, DType::BF16), dev({OC, C}, DType::F16), Tensor{},
                   dev({N, OC}, DType::BF16), dev({N, C}, DType::BF16), dev({OC, C}, DType::BF16)};
  CHECK_THROWS(ops::matmul_backward(mm));
  // Activations of two dtypes in one call.
  mm.dweight = dev({OC, C}, DType::F32);
  mm.dout = dev({N, OC}, DType::F16);
  CHECK_THROWS(ops::matmul_backward(mm));
  LayerNormBwdArgs ln{dev({N, C}, DType::BF16), dev({C}, DType::F16), Tensor{},
                      dev({N, C}, DType::BF16), dev({N, C}, DType::BF16), dev({C}, DType::BF16),
                      dev({N}, DType::F32),     dev({N}, DType::F32)};
  CHECK_THROWS(ops::layernorm_backward(ln));
}

// Stochastic rounding of a bf16 param_lowp: with lr = 0 the master weights do
// not move, so the GPU must write exactly the bits of the CPU op (same hash of
// (seed, index)); seed 0 is round-to-nearest.
TEST_CASE("cuda adamw stochastic rounding matches the CPU bits") {
  if (!gpu_or_skip()) return;
  const int64_t n = 100003;
  const Tensor p = randn({n}, 131, 3.0f);
  // Segments: the hash index is the element's index in the whole call.
  Tensor seg = Tensor::empty({3, 3}, DType::I64);
  const int64_t rows[3][3] = {{0, 777, 1}, {777, 50001, 0}, {50003, n, 1}};
  std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
  for (bool with_segments : {false, true})
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b9ull}}) {
    AdamWArgs h;
    if (with_segments) h.segments = seg;
    h.param = p.clone();
    h.grad = Tensor::zeros({n}, DType::F32);
    h.m = Tensor::zeros({n}, DType::F32);
    h.v = Tensor::zeros({n}, DType::F32);
    h.param_lowp = Tensor::zeros({n}, DType::BF16);
    h.lr = 0.0f;
    h.sr_seed = seed;
    cpu::adamw_step(h, Stream{});
    AdamWArgs d = h;
    d.param = upload(p, DType::F32);
    d.grad = Tensor::zeros({n}, DType::BF16, Device::cuda(0));  // bf16 grads accepted
    d.m = Tensor::zeros({n}, DType::F32, Device::cuda(0));
    d.v = Tensor::zeros({n}, DType::F32, Device::cuda(0));
    d.param_lowp = Tensor::zeros({n}, DType::BF16, Device::cuda(0));
    if (with_segments) d.segments = seg.to(Device::cuda(0));
    ops::adamw_step(d);
    Tensor got = d.param_lowp.to(Device::cpu());
    INFO("sr_seed " << seed << (with_segments ? " with segments" : ""));
    CHECK(std::memcmp(got.raw(), h.param_lowp.raw(), got.nbytes()) == 0);
  }
}

// The update gated on the device (--cuda-graph, and every one-process GPU
// step): AdamW reading its per-step values from a step-scalars block gives
// the bits of the by-value launch (same kernel arithmetic), writes nothing
// when the block says skip, and step_gate writes the CPU op's bits (the one
// gate_step, in double, on both).
TEST_CASE("cuda adamw from a step-scalars block and step_gate match the by-value and CPU bits") {
  if (!gpu_or_skip()) return;
  const int64_t n = 5003;
  Tensor seg = Tensor::empty({3, 3}, DType::I64);
  const int64_t rows[3][3] = {{0, 3, 1}, {3, 2000, 0}, {2002, n, 1}};
  std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
  const Device gpu = Device::cuda(0);
  for (DType gdt : {DType::F32, DType::BF16}) {
    INFO("grad " << dtype_name(gdt));
    AdamWArgs a;
    a.param = randn({n}, 171).to(gpu);
    a.grad = upload(randn({n}, 172, 0.01f), gdt);
    a.m = randn({n}, 173, 1e-3f).to(gpu);
    a.v = Tensor::zeros({n}, DType::F32, gpu);
    a.param_lowp = Tensor::zeros({n}, DType::BF16, gpu);
    a.segments = seg.to(gpu);
    a.lr = 2e-3f, a.weight_decay = 0.1f, a.grad_scale = 0.61f, a.step = 9;
    AdamWArgs b = a;
    b.param = a.param.clone(), b.m = a.m.clone(), b.v = a.v.clone(), b.param_lowp = a.param_lowp.clone();
    Tensor block = Tensor::empty({AdamWSlot::Count}, DType::F32);
    float* s = block.data<float>();
    step_host_slots(adamw_terms(a.lr, a.weight_decay, a.beta1, a.beta2, a.step), 1.f, s);
    s[AdamWSlot::GradScale] = a.grad_scale;
    s[AdamWSlot::Skip] = 1.f;
    b.lr = b.weight_decay = b.grad_scale = 0.f;  // read from the block instead
    b.scalars = block.to(gpu);
    ops::adamw_step(b);
    auto same = [](const Tensor& x, const Tensor& y) {
      const Tensor hx = x.to(Device::cpu()), hy = y.to(Device::cpu());
      return std::memcmp(hx.raw(), hy.raw(), hx.nbytes()) == 0;
    };
    CHECK(same(b.param, a.param));  // skipped: nothing written
    CHECK(same(b.m, a.m));
    CHECK(same(b.param_lowp, a.param_lowp));
    s[AdamWSlot::Skip] = 0.f;
    b.scalars = block.to(gpu);
    ops::adamw_step(a);
    ops::adamw_step(b);
    CHECK(same(b.param, a.param));
    CHECK(same(b.m, a.m));
    CHECK(same(b.v, a.v));
    CHECK(same(b.param_lowp, a.param_lowp));
  }
  const float inf = INFINITY, nan = NAN;
  const float cases[][3] = {{0.25f, 0, 3.f}, {4.f, 0, 3.f}, {7.3e9f, 0, 2.f}, {inf, 0, 3.f},
                            {nan, 0, 3.f},   {4.f, 0, nan}, {4.f, 1.f, 3.f}, {inf, 0, inf}};
  for (const auto& c : cases)
    for (SkipRule rule : {SkipRule::NonFinite, SkipRule::Overflow})
      for (double scale : {1.0, 65536.0, 3.0}) {
        INFO("stats " << c[0] << " " << c[1] << " " << c[2] << ", loss scale " << scale << ", rule "
                      << (rule == SkipRule::Overflow ? "overflow" : "non-finite"));
        Tensor stats = Tensor::empty({3}, DType::F32);
        std::memcpy(stats.data<float>(), c, sizeof c);
        Tensor host = Tensor::zeros({AdamWSlot::Count}, DType::F32), dev = host.to(gpu);
        const StepGateArgs g{.scalars = host, .stats = stats, .loss_scale = scale, .max_norm = 1.f, .rule = rule};
        ops::step_gate(g);
        ops::step_gate({.scalars = dev, .stats = stats.to(gpu), .loss_scale = scale, .max_norm = 1.f, .rule = rule});
        const Tensor got = dev.to(Device::cpu());
        CHECK(std::memcmp(got.raw(), host.raw(), host.nbytes()) == 0);
        // The loss scale from the block's slot (a captured fp16 step): the
        // same bits as by value (every scale here is an f32 value).
        Tensor in_block = Tensor::zeros({AdamWSlot::Count}, DType::F32);
        in_block.data<float>()[AdamWSlot::LossScale] = static_cast<float>(scale);
        Tensor dev_block = in_block.to(gpu);
        ops::step_gate({.scalars = dev_block, .stats = stats.to(gpu), .loss_scale = 5.0, .scale_in_block = true,
                        .max_norm = 1.f, .rule = rule});
        host.data<float>()[AdamWSlot::LossScale] = static_cast<float>(scale);
        CHECK(std::memcmp(dev_block.to(Device::cpu()).raw(), host.raw(), host.nbytes()) == 0);
      }
}

// An event query while the device is busy answers "not ready"; the runtime
// may leave that answer in the thread's last-error slot, where the next
// launch check (cudaGetLastError) would report it as the launch's failure.
// cuda::query_status takes it out; every query in the project goes through it.
TEST_CASE("cuda: a 'not ready' event query does not fail the next kernel launch") {
  if (!gpu_or_skip()) return;
  const int64_t n = 4096;
  const Tensor a = upload(randn({n, n}, 95, 0.01f), DType::BF16);
  Tensor out = upload(zeros_f32({n, n}), DType::BF16);
  cudaEvent_t ev = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
  for (int i = 0; i < 50; ++i) ops::matmul_forward({.out = out, .inp = a, .weight = a});  // ~10 ms of work
  REQUIRE(cudaEventRecord(ev, nullptr) == cudaSuccess);
  const cudaError_t raw = cudaEventQuery(ev);
  std::printf("event query while busy: %s; last error after it: %s\n", cudaGetErrorName(raw),
              cudaGetErrorName(cudaPeekAtLastError()));
  REQUIRE(raw == cudaErrorNotReady);
  CHECK(cuda::query_status(raw) == cudaErrorNotReady);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK_NOTHROW(ops::scale({.x = out, .s = 0.5f}));  // a launch and its check
  REQUIRE(cudaEventSynchronize(ev) == cudaSuccess);
  CHECK(cuda::query_status(cudaEventQuery(ev)) == cudaSuccess);
  cudaEventDestroy(ev);
}

TEST_CASE("cuda 1-bit pack, server sum and unpack match the CPU's bit for bit") {
  if (!gpu_or_skip()) return;
  const Device g = Device::cuda(0);
  auto same = [](const Tensor& a, const Tensor& b) {
    const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
    return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
  };
  for (int64_t n : {int64_t{8}, int64_t{8 * 1001}, int64_t{8 * 70001}}) {
    INFO("n " << n);
    Tensor x = randn({n}, 95, 2.0);
    x.data<float>()[n / 2] = 0.f;  // sign(0) = +1
    Tensor sumsq = Tensor::empty({1}, DType::F32);
    sumsq.data<float>()[0] = 3.25f * static_cast<float>(n);
    Tensor bits = Tensor::empty({n / 8}, DType::U8), scale = Tensor::empty({1}, DType::F32);
    Tensor gx = x.to(g), gbits = Tensor::empty({n / 8}, DType::U8, g), gscale = Tensor::empty({1}, DType::F32, g);
    ops::onebit_pack({.bits = bits, .scale = scale, .x = x, .sumsq = sumsq});
    ops::onebit_pack({.bits = gbits, .scale = gscale, .x = gx, .sumsq = sumsq.to(g)});
    CHECK(same(bits, gbits));
    CHECK(same(scale, gscale));
    CHECK(same(x, gx));
    for (int W : {1, 3, 8}) {
      Tensor rows = Tensor::empty({W, n / 8}, DType::U8);
      for (int64_t i = 0; i < rows.numel(); ++i) rows.data<uint8_t>()[i] = static_cast<uint8_t>((i * 2654435761u) >> 7);
      Tensor scales = randn({W}, 96 + W, 1.0), acc = randn({n}, 97);
      Tensor gacc = acc.to(g);
      ops::onebit_server({.x = acc, .bits = rows, .scales = scales});
      ops::onebit_server({.x = gacc, .bits = rows.to(g), .scales = scales.to(g)});
      CHECK(same(acc, gacc));
      const int64_t m = n - 3, chunk = (n + W - 1) / W;  // a tail shorter than the signs
      Tensor out = Tensor::empty({m}, DType::F32), gout = Tensor::empty({m}, DType::F32, g);
      ops::onebit_unpack({.out = out, .bits = rows.view(0, {n / 8}), .scales = scales, .chunk = chunk});
      ops::onebit_unpack({.out = gout, .bits = rows.to(g).view(0, {n / 8}), .scales = scales.to(g), .chunk = chunk});
      CHECK(same(out, gout));
    }
  }
}
