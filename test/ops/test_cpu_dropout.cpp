// CPU tests of hidden dropout (dropout_forward / dropout_backward) and of
// attention dropout inside the attention ops: double references, finite
// differences with the (fixed) mask, keep fraction within binomial tolerance
// of 1 - p, masks independent of how the tensor is split across ranks
// (batch, sequence and head offsets), the per-step key read from memory
// (DropoutSpec::step_key, the ops' dropout_key) drawing the by-value spec's
// masks, and argument checks.
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

AttnOut run_attention(const Tensor& qkv, const Tensor& dout, int NH, const DropoutSpec& d,
                      const Tensor& key = Tensor()) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  AttnOut r{Tensor::empty({B, T, C}, DType::F32), Tensor::empty({B, NH, T}, DType::F32),
            randn(qkv.shape(), 99)};
  ops::attention_forward({.out = r.out, .lse = r.lse, .qkv = qkv, .NH = NH, .dropout = d, .dropout_key = key});
  ops::attention_backward({.dqkv = r.dqkv,
                           .dout = dout,
                           .out = r.out,
                           .lse = r.lse,
                           .qkv = qkv,
                           .NH = NH,
                           .dropout = d,
                           .dropout_key = key});
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

// ---- the per-step key in memory -------------------------------------------------

namespace {

// The two specs of one site: by value, and with {iteration, first sample} left
// to the key tensor (sample0 then holds only the offset within the micro-batch).
struct KeyedSpecs {
  DropoutSpec by_value, keyed;
  Tensor key;  // (2) i64
};
KeyedSpecs keyed_specs(float p, int64_t iteration, int64_t first_sample, int64_t offset, int64_t layer,
                       DropoutSite site) {
  const uint64_t seed = 1234;
  KeyedSpecs k;
  k.by_value = {.p = p, .stream = dropout_stream(seed, iteration, layer, site), .sample0 = first_sample + offset,
                .pos0 = 3, .head0 = 1};
  k.keyed = {.p = p, .stream = 0, .sample0 = offset, .pos0 = 3, .head0 = 1, .seed = seed, .layer = layer,
             .site = site};
  k.key = Tensor::empty({2}, DType::I64);
  k.key.data<int64_t>()[0] = iteration;
  k.key.data<int64_t>()[1] = first_sample;
  return k;
}

struct KeyCase {
  int64_t iteration, first_sample, offset;
};
const KeyCase kKeyCases[] = {{0, 0, 0}, {11, 40, 3}, {123456, int64_t(1) << 33, 7}};

}  // namespace

TEST_CASE("dropout_resolve gives the by-value spec, and leaves a spec without a key alone") {
  for (const KeyCase& c : kKeyCases) {
    const KeyedSpecs k = keyed_specs(0.2f, c.iteration, c.first_sample, c.offset, 5, DropoutSite::AttentionOut);
    DropoutSpec keyed = k.keyed;
    keyed.step_key = k.key.data<int64_t>();
    const DropoutSpec r = dropout_resolve(keyed);
    CHECK(r.stream == k.by_value.stream);
    CHECK(r.sample0 == k.by_value.sample0);
    CHECK(r.pos0 == k.by_value.pos0);
    CHECK(r.head0 == k.by_value.head0);
    CHECK(r.step_key == nullptr);
    const DropoutSpec same = dropout_resolve(k.by_value);
    CHECK(same.stream == k.by_value.stream);
    CHECK(same.sample0 == k.by_value.sample0);
  }
}

TEST_CASE("hidden dropout with the key in memory equals the by-value spec bit for bit") {
  const Shape s{3, 7, 13};
  const Tensor x = randn(s, 40), res = randn(s, 41);
  for (const KeyCase& c : kKeyCases) {
    INFO("iteration " << c.iteration << " first sample " << c.first_sample << " offset " << c.offset);
    const KeyedSpecs k = keyed_specs(0.3f, c.iteration, c.first_sample, c.offset, 2, DropoutSite::MlpOut);
    const Tensor want = Tensor::empty(s, DType::F32), got = Tensor::empty(s, DType::F32);
    ops::dropout_forward({.out = want, .inp = x, .residual = res, .dropout = k.by_value});
    ops::dropout_forward({.out = got, .inp = x, .residual = res, .dropout = k.keyed, .dropout_key = k.key});
    CHECK(bit_equal(got, want));
    ops::dropout_backward({.out = want, .inp = x, .residual = Tensor(), .dropout = k.by_value});
    ops::dropout_backward({.out = got, .inp = x, .residual = Tensor(), .dropout = k.keyed, .dropout_key = k.key});
    CHECK(bit_equal(got, want));
    // bf16 (the CPU's f32 emulation keeps the key).
    const Tensor xb = Tensor::empty(s, DType::BF16), wb = Tensor::empty(s, DType::BF16), gb = Tensor::empty(s, DType::BF16);
    ops::cast({.out = xb, .inp = x});
    ops::dropout_forward({.out = wb, .inp = xb, .residual = Tensor(), .dropout = k.by_value});
    ops::dropout_forward({.out = gb, .inp = xb, .residual = Tensor(), .dropout = k.keyed, .dropout_key = k.key});
    CHECK(bit_equal(gb, wb));
  }
}

TEST_CASE("attention dropout with the key in memory equals the by-value spec bit for bit") {
  const int64_t B = 2, T = 70, NH = 2, HS = 8;
  const Tensor qkv = randn({B, T, 3 * NH * HS}, 42), dout = randn({B, T, NH * HS}, 43);
  for (const KeyCase& c : kKeyCases) {
    INFO("iteration " << c.iteration << " first sample " << c.first_sample << " offset " << c.offset);
    const KeyedSpecs k = keyed_specs(0.25f, c.iteration, c.first_sample, c.offset, 1, DropoutSite::AttentionProbs);
    const AttnOut want = run_attention(qkv, dout, NH, k.by_value);
    const AttnOut got = run_attention(qkv, dout, NH, k.keyed, k.key);
    CHECK(bit_equal(got.out, want.out));
    CHECK(bit_equal(got.lse, want.lse));
    CHECK(bit_equal(got.dqkv, want.dqkv));
  }
  // Another iteration in the key draws another mask.
  const KeyedSpecs a = keyed_specs(0.25f, 3, 0, 0, 1, DropoutSite::AttentionProbs);
  const KeyedSpecs b = keyed_specs(0.25f, 4, 0, 0, 1, DropoutSite::AttentionProbs);
  CHECK_FALSE(bit_equal(run_attention(qkv, dout, NH, a.keyed, a.key).out,
                        run_attention(qkv, dout, NH, b.keyed, b.key).out));
}

TEST_CASE("dropout_key must be (2) i64, and step_key comes only from it") {
  const Tensor x = randn({2, 3, 4}, 44), y = Tensor::empty({2, 3, 4}, DType::F32);
  const KeyedSpecs k = keyed_specs(0.1f, 1, 2, 0, 0, DropoutSite::MlpOut);
  const Tensor i32 = Tensor::zeros({2}, DType::I32), three = Tensor::zeros({3}, DType::I64);
  CHECK_THROWS_WITH(ops::dropout_forward({.out = y, .inp = x, .residual = Tensor(), .dropout = k.keyed,
                                          .dropout_key = i32}),
                    Catch::Contains("dropout_key") && Catch::Contains("i64"));
  CHECK_THROWS_WITH(ops::dropout_forward({.out = y, .inp = x, .residual = Tensor(), .dropout = k.keyed,
                                          .dropout_key = three}),
                    Catch::Contains("dropout_key") && Catch::Contains("{iteration, first sample}"));
  DropoutSpec raw = k.keyed;
  raw.step_key = k.key.data<int64_t>();
  CHECK_THROWS_WITH(ops::dropout_forward({.out = y, .inp = x, .residual = Tensor(), .dropout = raw}),
                    Catch::Contains("step_key") && Catch::Contains("dropout_key"));
  const Tensor qkv = randn({1, 4, 3 * 8}, 45), out = Tensor::empty({1, 4, 8}, DType::F32);
  CHECK_THROWS_WITH(ops::attention_forward({.out = out, .lse = Tensor::empty({1, 2, 4}, DType::F32), .qkv = qkv,
                                            .NH = 2, .dropout = k.keyed, .dropout_key = i32}),
                    Catch::Contains("attention_forward") && Catch::Contains("dropout_key"));
}
