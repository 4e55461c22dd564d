// CPU op tests: embedding (vocab-parallel, position offset), LayerNorm, RMSNorm.
// Forward against double references, backward against finite differences of
// those references, gradient accumulation and thread-count determinism.
#include "test/ops/op_test_util.h"

using namespace ds;
using namespace ds::test;

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

TEST_CASE("embedding rejects positions beyond wpe") {
  EmbeddingArgs f;
  f.out = Tensor::empty({1, 4, 3}, DType::F32);
  f.tokens = tokens_tensor({1, 4}, {0, 1, 2, 3});
  f.wte = randn({4, 3}, 1);
  f.wpe = randn({5, 3}, 2);
  f.pos_offset = 2;
  REQUIRE_THROWS(ops::embedding_forward(f));
}

// ---- layernorm / rmsnorm --------------------------------------------------------

namespace {

struct NormRef {
  Vec out, mean, rstd;
};

NormRef ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C, double eps) {
  NormRef r{Vec(N * C), Vec(N), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double rs = 1.0 / std::sqrt(v / C + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - m) * rs * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = rs;
  }
  return r;
}

NormRef ref_rmsnorm(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps) {
  NormRef r{Vec(N * C), Vec(), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * x[n * C + c];
    const double rs = 1.0 / std::sqrt(s / C + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * rs * w[c];
    r.rstd[n] = rs;
  }
  return r;
}

}  // namespace

TEST_CASE("layernorm forward and backward") {
  const int64_t N = 14, C = 12;
  const float eps = 1e-5f;
  LayerNormArgs f;
  f.inp = randn({2, 7, C}, 10, 2.0);
  for (int64_t i = 0; i < f.inp.numel(); ++i) f.inp.data<float>()[i] += 0.5f;  // nonzero mean
  f.weight = randn({C}, 11);
  f.bias = randn({C}, 12);
  f.out = Tensor::empty({2, 7, C}, DType::F32);
  f.mean = Tensor::empty({2, 7}, DType::F32);
  f.rstd = Tensor::empty({2, 7}, DType::F32);
  f.eps = eps;
  ops::layernorm_forward(f);
  const Vec x = to_f64(f.inp), w = to_f64(f.weight), b = to_f64(f.bias);
  const NormRef r = ref_layernorm(x, w, b, N, C, eps);
  check_close(f.out, r.out, kFwdTol, "out");
  check_close(f.mean, r.mean, kFwdTol, "mean");
  check_close(f.rstd, r.rstd, kFwdTol, "rstd");

  const Tensor dout = randn({2, 7, C}, 13);
  const Vec wv = to_f64(dout);
  const Vec fd_x = fd_grad(x, [&](const Vec& v) { return dot(ref_layernorm(v, w, b, N, C, eps).out, wv); });
  const Vec fd_w = fd_grad(w, [&](const Vec& v) { return dot(ref_layernorm(x, v, b, N, C, eps).out, wv); });
  const Vec fd_b = fd_grad(b, [&](const Vec& v) { return dot(ref_layernorm(x, w, v, N, C, eps).out, wv); });
  for (Accum acc : {Accum::Overwrite, Accum::Add}) {
    LayerNormBwdArgs g;
    g.dinp = randn({2, 7, C}, 14);
    const Tensor dinp0 = g.dinp.clone();
    g.dweight = randn({C}, 15);
    g.dbias = randn({C}, 16);
    const Tensor dw0 = g.dweight.clone(), db0 = g.dbias.clone();
    g.dout = dout;
    g.inp = f.inp;
    g.weight = f.weight;
    g.mean = f.mean;
    g.rstd = f.rstd;
    g.accum = acc;
    ops::layernorm_backward(g);
    const Vec want_dx = acc == Accum::Add ? add_vec(to_f64(dinp0), fd_x) : fd_x;
    check_close(g.dinp, want_dx, kBwdTol, "dinp");
    check_close(g.dweight, add_vec(to_f64(dw0), fd_w), kBwdTol, "dweight");
    check_close(g.dbias, add_vec(to_f64(db0), fd_b), kBwdTol, "dbias");
    ops::layernorm_backward(g);  // weight grads accumulate again
    check_close(g.dweight, add_vec(to_f64(dw0), fd_w, 2.0), kBwdTol, "dweight x2");
    check_close(g.dbias, add_vec(to_f64(db0), fd_b, 2.0), kBwdTol, "dbias x2");
  }
}

TEST_CASE("rmsnorm forward and backward") {
  const int64_t N = 14, C = 12;
  const float eps = 1e-6f;
  RMSNormArgs f;
  f.inp = randn({N, C}, 20, 1.5);
  f.weight = randn({C}, 21);
  f.out = Tensor::empty({N, C}, DType::F32);
  f.rstd = Tensor::empty({N}, DType::F32);
  f.eps = eps;
  ops::rmsnorm_forward(f);
  const Vec x = to_f64(f.inp), w = to_f64(f.weight);
  const NormRef r = ref_rmsnorm(x, w, N, C, eps);
  check_close(f.out, r.out, kFwdTol, "out");
  check_close(f.rstd, r.rstd, kFwdTol, "rstd");

  const Tensor dout = randn({N, C}, 22);
  const Vec wv = to_f64(dout);
  const Vec fd_x = fd_grad(x, [&](const Vec& v) { return dot(ref_rmsnorm(v, w, N, C, eps).out, wv); });
  const Vec fd_w = fd_grad(w, [&](const Vec& v) { return dot(ref_rmsnorm(x, v, N, C, eps).out, wv); });
  for (Accum acc : {Accum::Overwrite, Accum::Add}) {
    RMSNormBwdArgs g;
    g.dinp = randn({N, C}, 23);
    const Tensor dinp0 = g.dinp.clone();
    g.dweight = randn({C}, 24);
    const Tensor dw0 = g.dweight.clone();
    g.dout = dout;
    g.inp = f.inp;
    g.weight = f.weight;
    g.rstd = f.rstd;
    g.accum = acc;
    ops::rmsnorm_backward(g);
    ops::rmsnorm_backward(g);
    // dinp: Overwrite gives the gradient; Add after two calls gives dinp0 + 2 * gradient.
    const Vec want_dx = acc == Accum::Add ? add_vec(to_f64(dinp0), fd_x, 2.0) : fd_x;
    check_close(g.dinp, want_dx, kBwdTol, "dinp");
    check_close(g.dweight, add_vec(to_f64(dw0), fd_w, 2.0), kBwdTol, "dweight x2");
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
