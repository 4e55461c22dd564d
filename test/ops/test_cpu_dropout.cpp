// CPU tests of hidden dropout (dropout_forward / dropout_backward) and of
// attention dropout inside the attention ops: double references, finite
// differences with the (fixed) mask, keep fraction within binomial tolerance
// of 1 - p, masks independent of how the tensor is split across ranks
// (batch, sequence and head offsets), and argument checks.
#include <cmath>

#include "test/ops_harness/dropout_cases.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

DropoutSpec spec(float p, uint64_t seed = 7, int64_t layer = 3, DropoutSite site = DropoutSite::MlpOut) {
  return {.p = p, .stream = dropout_stream(seed, 11, layer, site), .sample0 = 0, .pos0 = 0, .head0 = 0};
}

}  // namespace

TEST_CASE("dropout forward (with and without residual) matches the double reference") {
  for (float p : {0.f, 0.1f, 0.5f}) {
    DropoutArgs a{.out = Tensor::zeros({3, 7, 13}, DType::F32), .inp = randn({3, 7, 13}, 1), .residual = randn({3, 7, 13}, 2),
                  .dropout = spec(p)};
    a.dropout.sample0 = 40, a.dropout.pos0 = 5;
    check_reference(dropout_forward_case(a));
    a.residual = Tensor();
    check_reference(dropout_forward_case(a));
  }
}

TEST_CASE("dropout backward matches finite differences of the forward with the same mask") {
  const Shape s{2, 5, 9};
  DropoutArgs a{.out = randn(s, 3), .inp = randn(s, 4), .residual = Tensor(), .dropout = spec(0.3f)};
  check_finite_diff(dropout_backward_case(a, randn(s, 5)));
}

TEST_CASE("dropout keeps a fraction 1 - p of the elements, scaled by 1/(1-p)") {
  const Shape s{4, 64, 256};  // 65536 elements
  const double n = 4 * 64 * 256;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const Tensor ones = full(s, 1.f), out = Tensor::empty(s, DType::F32);
    ops::dropout_forward({.out = out, .inp = ones, .residual = Tensor(), .dropout = spec(p)});
    int64_t kept = 0;
    const float scale = 1.f / (1.f - p);
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float v = out.data<float>()[i];
      REQUIRE((v == 0.f || v == scale));
      kept += v != 0.f;
    }
    const double frac = kept / n, sigma = std::sqrt(p * (1 - p) / n);
    INFO("p " << p << ": kept fraction " << frac << ", expected " << 1 - p << " +- " << 5 * sigma);
    CHECK(std::abs(frac - (1 - p)) < 5 * sigma);
  }
  // Different iterations, layers and sites draw different masks (about p(1-p)*2 of elements differ).
  const Tensor ones = full(s, 1.f), a = Tensor::empty(s, DType::F32), b = Tensor::empty(s, DType::F32);
  ops::dropout_forward({.out = a, .inp = ones, .residual = Tensor(), .dropout = spec(0.5f, 7, 3)});
  ops::dropout_forward({.out = b, .inp = ones, .residual = Tensor(), .dropout = spec(0.5f, 7, 4)});
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
  CHECK(std::abs(differ / n - 0.5) < 0.02);
}

TEST_CASE("dropout masks do not depend on how the batch and the sequence are split") {
  const int64_t B = 4, T = 12, C = 10;
  const Tensor x = randn({B, T, C}, 6), full_out = Tensor::empty({B, T, C}, DType::F32);
  DropoutSpec d = spec(0.4f);
  d.sample0 = 100;
  ops::dropout_forward({.out = full_out, .inp = x, .residual = Tensor(), .dropout = d});
  // Two data-parallel ranks of 2 samples, each holding two sequence-parallel shards of T/2 positions.
  for (int64_t b0 : {0, 2})
    for (int64_t t0 : {0, 6}) {
      Tensor part = Tensor::empty({2, 6, C}, DType::F32), got = Tensor::empty({2, 6, C}, DType::F32);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < 6; ++t)
          for (int64_t c = 0; c < C; ++c)
            part.data<float>()[(b * 6 + t) * C + c] = x.data<float>()[((b0 + b) * T + t0 + t) * C + c];
      DropoutSpec ds = d;
      ds.sample0 += b0;
      ds.pos0 = t0;
      ops::dropout_forward({.out = got, .inp = part, .residual = Tensor(), .dropout = ds});
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < 6; ++t)
          for (int64_t c = 0; c < C; ++c)
            REQUIRE(got.data<float>()[(b * 6 + t) * C + c] ==
                    full_out.data<float>()[((b0 + b) * T + t0 + t) * C + c]);
    }
}

TEST_CASE("dropout rejects a probability outside [0, 1) and a residual in the backward") {
  const Tensor x = randn({2, 3, 4}, 7), y = Tensor::empty({2, 3, 4}, DType::F32);
  for (float p : {1.f, -0.1f, 1.5f})
    CHECK_THROWS_WITH(ops::dropout_forward({.out = y, .inp = x, .residual = Tensor(), .dropout = spec(p)}),
                      Catch::Contains("dropout probability") && Catch::Contains("not in [0, 1)"));
  CHECK_THROWS_WITH(ops::dropout_backward({.out = y, .inp = x, .residual = x, .dropout = spec(0.1f)}),
                    Catch::Contains("'residual' must be undefined"));
  CHECK_THROWS_WITH(ops::dropout_forward({.out = y.reshape({6, 4}), .inp = x.reshape({6, 4}), .residual = Tensor(),
                                          .dropout = spec(0.1f)}),
                    Catch::Contains("must be (B, T, C)"));
}

// ---- attention dropout ------------------------------------------------------------

namespace {

struct AttnOut {
  Tensor out, lse, dqkv;
};

AttnOut run_attention(const Tensor& qkv, const Tensor& dout, int NH, const DropoutSpec& d) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  AttnOut r{Tensor::empty({B, T, C}, DType::F32), Tensor::empty({B, NH, T}, DType::F32),
            randn(qkv.shape(), 99)};
  ops::attention_forward({.out = r.out, .lse = r.lse, .qkv = qkv, .NH = NH, .dropout = d});
  ops::attention_backward(
      {.dqkv = r.dqkv, .dout = dout, .out = r.out, .lse = r.lse, .qkv = qkv, .NH = NH, .dropout = d});
  return r;
}

}  // namespace

TEST_CASE("attention dropout: forward matches the double reference, backward finite differences") {
  const int64_t B = 2, T = 70, NH = 2, HS = 8;  // T spans two 64-row query blocks
  const Tensor qkv = randn({B, T, 3 * NH * HS}, 20), dout = randn({B, T, NH * HS}, 21);
  DropoutSpec d = spec(0.3f, 7, 1, DropoutSite::AttentionProbs);
  d.sample0 = 9, d.head0 = 2;
  const AttnOut r = run_attention(qkv, dout, NH, d);
  Vec lse;
  check_close(r.out, ref_attention_dropout(to_f64(qkv), B, T, NH, HS, d, &lse), kFwdTol, "out");
  check_close(r.lse, lse, kFwdTol, "lse (of the undropped softmax)");
  // Small shape for the finite differences of sum(dout * out(qkv)) with the mask fixed.
  const int64_t b = 2, t = 6, nh = 2, hs = 4;
  const Tensor q2 = randn({b, t, 3 * nh * hs}, 22), g2 = randn({b, t, nh * hs}, 23);
  DropoutSpec d2 = d;
  d2.p = 0.5f;
  const AttnOut r2 = run_attention(q2, g2, static_cast<int>(nh), d2);
  const Vec gv = to_f64(g2);
  const Vec fd = fd_grad(to_f64(q2), [&](const Vec& x) {
    return dot(ref_attention_dropout(x, b, t, nh, hs, d2, nullptr), gv);
  });
  check_close(r2.dqkv, fd, kBwdTol, "dqkv vs finite differences");
  // Dropout really changed the result.
  const AttnOut r0 = run_attention(q2, g2, static_cast<int>(nh), DropoutSpec{});
  CHECK(rel_err(r2.out, to_f64(r0.out)) > 0.1);
}

TEST_CASE("attention dropout masks do not depend on the head and batch split") {
  const int64_t B = 2, T = 20, NH = 4, HS = 4, C = NH * HS;
  const Tensor qkv = randn({B, T, 3 * C}, 30), dout = randn({B, T, C}, 31);
  DropoutSpec d = spec(0.25f, 5, 0, DropoutSite::AttentionProbs);
  d.sample0 = 16;
  const AttnOut whole = run_attention(qkv, dout, NH, d);
  // Sample b on its own, heads [2, 4) of it (a tensor-parallel rank's half).
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nh = 2, h0 = 2, c = nh * HS;
    Tensor q = Tensor::empty({1, T, 3 * c}, DType::F32), g = Tensor::empty({1, T, c}, DType::F32);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t e = 0; e < c; ++e)
          q.data<float>()[t * 3 * c + part * c + e] = qkv.data<float>()[(b * T + t) * 3 * C + part * C + h0 * HS + e];
      for (int64_t e = 0; e < c; ++e) g.data<float>()[t * c + e] = dout.data<float>()[(b * T + t) * C + h0 * HS + e];
    }
    DropoutSpec ds = d;
    ds.sample0 += b;
    ds.head0 = h0;
    const AttnOut part = run_attention(q, g, static_cast<int>(nh), ds);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < c; ++e) {
        INFO("b " << b << " t " << t << " e " << e);
        REQUIRE(std::abs(part.out.data<float>()[t * c + e] - whole.out.data<float>()[(b * T + t) * C + h0 * HS + e]) <=
                1e-6f);
        for (int64_t p = 0; p < 3; ++p)
          REQUIRE(std::abs(part.dqkv.data<float>()[t * 3 * c + p * c + e] -
                           whole.dqkv.data<float>()[(b * T + t) * 3 * C + p * C + h0 * HS + e]) <= 1e-5f);
      }
  }
}
