// CPU op tests: matmul (linear layer), causal attention on packed qkv
// (multi-head and grouped-query), RoPE (full and partial rotation).
// Forward against double references, backward against finite differences on
// small shapes and against a naive double backward on shapes spanning several
// query blocks, accumulation semantics and thread-count determinism.
#include <cstring>

#include "test/ops_harness/attn_ref.h"
#include "test/ops_harness/op_cases.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

TEST_CASE("matmul forward on odd and larger shapes") {
  for (auto [N, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{14, 12, 10}, {67, 45, 133}}) {
    MatmulArgs f;
    f.inp = randn({N, C}, 40);
    f.weight = randn({OC, C}, 41);
    f.bias = randn({OC}, 42);
    f.out = Tensor::empty({N, OC}, DType::F32);
    check_reference(matmul_forward_case(f));  // out + bias
    f.bias = Tensor();
    check_reference(matmul_forward_case(f));
  }
}

TEST_CASE("matmul forward with up to 16 rows gives each row the same bits at any row count") {
  // Generation's decode steps: a sample's logits must not depend on the
  // micro-batch it shares (dsgen's samples are the same at any micro-batch).
  const int64_t C = 70, OC = 96;  // C: four 16-wide slices and a remainder
  const Tensor x = randn({16, C}, 60), w = randn({OC, C}, 61), b = randn({OC}, 62);
  auto forward = [&](int64_t n) {
    MatmulArgs f{.out = Tensor::empty({n, OC}, DType::F32), .inp = x.view(0, {n, C}), .weight = w, .bias = b};
    ops::matmul_forward(f, Stream{});
    return f.out;
  };
  const Tensor all = forward(16);
  for (int64_t n = 1; n < 16; ++n) {
    INFO(n << " rows");
    CHECK(std::memcmp(forward(n).data<float>(), all.data<float>(), static_cast<size_t>(n * OC) * 4) == 0);
  }
}

TEST_CASE("matmul backward: finite differences, accumulation, skipped dinp") {
  const int64_t C = 12, OC = 10;
  const Tensor x = randn({2, 7, C}, 50), w = randn({OC, C}, 51), b = randn({OC}, 52);
  const Tensor dout = randn({2, 7, OC}, 53);
  for (Accum acc : {Accum::Overwrite, Accum::Add}) {
    MatmulBwdArgs g{.dinp = randn({2, 7, C}, 54), .dweight = randn({OC, C}, 55),
                    .dbias = randn({OC}, 56), .dout = dout, .inp = x, .weight = w, .accum = acc};
    check_finite_diff(matmul_backward_case(g, b, 1));
    g.dinp = Tensor();  // skip dinp; weight grads accumulate on every call
    check_finite_diff(matmul_backward_case(g, b, 2));
  }
}

TEST_CASE("matmul rejects mismatched shapes and dtypes") {
  MatmulArgs f;
  f.inp = randn({4, 5}, 1);
  f.weight = randn({3, 6}, 2);
  f.out = Tensor::empty({4, 3}, DType::F32);
  REQUIRE_THROWS(ops::matmul_forward(f));
  f.weight = Tensor::zeros({3, 5}, DType::I32);
  REQUIRE_THROWS(ops::matmul_forward(f));
}

// ---- attention --------------------------------------------------------------------

namespace {

struct AttnRun {
  Tensor out, lse, dqkv;
};

AttnRun run_attention(const Tensor& qkv, const Tensor& dout, const AttnShape& s) {
  AttentionArgs f;
  f.qkv = qkv;
  f.out = Tensor::empty({s.B, s.T, s.NH * s.HS}, DType::F32);
  f.lse = Tensor::empty({s.B, s.NH, s.T}, DType::F32);
  f.NH = static_cast<int>(s.NH);
  f.NKV = static_cast<int>(s.NKV);
  if (!s.len.empty()) {
    f.lengths = Tensor::empty({s.B}, DType::I32);
    std::memcpy(f.lengths.data<int32_t>(), s.len.data(), s.len.size() * sizeof(int32_t));
  }
  ops::attention_forward(f);
  AttentionBwdArgs g;
  g.dqkv = randn(qkv.shape(), 99);  // garbage: must be overwritten
  g.dout = dout, g.out = f.out, g.lse = f.lse, g.qkv = qkv, g.NH = f.NH, g.NKV = f.NKV, g.lengths = f.lengths;
  ops::attention_backward(g);
  return {f.out, f.lse, g.dqkv};
}

}  // namespace

TEST_CASE("attention forward and backward match double references") {
  for (AttnShape s : {AttnShape{2, 7, 3, 4}, AttnShape{1, 133, 2, 20}, AttnShape{2, 65, 1, 64},
                      AttnShape{2, 7, 4, 4, 2}, AttnShape{1, 133, 6, 20, 2}, AttnShape{2, 65, 4, 64, 1}}) {
    DYNAMIC_SECTION("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.kv() << " HS=" << s.HS) {
      const Tensor qkv = randn({s.B, s.T, s.width()}, 60);
      const Tensor dout = randn({s.B, s.T, s.NH * s.HS}, 61);
      const AttnRun r = run_attention(qkv, dout, s);
      Vec lse;
      check_close(r.out, ref_attention(to_f64(qkv), s, &lse), kFwdTol, "out");
      check_close(r.lse, lse, kFwdTol, "lse");
      check_close(r.dqkv, ref_attention_backward(to_f64(qkv), to_f64(dout), s), kBwdTol, "dqkv");
    }
  }
}

// Right padding: the queries of sample b see no key at or beyond len[b]
// (padding queries attend to the whole real sequence), forward and backward,
// with blocks of 64 queries cut by the lengths; then the lengths checked.
TEST_CASE("attention with per-sample lengths (right padding) matches the references") {
  for (AttnShape s : {AttnShape{3, 7, 3, 4, 0, {7, 1, 4}}, AttnShape{2, 133, 4, 20, 2, {70, 129}},
                      AttnShape{2, 65, 2, 8, 1, {64, 65}}}) {
    DYNAMIC_SECTION("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.kv()) {
      const Tensor qkv = randn({s.B, s.T, s.width()}, 64);
      const Tensor dout = randn({s.B, s.T, s.NH * s.HS}, 65);
      const AttnRun r = run_attention(qkv, dout, s);
      Vec lse;
      check_close(r.out, ref_attention(to_f64(qkv), s, &lse), kFwdTol, "out");
      check_close(r.lse, lse, kFwdTol, "lse");
      check_close(r.dqkv, ref_attention_backward(to_f64(qkv), to_f64(dout), s), kBwdTol, "dqkv");
      if (s.T == 7) {  // and against finite differences
        const Vec dv = to_f64(dout);
        const Vec fd = fd_grad(to_f64(qkv), [&](const Vec& x) { return dot(ref_attention(x, s, nullptr), dv); });
        check_close(r.dqkv, fd, kBwdTol, "dqkv vs finite differences");
      }
    }
  }
  // A length of T is plain causal attention, bit for bit.
  AttnShape full{2, 9, 2, 4, 0, {9, 9}}, plain{2, 9, 2, 4};
  const Tensor qkv = randn({2, 9, full.width()}, 66), dout = randn({2, 9, 8}, 67);
  const AttnRun a = run_attention(qkv, dout, full), b = run_attention(qkv, dout, plain);
  REQUIRE(std::memcmp(a.out.data<float>(), b.out.data<float>(), a.out.nbytes()) == 0);
  REQUIRE(std::memcmp(a.dqkv.data<float>(), b.dqkv.data<float>(), a.dqkv.nbytes()) == 0);
  for (int32_t bad : {0, 10}) {
    AttnShape s{2, 9, 2, 4, 0, {9, bad}};
    REQUIRE_THROWS_WITH(run_attention(qkv, dout, s), Catch::Contains("lengths[1] = " + std::to_string(bad) +
                                                                     " is outside [1, T = 9]"));
  }
}

TEST_CASE("attention backward matches finite differences") {
  for (AttnShape s : {AttnShape{2, 5, 2, 4}, AttnShape{2, 5, 6, 4, 2}, AttnShape{1, 6, 3, 4, 1}}) {
    DYNAMIC_SECTION("NH=" << s.NH << " NKV=" << s.kv()) {
      const Tensor qkv = randn({s.B, s.T, s.width()}, 62);
      const Tensor dout = randn({s.B, s.T, s.NH * s.HS}, 63);
      const AttnRun r = run_attention(qkv, dout, s);
      const Vec dv = to_f64(dout);
      const Vec fd = fd_grad(to_f64(qkv), [&](const Vec& x) { return dot(ref_attention(x, s, nullptr), dv); });
      check_close(r.dqkv, fd, kBwdTol, "dqkv vs finite differences");
    }
  }
}

TEST_CASE("grouped-query attention equals multi-head attention with repeated kv heads") {
  // NKV = 2 kv heads for NH = 6: the same as MHA whose kv head h is kv head h / 3.
  const AttnShape g{2, 70, 6, 8, 2}, m{2, 70, 6, 8};
  const Tensor qkv = randn({g.B, g.T, g.width()}, 90);
  const Tensor dout = randn({g.B, g.T, g.NH * g.HS}, 91);
  Tensor rep = Tensor::empty({m.B, m.T, m.width()}, DType::F32);
  for (int64_t n = 0; n < g.B * g.T; ++n) {
    const float* src = qkv.data<float>() + n * g.width();
    float* dst = rep.data<float>() + n * m.width();
    std::memcpy(dst, src, g.NH * g.HS * sizeof(float));
    for (int64_t part = 1; part < 3; ++part)
      for (int64_t h = 0; h < m.NH; ++h)
        std::memcpy(dst + m.col(part, h), src + g.col(part, h / 3), g.HS * sizeof(float));
  }
  const AttnRun rg = run_attention(qkv, dout, g), rm = run_attention(rep, dout, m);
  check_close(rg.out, to_f64(rm.out), kFwdTol, "out");
  check_close(rg.lse, to_f64(rm.lse), kFwdTol, "lse");
  // dK, dV of a kv head: the sum over the query heads that share it.
  Vec want = to_f64(rg.dqkv);
  const Vec dm = to_f64(rm.dqkv);
  for (int64_t n = 0; n < g.B * g.T; ++n) {
    for (int64_t e = 0; e < g.NH * g.HS; ++e) want[n * g.width() + e] = dm[n * m.width() + e];
    for (int64_t part = 1; part < 3; ++part)
      for (int64_t kh = 0; kh < g.kv(); ++kh)
        for (int64_t e = 0; e < g.HS; ++e) {
          double sum = 0;
          for (int64_t h = kh * 3; h < kh * 3 + 3; ++h) sum += dm[n * m.width() + m.col(part, h) + e];
          want[n * g.width() + g.col(part, kh) + e] = sum;
        }
  }
  check_close(rg.dqkv, want, kBwdTol, "dqkv (kv grads summed over the group)");
}

TEST_CASE("attention and matmul backward are bit-identical for 1 and 3 threads") {
  for (const AttnShape s : {AttnShape{2, 133, 3, 16}, AttnShape{2, 133, 4, 16, 2}}) {
    const Tensor qkv = randn({s.B, s.T, s.width()}, 64);
    const Tensor dout = randn({s.B, s.T, s.NH * s.HS}, 65);
    AttnRun r1, r3;
    with_threads(1, [&] { r1 = run_attention(qkv, dout, s); });
    with_threads(3, [&] { r3 = run_attention(qkv, dout, s); });
    CHECK(bit_equal(r1.out, r3.out));
    CHECK(bit_equal(r1.lse, r3.lse));
    CHECK(bit_equal(r1.dqkv, r3.dqkv));
  }

  // Shapes spanning several 256 x 256 output tiles of the parallel gemm.
  const int64_t N = 600, C = 40, OC = 300;
  auto run_mm = [&](int threads) {
    MatmulArgs f;
    f.out = Tensor::empty({N, OC}, DType::F32);
    f.inp = randn({N, C}, 67), f.weight = randn({OC, C}, 68), f.bias = randn({OC}, 69);
    MatmulBwdArgs g;
    g.dinp = Tensor::empty({N, C}, DType::F32);
    g.dweight = Tensor::zeros({OC, C}, DType::F32);
    g.dbias = Tensor::zeros({OC}, DType::F32);
    g.dout = randn({N, OC}, 66), g.inp = f.inp, g.weight = f.weight;
    with_threads(threads, [&] {
      ops::matmul_forward(f);
      ops::matmul_backward(g);
    });
    return std::pair{f, g};
  };
  const auto [f1, m1] = run_mm(1);
  const auto [f3, m3] = run_mm(3);
  CHECK(bit_equal(f1.out, f3.out));
  CHECK(bit_equal(m1.dinp, m3.dinp));
  CHECK(bit_equal(m1.dweight, m3.dweight));
  CHECK(bit_equal(m1.dbias, m3.dbias));
}

TEST_CASE("matmul on large-tile shapes: references and 1 vs 3 threads bit-identical") {
  // Big enough for the large-gemm tiling (whole-side panels, even piece
  // count) in all three gemms; sides are not multiples of 16.
  const int64_t N = 530, C = 270, OC = 1250;
  const Tensor x = randn({N, C}, 80), w = randn({OC, C}, 81), b = randn({OC}, 82);
  const Tensor dout = randn({N, OC}, 83);
  auto run = [&](int threads) {
    MatmulArgs f;
    f.inp = x, f.weight = w, f.bias = b, f.out = Tensor::empty({N, OC}, DType::F32);
    MatmulBwdArgs g;
    g.dinp = Tensor::empty({N, C}, DType::F32);
    g.dweight = randn({OC, C}, 84);
    g.dbias = Tensor::zeros({OC}, DType::F32);
    g.dout = dout, g.inp = x, g.weight = w;
    with_threads(threads, [&] {
      ops::matmul_forward(f);
      ops::matmul_backward(g);
    });
    return std::pair{f, g};
  };
  const auto [f1, g1] = run(1);
  const auto [f3, g3] = run(3);
  CHECK(bit_equal(f1.out, f3.out));
  CHECK(bit_equal(g1.dinp, g3.dinp));
  CHECK(bit_equal(g1.dweight, g3.dweight));

  const Vec xv = to_f64(x), wv = to_f64(w), bv = to_f64(b), dv = to_f64(dout);
  check_close(f1.out, ref_matmul(xv, wv, &bv, N, C, OC), kFwdTol, "out");
  Vec dinp(N * C, 0.0), dw = to_f64(randn({OC, C}, 84));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      const double d = dv[n * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        dinp[n * C + c] += d * wv[o * C + c];  // dinp = dout @ w
        dw[o * C + c] += d * xv[n * C + c];    // dw += dout^T @ x
      }
    }
  check_close(g1.dinp, dinp, kBwdTol, "dinp");
  check_close(g1.dweight, dw, kBwdTol, "dweight");
}

// ---- rope -------------------------------------------------------------------------

namespace {

// Rotates the first R dims of each q and k head (R = HS: all), pairs i and
// i + R/2 with frequency theta^(-2i/R); the rest and v unchanged.
Vec ref_rope(const Vec& x, const AttnShape& s, int64_t po, double theta, int64_t R = 0) {
  R = R == 0 ? s.HS : R;
  const int64_t half = R / 2;
  Vec out(x);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.NH + s.kv(); ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double ang = (po + t) * std::pow(theta, -2.0 * i / R);
          const int64_t o = (b * s.T + t) * s.width() + h * s.HS + i;
          out[o] = x[o] * std::cos(ang) - x[o + half] * std::sin(ang);
          out[o + half] = x[o + half] * std::cos(ang) + x[o] * std::sin(ang);
        }
  return out;
}

}  // namespace

TEST_CASE("rope forward, inverse backward, in-place") {
  struct RopeCase {
    AttnShape s;
    int64_t R;  // rotated dims (0: all)
    float theta;
  };
  for (const RopeCase& rc : {RopeCase{{2, 7, 3, 4}, 0, 10000.f}, RopeCase{{2, 7, 4, 8, 2}, 0, 500000.f},
                             RopeCase{{2, 7, 4, 8, 2}, 4, 10000.f}, RopeCase{{1, 9, 2, 10, 1}, 6, 10000.f}}) {
    const AttnShape s = rc.s;
    const int64_t po = 3, R = rc.R;
    const float theta = rc.theta;
    DYNAMIC_SECTION("NH=" << s.NH << " NKV=" << s.kv() << " HS=" << s.HS << " R=" << R << " theta=" << theta) {
      const Shape shp{s.B, s.T, s.width()};
      RopeArgs f;
      f.inp = randn(shp, 70);
      f.out = Tensor::empty(shp, DType::F32);
      f.NH = static_cast<int>(s.NH), f.pos_offset = po, f.theta = theta;
      f.NKV = static_cast<int>(s.NKV), f.rot_dims = static_cast<int>(R);
      ops::rope_forward(f);
      const Vec x = to_f64(f.inp);
      check_close(f.out, ref_rope(x, s, po, theta, R), kFwdTol, "out (v and unrotated dims copied)");

      RopeArgs g = f;  // backward: out = dinp, inp = dout
      const Tensor dout = randn(shp, 71);
      g.inp = dout;
      g.out = Tensor::empty(shp, DType::F32);
      ops::rope_backward(g);
      const Vec dv = to_f64(dout);
      const Vec fd = fd_grad(x, [&](const Vec& v) { return dot(ref_rope(v, s, po, theta, R), dv); });
      check_close(g.out, fd, kBwdTol, "dinp");

      Tensor inplace = f.inp.clone();
      RopeArgs ip = f;
      ip.inp = inplace, ip.out = inplace;
      ops::rope_forward(ip);
      CHECK(bit_equal(inplace, f.out));
      ops::rope_backward(ip);  // inverse rotation restores the input
      check_close(inplace, x, 1e-6, "rope_backward(rope_forward(x)) == x");
    }
  }
}

TEST_CASE("attention and rope reject bad head counts and rotary dims") {
  AttentionArgs f{.out = Tensor::empty({1, 4, 8}, DType::F32), .lse = Tensor::empty({1, 4, 4}, DType::F32),
                  .qkv = randn({1, 4, 16}, 1), .NH = 4, .NKV = 3};
  REQUIRE_THROWS_WITH(ops::attention_forward(f), Catch::Contains("multiple of NKV=3"));
  f.NKV = 2;  // (4 + 2*2) * HS = 16 -> HS = 2, out (1, 4, 8): valid
  REQUIRE_NOTHROW(ops::attention_forward(f));
  f.qkv = randn({1, 4, 12}, 2);  // not (NH + 2*NKV) * HS for any HS
  REQUIRE_THROWS_WITH(ops::attention_forward(f), Catch::Contains("(NH+2*NKV)*HS"));
  RopeArgs r{.out = Tensor::empty({1, 4, 32}, DType::F32), .inp = randn({1, 4, 32}, 3), .NH = 2, .NKV = 1,
             .rot_dims = 6};
  REQUIRE_NOTHROW(ops::rope_forward(r));  // HS = 8: 6 of 8 dims rotated
  r.rot_dims = 5;
  REQUIRE_THROWS_WITH(ops::rope_forward(r), Catch::Contains("rotary dims 5"));
  r.rot_dims = 10;
  REQUIRE_THROWS_WITH(ops::rope_forward(r), Catch::Contains("rotary dims 10"));
}

// The harness's timing mode on the same cases as the checks above. Run with:
// test_cpu_ops "[bench]"
TEST_CASE("op timing (CPU)", "[.][bench]") {
  const int64_t N = 512, C = 768;
  const MatmulArgs mm{.out = Tensor::empty({N, C}, DType::F32), .inp = randn({N, C}, 1),
                      .weight = randn({C, C}, 2), .bias = randn({C}, 3)};
  const LayerNormArgs ln{.out = Tensor::empty({N, C}, DType::F32), .mean = Tensor::empty({N}, DType::F32),
                         .rstd = Tensor::empty({N}, DType::F32), .inp = randn({N, C}, 4),
                         .weight = randn({C}, 5), .bias = randn({C}, 6)};
  for (const OpCase& c : {matmul_forward_case(mm), layernorm_forward_case(ln)})
    std::printf("%-24s N=%lld C=%lld: %.1f us\n", c.name.c_str(), static_cast<long long>(N),
                static_cast<long long>(C), time_cpu(c, 20) / 1e3);
}
