// CPU op tests: embedding (vocab-parallel, position offset), LayerNorm, RMSNorm.
// Forward against double references, backward against finite differences of
// those references, gradient accumulation and thread-count determinism.
#include "test/ops_harness/op_cases.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

constexpr int64_t kNormC = 12;

namespace {

// ---- embedding ----------------------------------------------------------------

Vec ref_embedding(const std::vector<int32_t>& tok, const Vec& wte, const Vec* wpe, int64_t B,
                  int64_t T, int64_t C, int64_t V, int64_t vs, int64_t pos_offset) {
  Vec out(B * T * C, 0.0);
  for (int64_t n = 0; n < B * T; ++n) {
    const int64_t row = tok[n] - vs, t = n % T;
    for (int64_t c = 0; c < C; ++c) {
      double v = (row >= 0 && row < V) ? wte[row * C + c] : 0.0;
      if (wpe) v += (*wpe)[(pos_offset + t) * C + c];
      out[n * C + c] = v;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("embedding forward/backward with vocab range and position offset") {
  const int64_t B = 2, T = 7, C = 12, V = 10, vs = 5, maxT = 11, po = 3;
  std::vector<int32_t> tok = {0, 5, 6, 14, 15, 20, 7, 9, 9, 4, 13, 5, 10, 2};
  for (bool with_wpe : {true, false}) {
    DYNAMIC_SECTION("wpe " << with_wpe) {
      EmbeddingArgs f;
      f.out = Tensor::empty({B, T, C}, DType::F32);
      f.tokens = tokens_tensor({B, T}, tok);
      f.wte = randn({V, C}, 1);
      if (with_wpe) f.wpe = randn({maxT, C}, 2);
      f.vocab_start = vs;
      f.pos_offset = po;
      ops::embedding_forward(f);
      Vec wpe = with_wpe ? to_f64(f.wpe) : Vec{};
      const Vec* pwpe = with_wpe ? &wpe : nullptr;
      check_close(f.out, ref_embedding(tok, to_f64(f.wte), pwpe, B, T, C, V, vs, po), kFwdTol,
                  "embedding out");

      const Tensor w = randn({B, T, C}, 3);  // dL/dout
      EmbeddingBwdArgs g;
      g.dwte = randn({V, C}, 4);
      Tensor dwte0 = g.dwte.clone(), dwpe0;
      if (with_wpe) {
        g.dwpe = randn({maxT, C}, 5);
        dwpe0 = g.dwpe.clone();
      }
      g.dout = w;
      g.tokens = f.tokens;
      g.vocab_start = vs;
      g.pos_offset = po;
      ops::embedding_backward(g);
      ops::embedding_backward(g);  // accumulates twice
      const Vec wv = to_f64(w);
      Vec fd_wte = fd_grad(to_f64(f.wte), [&](const Vec& x) {
        return dot(ref_embedding(tok, x, pwpe, B, T, C, V, vs, po), wv);
      });
      check_close(g.dwte, add_vec(to_f64(dwte0), fd_wte, 2.0), kBwdTol, "dwte (x2)");
      if (with_wpe) {
        Vec fd_wpe = fd_grad(wpe, [&](const Vec& x) {
          return dot(ref_embedding(tok, to_f64(f.wte), &x, B, T, C, V, vs, po), wv);
        });
        check_close(g.dwpe, add_vec(to_f64(dwpe0), fd_wpe, 2.0), kBwdTol, "dwpe (x2)");
      }
    }
  }
}

// OPT's table: position t at row t + row_offset, and with right padding
// (lengths) every padding position at pad_row; forward against the formula,
// backward against finite differences of it.
TEST_CASE("embedding with a row offset and padding positions (OPT)") {
  const int64_t B = 2, T = 5, C = 4, V = 6, rows = 9, ro = 2, pad = 1, po = 1;
  const std::vector<int32_t> tok = {1, 2, 3, 0, 0, 5, 4, 3, 2, 1}, len = {3, 6};  // sample 0: positions 1.. pad from 3
  EmbeddingArgs f;
  f.out = Tensor::empty({B, T, C}, DType::F32);
  f.tokens = tokens_tensor({B, T}, tok);
  f.wte = randn({V, C}, 11);
  f.wpe = randn({rows, C}, 12);
  f.pos_offset = po;
  f.row_offset = ro;
  f.pad_row = pad;
  f.lengths = Tensor::empty({B}, DType::I32);
  for (int64_t b = 0; b < B; ++b) f.lengths.data<int32_t>()[b] = len[static_cast<size_t>(b)];
  auto ref = [&](const Vec& wte, const Vec& wpe) {
    Vec out(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = po + t >= len[static_cast<size_t>(b)] ? pad : ro + po + t;
        for (int64_t c = 0; c < C; ++c)
          out[(b * T + t) * C + c] = wte[tok[static_cast<size_t>(b * T + t)] * C + c] + wpe[r * C + c];
      }
    return out;
  };
  ops::embedding_forward(f);
  const Vec wte = to_f64(f.wte), wpe = to_f64(f.wpe);
  check_close(f.out, ref(wte, wpe), kFwdTol, "out");
  EmbeddingBwdArgs g;
  g.dwte = Tensor::zeros({V, C}, DType::F32);
  g.dwpe = Tensor::zeros({rows, C}, DType::F32);
  g.dout = randn({B, T, C}, 13);
  g.tokens = f.tokens;
  g.pos_offset = po;
  g.row_offset = ro;
  g.pad_row = pad;
  g.lengths = f.lengths;
  ops::embedding_backward(g);
  const Vec w = to_f64(g.dout);
  check_close(g.dwpe, fd_grad(wpe, [&](const Vec& x) { return dot(ref(wte, x), w); }), kBwdTol, "dwpe");
  check_close(g.dwte, fd_grad(wte, [&](const Vec& x) { return dot(ref(x, wpe), w); }), kBwdTol, "dwte");
  // Rows 0 (unused) and 8 (beyond the positions used) get no gradient.
  for (int64_t c = 0; c < C; ++c) REQUIRE(g.dwpe.data<float>()[c] == 0.f);
  f.row_offset = 4;  // positions [1, 6) from row 4 need 10 rows
  REQUIRE_THROWS_WITH(ops::embedding_forward(f), Catch::Contains("from row 4 exceed wpe rows 9"));
}

// GPT-2 under DeepSpeed-Chat's step 3: left-padded rows packed to the left
// keep their absolute positions, so a real position t of sample b reads row
// shifts[b] + t; padding positions (>= lengths[b]) read row t unshifted.
TEST_CASE("embedding with per-sample position shifts") {
  const int64_t B = 2, T = 4, C = 3, V = 5, rows = 8;
  const std::vector<int32_t> tok = {1, 2, 3, 0, 4, 3, 0, 0}, len = {3, 2}, sh = {4, 1};
  EmbeddingArgs f;
  f.out = Tensor::empty({B, T, C}, DType::F32);
  f.tokens = tokens_tensor({B, T}, tok);
  f.wte = randn({V, C}, 21);
  f.wpe = randn({rows, C}, 22);
  f.lengths = tokens_tensor({B}, len);
  f.shifts = tokens_tensor({B}, sh);
  auto ref = [&](const Vec& wte, const Vec& wpe) {
    Vec out(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = t < len[static_cast<size_t>(b)] ? sh[static_cast<size_t>(b)] + t : t;
        for (int64_t c = 0; c < C; ++c)
          out[(b * T + t) * C + c] = wte[tok[static_cast<size_t>(b * T + t)] * C + c] + wpe[r * C + c];
      }
    return out;
  };
  ops::embedding_forward(f);
  const Vec wte = to_f64(f.wte), wpe = to_f64(f.wpe);
  check_close(f.out, ref(wte, wpe), kFwdTol, "out");
  EmbeddingBwdArgs g;
  g.dwte = Tensor::zeros({V, C}, DType::F32);
  g.dwpe = Tensor::zeros({rows, C}, DType::F32);
  g.dout = randn({B, T, C}, 23);
  g.tokens = f.tokens;
  g.lengths = f.lengths;
  g.shifts = f.shifts;
  ops::embedding_backward(g);
  const Vec w = to_f64(g.dout);
  check_close(g.dwpe, fd_grad(wpe, [&](const Vec& x) { return dot(ref(wte, x), w); }), kBwdTol, "dwpe");
  check_close(g.dwte, fd_grad(wte, [&](const Vec& x) { return dot(ref(x, wpe), w); }), kBwdTol, "dwte");
  f.shifts.data<int32_t>()[0] = 6;  // positions 6..8 of sample 0 need 9 rows
  REQUIRE_THROWS_WITH(ops::embedding_forward(f), Catch::Contains("sample 0 shifted by 6"));
  f.lengths = Tensor();
  REQUIRE_THROWS_WITH(ops::embedding_forward(f), Catch::Contains("shifts need lengths"));
}

TEST_CASE("embedding rejects positions beyond wpe") {
  EmbeddingArgs f;
  f.out = Tensor::empty({1, 4, 3}, DType::F32);
  f.tokens = tokens_tensor({1, 4}, {0, 1, 2, 3});
  f.wte = randn({4, 3}, 1);
  f.wpe = randn({5, 3}, 2);
  f.pos_offset = 2;
  REQUIRE_THROWS(ops::embedding_forward(f));
}

// ---- layernorm / rmsnorm (OpCases of test/ops_harness/op_cases.h) -------------

TEST_CASE("layernorm forward and backward") {
  const float eps = 1e-5f;
  LayerNormArgs f;
  f.inp = randn({2, 7, kNormC}, 10, 2.0);
  for (int64_t i = 0; i < f.inp.numel(); ++i) f.inp.data<float>()[i] += 0.5f;  // nonzero mean
  f.weight = randn({kNormC}, 11);
  f.bias = randn({kNormC}, 12);
  f.out = Tensor::empty({2, 7, kNormC}, DType::F32);
  f.mean = Tensor::empty({2, 7}, DType::F32);
  f.rstd = Tensor::empty({2, 7}, DType::F32);
  f.eps = eps;
  check_reference(layernorm_forward_case(f));
  ops::layernorm_forward(f);  // the f32 statistics the backward reads

  const Tensor dout = randn({2, 7, kNormC}, 13);
  for (Accum acc : {Accum::Overwrite, Accum::Add}) {
    const LayerNormBwdArgs g{.dinp = randn({2, 7, kNormC}, 14), .dweight = randn({kNormC}, 15),
                             .dbias = randn({kNormC}, 16), .dout = dout, .inp = f.inp,
                             .weight = f.weight, .mean = f.mean, .rstd = f.rstd, .accum = acc};
    check_finite_diff(layernorm_backward_case(g, f.bias, eps, 1));
    check_finite_diff(layernorm_backward_case(g, f.bias, eps, 2));  // weight grads accumulate again
  }
}

TEST_CASE("rmsnorm forward and backward") {
  const int64_t N = 14, C = kNormC;
  const float eps = 1e-6f;
  RMSNormArgs f;
  f.inp = randn({N, C}, 20, 1.5);
  f.weight = randn({C}, 21);
  f.out = Tensor::empty({N, C}, DType::F32);
  f.rstd = Tensor::empty({N}, DType::F32);
  f.eps = eps;
  check_reference(rmsnorm_forward_case(f));
  ops::rmsnorm_forward(f);

  const Tensor dout = randn({N, C}, 22);
  for (Accum acc : {Accum::Overwrite, Accum::Add}) {
    // dinp: Overwrite gives the gradient; Add after two calls gives dinp0 + 2 * gradient.
    const RMSNormBwdArgs g{.dinp = randn({N, C}, 23), .dweight = randn({C}, 24), .dout = dout,
                           .inp = f.inp, .weight = f.weight, .rstd = f.rstd, .accum = acc};
    check_finite_diff(rmsnorm_backward_case(g, eps, 2));
  }
}

TEST_CASE("norms and embedding backward are bit-identical for 1 and 3 threads") {
  const int64_t N = 300, C = 96;
  const Tensor x = randn({N, C}, 30), w = randn({C}, 31), b = randn({C}, 32), dy = randn({N, C}, 33);
  auto run_ln = [&](int threads) {
    LayerNormArgs f;
    f.inp = x, f.weight = w, f.bias = b;
    f.out = Tensor::empty({N, C}, DType::F32);
    f.mean = Tensor::empty({N}, DType::F32);
    f.rstd = Tensor::empty({N}, DType::F32);
    LayerNormBwdArgs g;
    g.dinp = Tensor::empty({N, C}, DType::F32);
    g.dweight = Tensor::zeros({C}, DType::F32);
    g.dbias = Tensor::zeros({C}, DType::F32);
    g.dout = dy, g.inp = x, g.weight = w, g.mean = f.mean, g.rstd = f.rstd;
    with_threads(threads, [&] {
      ops::layernorm_forward(f);
      ops::layernorm_backward(g);
    });
    return std::vector<Tensor>{f.out, g.dinp, g.dweight, g.dbias};
  };
  auto run_emb = [&](int threads) {
    std::vector<int32_t> tok(N);
    for (int64_t i = 0; i < N; ++i) tok[i] = static_cast<int32_t>((i * 37) % 50);
    EmbeddingBwdArgs g;
    g.dwte = Tensor::zeros({50, C}, DType::F32);
    g.dwpe = Tensor::zeros({N / 3, C}, DType::F32);
    g.dout = dy.reshape({3, N / 3, C});
    g.tokens = tokens_tensor({3, N / 3}, tok);
    with_threads(threads, [&] { ops::embedding_backward(g); });
    return std::vector<Tensor>{g.dwte, g.dwpe};
  };
  const auto a1 = run_ln(1), a3 = run_ln(3);
  for (size_t i = 0; i < a1.size(); ++i) CHECK(bit_equal(a1[i], a3[i]));
  const auto e1 = run_emb(1), e3 = run_emb(3);
  for (size_t i = 0; i < e1.size(); ++i) CHECK(bit_equal(e1[i], e3[i]));
}
