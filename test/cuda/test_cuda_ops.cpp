// GPU tests of the CUDA ops (all but attention) against the CPU reference ops
// on seeded random inputs with odd shapes, in f32, bf16 and f16. Prints
// is skipped (exit 77) when no device is present.
#include <cmath>
#include <cstring>

#include "cuda/cuda_api.h"
#include "lib/ops/ops.h"
#include "op_harness.h"

using namespace ds;
using namespace ds::test;

namespace {

const DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

Field act(Tensor t, bool out = false) { return Field{std::move(t), Kind::Act, out}; }
Field f32(Tensor t, bool out = false) { return Field{std::move(t), Kind::F32, out}; }
Field ints(Tensor t) { return Field{std::move(t), Kind::Int, false}; }

template <class Args>
void call(void (*cpu_fn)(const Args&, const Stream&), void (*gpu_fn)(const Args&, const Stream&),
          const Args& a, bool on_gpu) {
  if (on_gpu)
    gpu_fn(a, Stream{});
  else
    cpu_fn(a, Stream{});
}

}  // namespace

TEST_CASE("cuda layernorm forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 37, C = 203;
    Fields fw{{"out", act(Tensor::zeros({N, C}, DType::F32), true)},
              {"mean", f32(Tensor::zeros({N}, DType::F32), true)},
              {"rstd", f32(Tensor::zeros({N}, DType::F32), true)},
              {"inp", act(randn({N, C}, 1, 2.0f))},
              {"weight", act(randn({C}, 2))},
              {"bias", act(randn({C}, 3))}};
    check_op("layernorm_forward", fw, dt, [](const TensorMap& m, bool gpu) {
      LayerNormArgs a{get(m, "out"), get(m, "mean"), get(m, "rstd"), get(m, "inp"),
                      get(m, "weight"), get(m, "bias")};
      call(&cpu::layernorm_forward, &ops::layernorm_forward, a, gpu);
    });
    // Backward: mean/rstd from the f32 inputs (exact statistics), grads accumulate.
    Tensor inp = randn({N, C}, 4, 1.5f), mean = Tensor::empty({N}, DType::F32),
           rstd = Tensor::empty({N}, DType::F32);
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) s += inp.data<float>()[n * C + c];
      double m = s / C;
      for (int64_t c = 0; c < C; ++c) v += std::pow(inp.data<float>()[n * C + c] - m, 2);
      mean.data<float>()[n] = float(m);
      rstd.data<float>()[n] = float(1.0 / std::sqrt(v / C + 1e-5));
    }
    for (Accum acc : {Accum::Overwrite, Accum::Add}) {
      Fields bw{{"dinp", act(randn({N, C}, 5), true)},
                {"dweight", act(randn({C}, 6), true)},
                {"dbias", act(randn({C}, 7), true)},
                {"dout", act(randn({N, C}, 8))},
                {"inp", act(inp)},
                {"weight", act(randn({C}, 9))},
                {"mean", f32(mean)},
                {"rstd", f32(rstd)}};
      check_op("layernorm_backward", bw, dt, [acc](const TensorMap& m, bool gpu) {
        LayerNormBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dbias"), get(m, "dout"),
                           get(m, "inp"),  get(m, "weight"),  get(m, "mean"),  get(m, "rstd"),
                           acc};
        call(&cpu::layernorm_backward, &ops::layernorm_backward, a, gpu);
      });
    }
  }
}

TEST_CASE("cuda rmsnorm forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 29, C = 301;
    Fields fw{{"out", act(Tensor::zeros({N, C}, DType::F32), true)},
              {"rstd", f32(Tensor::zeros({N}, DType::F32), true)},
              {"inp", act(randn({N, C}, 11, 3.0f))},
              {"weight", act(randn({C}, 12))}};
    check_op("rmsnorm_forward", fw, dt, [](const TensorMap& m, bool gpu) {
      RMSNormArgs a{get(m, "out"), get(m, "rstd"), get(m, "inp"), get(m, "weight")};
      call(&cpu::rmsnorm_forward, &ops::rmsnorm_forward, a, gpu);
    });
    Tensor inp = randn({N, C}, 13), rstd = Tensor::empty({N}, DType::F32);
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += std::pow(inp.data<float>()[n * C + c], 2);
      rstd.data<float>()[n] = float(1.0 / std::sqrt(ss / C + 1e-5));
    }
    Fields bw{{"dinp", act(randn({N, C}, 14), true)},
              {"dweight", act(randn({C}, 15), true)},
              {"dout", act(randn({N, C}, 16))},
              {"inp", act(inp)},
              {"weight", act(randn({C}, 17))},
              {"rstd", f32(rstd)}};
    check_op("rmsnorm_backward", bw, dt, [](const TensorMap& m, bool gpu) {
      RMSNormBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dout"), get(m, "inp"),
                       get(m, "weight"), get(m, "rstd"), Accum::Add};
      call(&cpu::rmsnorm_backward, &ops::rmsnorm_backward, a, gpu);
    });
  }
}

TEST_CASE("cuda embedding forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t B = 3, T = 45, C = 291, V = 70, maxT = 64, vs = 10, off = 5;
    // Tokens in [0, 90): some fall outside this rank's rows [10, 80).
    Tensor tokens = randint({B, T}, 21, 0, 90);
    for (bool with_wpe : {true, false}) {
      Fields fw{{"out", act(Tensor::zeros({B, T, C}, DType::F32), true)},
                {"tokens", ints(tokens)},
                {"wte", act(randn({V, C}, 22))}};
      if (with_wpe) fw["wpe"] = act(randn({maxT, C}, 23));
      check_op("embedding_forward", fw, dt, [&](const TensorMap& m, bool gpu) {
        EmbeddingArgs a{get(m, "out"), get(m, "tokens"), get(m, "wte"), get(m, "wpe"), vs, off};
        call(&cpu::embedding_forward, &ops::embedding_forward, a, gpu);
      });
      Fields bw{{"dwte", act(randn({V, C}, 24), true)},
                {"dout", act(randn({B, T, C}, 25))},
                {"tokens", ints(tokens)}};
      if (with_wpe) bw["dwpe"] = act(randn({maxT, C}, 26), true);
      check_op("embedding_backward", bw, dt, [&](const TensorMap& m, bool gpu) {
        EmbeddingBwdArgs a{get(m, "dwte"), get(m, "dwpe"), get(m, "dout"), get(m, "tokens"), vs,
                           off};
        call(&cpu::embedding_backward, &ops::embedding_backward, a, gpu);
      });
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

TEST_CASE("cuda matmul forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 67, C = 129, OC = 45;
    for (bool bias : {true, false}) {
      Fields fw{{"out", act(Tensor::zeros({N, OC}, DType::F32), true)},
                {"inp", act(randn({N, C}, 41))},
                {"weight", act(randn({OC, C}, 42, 0.1f))}};
      if (bias) fw["bias"] = act(randn({OC}, 43));
      check_op("matmul_forward", fw, dt, [](const TensorMap& m, bool gpu) {
        MatmulArgs a{get(m, "out"), get(m, "inp"), get(m, "weight"), get(m, "bias")};
        call(&cpu::matmul_forward, &ops::matmul_forward, a, gpu);
      });
    }
    for (Accum acc : {Accum::Overwrite, Accum::Add}) {
      Fields bw{{"dinp", act(randn({N, C}, 44), true)},
                {"dweight", act(randn({OC, C}, 45), true)},
                {"dbias", act(randn({OC}, 46), true)},
                {"dout", act(randn({N, OC}, 47))},
                {"inp", act(randn({N, C}, 48))},
                {"weight", act(randn({OC, C}, 49, 0.1f))}};
      check_op("matmul_backward", bw, dt, [acc](const TensorMap& m, bool gpu) {
        MatmulBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dbias"), get(m, "dout"),
                        get(m, "inp"), get(m, "weight"), acc};
        call(&cpu::matmul_backward, &ops::matmul_backward, a, gpu);
      });
    }
  }
}

TEST_CASE("cuda rope forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t B = 2, T = 37;
    const int NH = 3, HS = 18;
    for (bool fwd : {true, false}) {
      Fields f{{"out", act(Tensor::zeros({B, T, 3 * NH * HS}, DType::F32), true)},
               {"inp", act(randn({B, T, 3 * NH * HS}, 51))}};
      check_op(fwd ? "rope_forward" : "rope_backward", f, dt, [fwd](const TensorMap& m, bool gpu) {
        RopeArgs a{get(m, "out"), get(m, "inp"), NH, 1000, 10000.0f};
        if (fwd) call(&cpu::rope_forward, &ops::rope_forward, a, gpu);
        else call(&cpu::rope_backward, &ops::rope_backward, a, gpu);
      });
    }
  }
}

TEST_CASE("cuda gelu and swiglu forward and backward") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 13, F = 157;
    Fields g{{"out", act(Tensor::zeros({N, F}, DType::F32), true)},
             {"inp", act(randn({N, F}, 61, 2.0f))}};
    check_op("gelu_forward", g, dt, [](const TensorMap& m, bool gpu) {
      GeluArgs a{get(m, "out"), get(m, "inp"), Tensor{}};
      call(&cpu::gelu_forward, &ops::gelu_forward, a, gpu);
    });
    g["dout"] = act(randn({N, F}, 62));
    check_op("gelu_backward", g, dt, [](const TensorMap& m, bool gpu) {
      GeluArgs a{get(m, "out"), get(m, "inp"), get(m, "dout")};
      call(&cpu::gelu_backward, &ops::gelu_backward, a, gpu);
    });
    Fields s{{"out", act(Tensor::zeros({N, F}, DType::F32), true)},
             {"inp", act(randn({N, 2 * F}, 63, 2.0f))}};
    check_op("swiglu_forward", s, dt, [](const TensorMap& m, bool gpu) {
      SwigluArgs a{get(m, "out"), get(m, "inp")};
      call(&cpu::swiglu_forward, &ops::swiglu_forward, a, gpu);
    });
    Fields sb{{"dinp", act(Tensor::zeros({N, 2 * F}, DType::F32), true)},
              {"dout", act(randn({N, F}, 64))},
              {"inp", act(randn({N, 2 * F}, 65, 2.0f))}};
    check_op("swiglu_backward", sb, dt, [](const TensorMap& m, bool gpu) {
      SwigluBwdArgs a{get(m, "dinp"), get(m, "dout"), get(m, "inp")};
      call(&cpu::swiglu_backward, &ops::swiglu_backward, a, gpu);
    });
  }
}

TEST_CASE("cuda add, scale, sum_squares, nonfinite_check") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t n = 10007;
    Fields ad{{"out", act(Tensor::zeros({n}, DType::F32), true)},
              {"a", act(randn({n}, 71))},
              {"b", act(randn({n}, 72))}};
    check_op("add", ad, dt, [](const TensorMap& m, bool gpu) {
      AddArgs a{get(m, "out"), get(m, "a"), get(m, "b")};
      call(&cpu::add, &ops::add, a, gpu);
    });
    Fields sc{{"x", act(randn({n}, 73), true)}};
    check_op("scale", sc, dt, [](const TensorMap& m, bool gpu) {
      call(&cpu::scale, &ops::scale, ScaleArgs{get(m, "x"), 0.37f}, gpu);
    });
    Tensor init = Tensor::empty({1}, DType::F32);
    init.data<float>()[0] = 3.5f;
    Fields ss{{"out", f32(init, true)}, {"x", act(randn({3 * n + 1}, 74))}};
    check_op("sum_squares", ss, dt, [](const TensorMap& m, bool gpu) {
      call(&cpu::sum_squares, &ops::sum_squares, SumSquaresArgs{get(m, "out"), get(m, "x")}, gpu);
    });
    for (float bad : {0.0f, INFINITY, NAN}) {
      Tensor x = randn({n}, 75);
      x.data<float>()[n - 3] = bad == 0.0f ? 1.0f : bad;
      Tensor flag = Tensor::zeros({1}, DType::F32, Device::cuda(0));
      ops::nonfinite_check(NonFiniteArgs{flag, upload(x, dt)});
      float got = flag.to(Device::cpu()).data<float>()[0];
      CHECK(got == (bad == 0.0f ? 0.0f : 1.0f));
    }
  }
}

TEST_CASE("cuda cross entropy") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t N = 19, V = 1001, Vp = 1024;
    Tensor targets = randint({N}, 81, 0, int(V));
    targets.data<int32_t>()[3] = -1;  // ignored row
    targets.data<int32_t>()[7] = -100;
    for (bool grad : {false, true}) {
      Fields f{{"losses", f32(Tensor::zeros({N}, DType::F32), true)},
               {"logits", act(randn({N, Vp}, 82, 3.0f))},
               {"targets", ints(targets)}};
      if (grad) f["dlogits"] = act(Tensor::zeros({N, Vp}, DType::F32), true);
      check_op("cross_entropy", f, dt, [](const TensorMap& m, bool gpu) {
        CrossEntropyArgs a{get(m, "losses"), get(m, "dlogits"), get(m, "logits"),
                           get(m, "targets"), V, 1.0f / 17};
        call(&cpu::cross_entropy, &ops::cross_entropy, a, gpu);
      });
    }
  }
}

TEST_CASE("cuda adamw step") {
  if (!gpu_or_skip()) return;
  for (DType dt : kAllTypes) {
    const int64_t n = 5003;
    Tensor v = randn({n}, 94);
    for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::fabs(v.data<float>()[i]) * 1e-3f;
    Fields f{{"param", f32(randn({n}, 91), true)},
             {"grad", act(randn({n}, 92, 0.01f))},
             {"m", f32(randn({n}, 93, 1e-3f), true)},
             {"v", f32(v, true)}};
    if (dt != DType::F32) f["param_lowp"] = act(Tensor::zeros({n}, DType::F32), true);
    check_op("adamw_step", f, dt, [](const TensorMap& m, bool gpu) {
      AdamWArgs a;
      a.param = get(m, "param");
      a.grad = get(m, "grad");
      a.m = get(m, "m");
      a.v = get(m, "v");
      a.param_lowp = get(m, "param_lowp");
      a.lr = 1e-3f;
      a.weight_decay = 0.1f;
      a.grad_scale = 0.5f;
      a.step = 7;
      call(&cpu::adamw_step, &ops::adamw_step, a, gpu);
    });
  }
}

TEST_CASE("cuda cast between float dtypes") {
  if (!gpu_or_skip()) return;
  Tensor x = randn({1031}, 101, 5.0f);
  for (DType from : kAllTypes) {
    for (DType to : kAllTypes) {
      Tensor src = upload(x, from);
      Tensor dst = Tensor::empty({1031}, to, Device::cuda(0));
      ops::cast(CastArgs{dst, src});
      Tensor got = download_f32(dst);
      Tensor want = round_to(round_to(x, from), to);
      INFO("cast " << dtype_name(from) << " -> " << dtype_name(to));
      CHECK(rel_err(got, want) == 0.0);
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
        Fields bw{{"dinp", act(randn({N, C}, 144), true)},
                  {"dweight", f32(randn({OC, C}, 145), true)},
                  {"dbias", f32(randn({OC}, 146), true)},
                  {"dout", act(randn({N, OC}, 147))},
                  {"inp", act(randn({N, C}, 148))},
                  {"weight", act(randn({OC, C}, 149, 0.1f))}};
        check_op("matmul_backward (f32 dweight/dbias)", bw, dt,
                 [acc](const TensorMap& m, bool gpu) {
                   MatmulBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dbias"),
                                   get(m, "dout"), get(m, "inp"),     get(m, "weight"), acc};
                   call(&cpu::matmul_backward, &ops::matmul_backward, a, gpu);
                 });
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
      Fields ln{{"dinp", act(randn({N, C}, 105), true)},
                {"dweight", f32(randn({C}, 106), true)},
                {"dbias", f32(randn({C}, 107), true)},
                {"dout", act(randn({N, C}, 108))},
                {"inp", act(inp)},
                {"weight", act(randn({C}, 109))},
                {"mean", f32(mean)},
                {"rstd", f32(rstd)}};
      check_op("layernorm_backward (f32 dweight/dbias)", ln, dt, [](const TensorMap& m, bool gpu) {
        LayerNormBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dbias"), get(m, "dout"),
                           get(m, "inp"),  get(m, "weight"),  get(m, "mean"),  get(m, "rstd"),
                           Accum::Add};
        call(&cpu::layernorm_backward, &ops::layernorm_backward, a, gpu);
      });
      Fields rms{{"dinp", act(randn({N, C}, 114), true)},
                 {"dweight", f32(randn({C}, 115), true)},
                 {"dout", act(randn({N, C}, 116))},
                 {"inp", act(inp)},
                 {"weight", act(randn({C}, 117))},
                 {"rstd", f32(rrstd)}};
      check_op("rmsnorm_backward (f32 dweight)", rms, dt, [](const TensorMap& m, bool gpu) {
        RMSNormBwdArgs a{get(m, "dinp"), get(m, "dweight"), get(m, "dout"), get(m, "inp"),
                         get(m, "weight"), get(m, "rstd"), Accum::Overwrite};
        call(&cpu::rmsnorm_backward, &ops::rmsnorm_backward, a, gpu);
      });
    }
    {
      const int64_t B = 3, T = 45, C = 291, V = 70, maxT = 64, vs = 10, off = 5;
      Tensor tokens = randint({B, T}, 121, 0, 90);
      for (bool with_wpe : {true, false}) {
        Fields bw{{"dwte", f32(randn({V, C}, 124), true)},
                  {"dout", act(randn({B, T, C}, 125))},
                  {"tokens", ints(tokens)}};
        if (with_wpe) bw["dwpe"] = f32(randn({maxT, C}, 126), true);
        check_op("embedding_backward (f32 dwte/dwpe)", bw, dt, [&](const TensorMap& m, bool gpu) {
          EmbeddingBwdArgs a{get(m, "dwte"), get(m, "dwpe"), get(m, "dout"), get(m, "tokens"),
                             vs, off};
          call(&cpu::embedding_backward, &ops::embedding_backward, a, gpu);
        });
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
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b9ull}}) {
    AdamWArgs h;
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
    ops::adamw_step(d);
    Tensor got = d.param_lowp.to(Device::cpu());
    INFO("sr_seed " << seed);
    CHECK(std::memcmp(got.raw(), h.param_lowp.raw(), got.nbytes()) == 0);
  }
}
