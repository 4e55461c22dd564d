// CPU op tests: GELU, SwiGLU, add, cross-entropy (padded vocab, ignored
// targets, aliasing), AdamW (two-step reference), sum of squares, non-finite
// check, masked mean (the deferred training loss), scale and cast.
#include <cstring>

#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

Vec map(const Vec& x, double (*f)(double)) {
  Vec r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = f(x[i]);
  return r;
}

}  // namespace

TEST_CASE("gelu forward and backward") {
  for (int64_t n : {int64_t{3 * 37}, int64_t{3 * 4096 + 5}}) {
    const Tensor x = randn({n}, 80, 3.0), dout = randn({n}, 81);
    GeluArgs f;
    f.inp = x;
    f.out = Tensor::empty({n}, DType::F32);
    ops::gelu_forward(f);
    check_close(f.out, map(to_f64(x), ref_gelu), kFwdTol, "gelu");
    GeluArgs g;
    g.inp = x, g.dout = dout, g.out = Tensor::empty({n}, DType::F32);
    ops::gelu_backward(g);
    // Elementwise: the derivative of sum(w * gelu(x)) is w_i * gelu'(x_i).
    const Vec xv = to_f64(x), dv = to_f64(dout);
    Vec want(n);
    for (int64_t i = 0; i < n; ++i)
      want[i] = dv[i] * (ref_gelu(xv[i] + 1e-5) - ref_gelu(xv[i] - 1e-5)) / 2e-5;
    check_close(g.out, want, kBwdTol, "gelu backward vs finite differences");
    if (n > 4096) {
      Tensor o1 = Tensor::empty({n}, DType::F32), o3 = Tensor::empty({n}, DType::F32);
      g.out = o1;
      with_threads(1, [&] { ops::gelu_backward(g); });
      g.out = o3;
      with_threads(3, [&] { ops::gelu_backward(g); });
      CHECK(bit_equal(o1, o3));
    }
  }
}

TEST_CASE("relu forward and backward") {
  const int64_t n = 3 * 4096 + 5;
  Tensor x = randn({n}, 82, 3.0);
  x.data<float>()[7] = 0.f;  // relu'(0) = 0, as torch's threshold_backward
  const Tensor dout = randn({n}, 83);
  GeluArgs f{.out = Tensor::empty({n}, DType::F32), .inp = x, .dout = Tensor()};
  ops::relu_forward(f);
  check_close(f.out, map(to_f64(x), [](double v) { return v > 0 ? v : 0.0; }), 0.0, "relu");
  GeluArgs g{.out = Tensor::empty({n}, DType::F32), .inp = x, .dout = dout};
  ops::relu_backward(g);
  const Vec xv = to_f64(x), dv = to_f64(dout);
  Vec want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = xv[i] > 0 ? dv[i] : 0.0;
  check_close(g.out, want, 0.0, "relu backward");
  CHECK(g.out.data<float>()[7] == 0.f);
  // bf16 (emulated through f32): exact, as max(x, 0) of a bf16 value is one.
  GeluArgs h{.out = Tensor::empty({n}, DType::BF16), .inp = to_dtype(x, DType::BF16), .dout = Tensor()};
  ops::relu_forward(h);
  const Tensor back = to_dtype(h.out, DType::F32), xin = to_dtype(h.inp, DType::F32);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += back.data<float>()[i] != std::max(xin.data<float>()[i], 0.f);
  CHECK(bad == 0);
}

namespace {

Vec ref_swiglu(const Vec& x, int64_t N, int64_t F) {
  Vec out(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = x[n * 2 * F + f], u = x[n * 2 * F + F + f];
      out[n * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

}  // namespace

TEST_CASE("swiglu forward and backward") {
  const int64_t N = 14, F = 5;
  SwigluArgs f;
  f.inp = randn({2, 7, 2 * F}, 90, 2.0);
  f.out = Tensor::empty({2, 7, F}, DType::F32);
  ops::swiglu_forward(f);
  const Vec x = to_f64(f.inp);
  check_close(f.out, ref_swiglu(x, N, F), kFwdTol, "swiglu");
  SwigluBwdArgs g;
  g.dinp = randn({2, 7, 2 * F}, 91);  // overwritten
  g.dout = randn({2, 7, F}, 92);
  g.inp = f.inp;
  ops::swiglu_backward(g);
  const Vec dv = to_f64(g.dout);
  check_close(g.dinp, fd_grad(x, [&](const Vec& v) { return dot(ref_swiglu(v, N, F), dv); }),
              kBwdTol, "swiglu backward");
  f.out = Tensor::empty({N, F + 1}, DType::F32);
  REQUIRE_THROWS(ops::swiglu_forward(f));
}

TEST_CASE("add, also in place") {
  const Tensor a = randn({5, 9}, 100), b = randn({5, 9}, 101);
  AddArgs args{Tensor::empty({5, 9}, DType::F32), a, b};
  ops::add(args);
  check_close(args.out, add_vec(to_f64(a), to_f64(b)), kFwdTol, "add");
  Tensor acc = a.clone();
  ops::add(AddArgs{acc, acc, b});
  CHECK(bit_equal(acc, args.out));
}

// The fused residual add + norm must give the bits of add then norm (what
// the model ran before it), for both norms, f32 and bf16, sum aliasing a.
TEST_CASE("add_norm_forward: the bits of add then norm") {
  const int64_t N = 7, C = 45;
  for (DType dt : {DType::F32, DType::BF16})
    for (NormType nt : {NormType::LayerNorm, NormType::RMSNorm}) {
      auto cast = [&](const Tensor& f) {
        Tensor t = Tensor::empty(f.shape(), dt);
        ops::cast({.out = t, .inp = f});
        return t;
      };
      const Tensor a = cast(randn({N, C}, 140)), b = cast(randn({N, C}, 141));
      const Tensor wt = cast(randn({C}, 142)), bias = cast(randn({C}, 143));
      const bool ln = nt == NormType::LayerNorm;
      // Unfused.
      Tensor s1 = a.clone(), o1 = Tensor::empty({N, C}, dt), m1 = Tensor::empty({N}, DType::F32),
             r1 = Tensor::empty({N}, DType::F32);
      ops::add({.out = s1, .a = s1, .b = b});
      if (ln) ops::layernorm_forward({.out = o1, .mean = m1, .rstd = r1, .inp = s1, .weight = wt, .bias = bias});
      else ops::rmsnorm_forward({.out = o1, .rstd = r1, .inp = s1, .weight = wt});
      // Fused, sum aliasing a.
      Tensor s2 = a.clone(), o2 = Tensor::empty({N, C}, dt), m2 = Tensor::empty({N}, DType::F32),
             r2 = Tensor::empty({N}, DType::F32);
      ops::add_norm_forward({.sum = s2, .out = o2, .mean = ln ? m2 : Tensor(), .rstd = r2, .a = s2, .b = b,
                             .weight = wt, .bias = ln ? bias : Tensor(), .norm = nt});
      INFO(dtype_name(dt) << (ln ? " layernorm" : " rmsnorm"));
      CHECK(bit_equal(s1, s2));
      CHECK(bit_equal(o1, o2));
      CHECK(bit_equal(r1, r2));
      if (ln) CHECK(bit_equal(m1, m2));
    }
}

// ---- cross-entropy ---------------------------------------------------------------

namespace {

Vec ref_ce(const Vec& x, const std::vector<int32_t>& tgt, int64_t N, int64_t Vp, int64_t V) {
  Vec loss(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (tgt[n] < 0) continue;
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[n * Vp + j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[n * Vp + j] - mx);
    loss[n] = mx + std::log(s) - x[n * Vp + tgt[n]];
  }
  return loss;
}

}  // namespace

TEST_CASE("cross-entropy: padded vocab, ignored targets, aliasing") {
  const int64_t N = 14, V = 37, Vp = 40;
  const float dloss = 1.f / 11;
  std::vector<int32_t> tgt = {3, -1, 36, 0, 12, 5, -1, 7, 20, 1, 30, 2, -100, 8};
  Tensor logits = randn({N, Vp}, 110, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) logits.data<float>()[n * Vp + j] = 100.f;  // must be ignored
  CrossEntropyArgs a;
  a.losses = Tensor::empty({N}, DType::F32);
  a.dlogits = Tensor::empty({N, Vp}, DType::F32);
  a.logits = logits;
  a.targets = tokens_tensor({N}, tgt);
  a.V = V;
  a.dloss = dloss;
  ops::cross_entropy(a);
  const Vec x = to_f64(logits);
  const Vec want = ref_ce(x, tgt, N, Vp, V);
  check_close(a.losses, want, kFwdTol, "losses");
  const Vec fd = fd_grad(x, [&](const Vec& v) {
    double s = 0;
    for (double l : ref_ce(v, tgt, N, Vp, V)) s += dloss * l;
    return s;
  });
  check_close(a.dlogits, fd, kBwdTol, "dlogits");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < Vp; ++j)
      if (j >= V || tgt[n] < 0) CHECK(a.dlogits.data<float>()[n * Vp + j] == 0.f);

  CrossEntropyArgs in_place = a;  // dlogits aliases logits
  in_place.logits = logits.clone();
  in_place.dlogits = in_place.logits;
  in_place.losses = Tensor::empty({N}, DType::F32);
  ops::cross_entropy(in_place);
  CHECK(bit_equal(in_place.losses, a.losses));
  CHECK(bit_equal(in_place.dlogits, a.dlogits));

  CrossEntropyArgs loss_only = a;
  loss_only.dlogits = Tensor();
  loss_only.losses = Tensor::empty({N}, DType::F32);
  ops::cross_entropy(loss_only);
  CHECK(bit_equal(loss_only.losses, a.losses));

  // dloss_scale: the gradient is dloss x its value, read when the op runs
  // (with a power of two, the bits of dloss x scale by value).
  CrossEntropyArgs scaled = a, by_value = a;
  scaled.dloss_scale = Tensor::empty({1}, DType::F32);
  scaled.dloss_scale.data<float>()[0] = 1024.f;
  scaled.losses = Tensor::empty({N}, DType::F32);
  scaled.dlogits = Tensor::empty({N, Vp}, DType::F32);
  by_value.dloss = dloss * 1024.f;
  by_value.losses = Tensor::empty({N}, DType::F32);
  by_value.dlogits = Tensor::empty({N, Vp}, DType::F32);
  ops::cross_entropy(scaled);
  ops::cross_entropy(by_value);
  CHECK(bit_equal(scaled.losses, a.losses));
  CHECK(bit_equal(scaled.dlogits, by_value.dlogits));
  CHECK_FALSE(bit_equal(scaled.dlogits, a.dlogits));
  scaled.dloss_scale = Tensor::zeros({2}, DType::F32);
  CHECK_THROWS_WITH(ops::cross_entropy(scaled), Catch::Contains("dloss_scale"));

  tgt[4] = static_cast<int32_t>(V);  // a target in the padding is an error
  loss_only.targets = tokens_tensor({N}, tgt);
  REQUIRE_THROWS(ops::cross_entropy(loss_only));
}

namespace {

// KL(p_t || p_s) per row at temperature tau over [0, V), in double.
Vec ref_kd(const Vec& xs, const Vec& xt, int64_t N, int64_t Vp, int64_t V, double tau) {
  Vec kl(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    auto lse = [&](const Vec& x) {
      double mx = -1e300, s = 0;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[n * Vp + j] / tau);
      for (int64_t j = 0; j < V; ++j) s += std::exp(x[n * Vp + j] / tau - mx);
      return mx + std::log(s);
    };
    const double ls = lse(xs), lt = lse(xt);
    for (int64_t j = 0; j < V; ++j) {
      const double a = xt[n * Vp + j] / tau - lt, b = xs[n * Vp + j] / tau - ls;
      kl[n] += std::exp(a) * (a - b);
    }
  }
  return kl;
}

}  // namespace

TEST_CASE("kd loss: KL at a temperature, its gradient, padding and aliasing") {
  const int64_t N = 9, V = 29, Vp = 32;
  for (float temp : {1.0f, 2.5f}) {
    const float dscale = 0.37f;
    Tensor student = randn({N, Vp}, 120, 2.0), teacher = randn({N, Vp}, 121, 2.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = V; j < Vp; ++j) student.data<float>()[n * Vp + j] = teacher.data<float>()[n * Vp + j] = 50.f;
    KdLossArgs a{.losses = Tensor::empty({N}, DType::F32), .dlogits = Tensor::empty({N, Vp}, DType::F32),
                 .logits = student, .teacher = teacher, .V = V, .temp = temp, .dscale = dscale};
    ops::kd_loss(a);
    const Vec xs = to_f64(student), xt = to_f64(teacher);
    check_close(a.losses, ref_kd(xs, xt, N, Vp, V, temp), kFwdTol, "losses");
    // d/dx_s of dscale * temp * sum_n KL_n is dscale * (p_s - p_t): the op's gradient.
    const Vec fd = fd_grad(xs, [&](const Vec& v) {
      double s = 0;
      for (double l : ref_kd(v, xt, N, Vp, V, temp)) s += dscale * temp * l;
      return s;
    });
    check_close(a.dlogits, fd, kBwdTol, "dlogits");
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = V; j < Vp; ++j) CHECK(a.dlogits.data<float>()[n * Vp + j] == 0.f);
    KdLossArgs in_place = a;  // the gradient written over the teacher's logits
    in_place.teacher = teacher.clone();
    in_place.dlogits = in_place.teacher;
    in_place.losses = Tensor::empty({N}, DType::F32);
    ops::kd_loss(in_place);
    CHECK(bit_equal(in_place.losses, a.losses));
    CHECK(bit_equal(in_place.dlogits, a.dlogits));
  }
  // The same distribution: no loss, no gradient.
  Tensor x = randn({N, Vp}, 122, 2.0);
  KdLossArgs same{.losses = Tensor::empty({N}, DType::F32), .dlogits = Tensor::empty({N, Vp}, DType::F32),
                  .logits = x, .teacher = x.clone(), .V = V, .temp = 1.5f, .dscale = 1.0f};
  ops::kd_loss(same);
  for (int64_t n = 0; n < N; ++n) CHECK(std::abs(same.losses.data<float>()[n]) < 1e-6f);
  KdLossArgs alias_student = same;
  alias_student.dlogits = same.logits;
  CHECK_THROWS_WITH(ops::kd_loss(alias_student), Catch::Contains("alias"));
  KdLossArgs bad_temp = same;
  bad_temp.temp = 0.f;
  CHECK_THROWS_WITH(ops::kd_loss(bad_temp), Catch::Contains("temp"));
}

// ---- optimizer ops ---------------------------------------------------------------

TEST_CASE("adamw: hand-computed scalar steps") {
  // p=1, g=0.5 scaled by 2 -> 1, lr 0.1, wd 0.1. Step 1: p = 1 - 0.01 - 0.1 = 0.89.
  // Step 2: p = 0.89 - 0.0089 - 0.1 * 1 = 0.7811 (bias-corrected m/sqrt(v) is 1 both times).
  AdamWArgs a;
  a.param = full({1}, 1.f);
  a.grad = full({1}, 0.5f);
  a.m = full({1}, 0.f);
  a.v = full({1}, 0.f);
  a.lr = 0.1f, a.weight_decay = 0.1f, a.grad_scale = 2.f, a.eps = 1e-8f;
  a.step = 1;
  ops::adamw_step(a);
  CHECK(a.param.data<float>()[0] == Approx(0.89).epsilon(1e-6));
  a.step = 2;
  ops::adamw_step(a);
  CHECK(a.param.data<float>()[0] == Approx(0.7811).epsilon(1e-6));
  // 1 - 0.999f is 1.0000467e-3 in float, hence the looser bound on v.
  CHECK(a.m.data<float>()[0] == Approx(0.19).epsilon(1e-6));
  CHECK(a.v.data<float>()[0] == Approx(0.001999).epsilon(5e-5));
}

TEST_CASE("adamw: two steps against a double reference, bf16 copy") {
  const int64_t n = 37;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  const Tensor g1 = randn({n}, 120), g2 = randn({n}, 121);
  AdamWArgs a;
  a.param = randn({n}, 122);
  a.m = Tensor::zeros({n}, DType::F32);
  a.v = Tensor::zeros({n}, DType::F32);
  a.param_lowp = Tensor::empty({n}, DType::BF16);
  a.lr = lr, a.beta1 = b1, a.beta2 = b2, a.eps = eps, a.weight_decay = wd, a.grad_scale = gs;
  Vec p = to_f64(a.param), m(n, 0.0), v(n, 0.0);
  const Tensor grads[2] = {g1, g2};
  for (int step = 1; step <= 2; ++step) {
    a.grad = grads[step - 1];
    a.step = step;
    ops::adamw_step(a);
    const Vec g = to_f64(grads[step - 1]);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * gs;
      p[i] -= static_cast<double>(lr) * wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * gi;
      v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
      const double mh = m[i] / (1.0 - std::pow(static_cast<double>(b1), step));
      const double vh = v[i] / (1.0 - std::pow(static_cast<double>(b2), step));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  check_close(a.param, p, kFwdTol, "param");
  check_close(a.m, m, kFwdTol, "m");
  check_close(a.v, v, kFwdTol, "v");
  for (int64_t i = 0; i < n; ++i)
    CHECK(a.param_lowp.data<uint16_t>()[i] == f32_to_bf16(a.param.data<float>()[i]));
}

// The optimizer makes one call over its whole range with one segment per
// parameter: it must give the bits of one call per parameter (what it did
// before), and leave elements outside every segment untouched.
TEST_CASE("adamw: one call with segments gives the bits of one call per segment") {
  const int64_t n = 3 * 4096 + 77;
  // Chunk-straddling segments, tiny ones, a gap [9000, 9003), decay on and off.
  const int64_t rows[][3] = {{0, 5, 0}, {5, 4100, 1}, {4100, 4101, 0}, {4101, 9000, 1}, {9003, n, 0}};
  const int64_t S = int64_t(sizeof(rows) / sizeof(rows[0]));
  Tensor seg = Tensor::empty({S, 3}, DType::I64);
  std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
  for (uint64_t sr : {uint64_t{0}, uint64_t{12345}}) {
    AdamWArgs a;
    a.param = randn({n}, 130);
    a.grad = randn({n}, 131);
    a.m = randn({n}, 132, 0.01f);
    a.v = Tensor::zeros({n}, DType::F32);
    a.param_lowp = Tensor::zeros({n}, DType::BF16);
    a.lr = 1e-2f, a.weight_decay = 0.1f, a.grad_scale = 0.7f, a.step = 3, a.sr_seed = sr;
    AdamWArgs whole = a;
    whole.param = a.param.clone(), whole.m = a.m.clone(), whole.v = a.v.clone();
    whole.param_lowp = a.param_lowp.clone();
    whole.segments = seg;
    ops::adamw_step(whole);
    Tensor p = a.param.clone(), m = a.m.clone(), v = a.v.clone(), lowp = a.param_lowp.clone();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t b = rows[s][0], e = rows[s][1];
      AdamWArgs one = a;
      one.param = p.view(b, {e - b}), one.grad = a.grad.view(b, {e - b});
      one.m = m.view(b, {e - b}), one.v = v.view(b, {e - b});
      one.param_lowp = Tensor::zeros({e - b}, DType::BF16);
      one.weight_decay = rows[s][2] ? a.weight_decay : 0.f;
      one.sr_seed = 0;  // stochastic rounding hashes the index in the whole call: checked below
      ops::adamw_step(one);
      if (sr == 0) lowp.view(b, {e - b}).copy_from(one.param_lowp);
    }
    INFO("sr_seed " << sr);
    CHECK(std::memcmp(whole.param.raw(), p.raw(), p.nbytes()) == 0);
    CHECK(std::memcmp(whole.m.raw(), m.raw(), m.nbytes()) == 0);
    CHECK(std::memcmp(whole.v.raw(), v.raw(), v.nbytes()) == 0);
    if (sr == 0) CHECK(std::memcmp(whole.param_lowp.raw(), lowp.raw(), lowp.nbytes()) == 0);
    for (int64_t i = 9000; i < 9003; ++i) {  // the gap
      CHECK(whole.param.data<float>()[i] == a.param.data<float>()[i]);
      CHECK(whole.param_lowp.data<uint16_t>()[i] == 0);
    }
  }
}

TEST_CASE("sum_squares accumulates in double and is thread-count independent") {
  const int64_t n = 5 * 4096 + 17;
  const Tensor x = randn({n}, 130);
  double want = 1.5;
  for (double v : to_f64(x)) want += v * v;
  Tensor out1 = full({1}, 1.5f), out3 = full({1}, 1.5f);
  with_threads(1, [&] { ops::sum_squares(SumSquaresArgs{out1, x}); });
  with_threads(3, [&] { ops::sum_squares(SumSquaresArgs{out3, x}); });
  CHECK(std::fabs(out1.data<float>()[0] - want) / want < 1e-6);
  CHECK(bit_equal(out1, out3));
}

TEST_CASE("nonfinite_check sets but never clears the flag") {
  Tensor x = randn({1000}, 140);
  Tensor flag = full({1}, 0.f);
  ops::nonfinite_check(NonFiniteArgs{flag, x});
  CHECK(flag.data<float>()[0] == 0.f);
  x.data<float>()[777] = std::numeric_limits<float>::infinity();
  ops::nonfinite_check(NonFiniteArgs{flag, x});
  CHECK(flag.data<float>()[0] == 1.f);
  x.data<float>()[777] = 0.f;
  ops::nonfinite_check(NonFiniteArgs{flag, x});
  CHECK(flag.data<float>()[0] == 1.f);
  flag.data<float>()[0] = 0.f;
  x.data<float>()[3] = std::nanf("");
  ops::nonfinite_check(NonFiniteArgs{flag, x});
  CHECK(flag.data<float>()[0] == 1.f);
}

TEST_CASE("masked_mean adds the weighted mean of the losses whose target is not ignored") {
  const int64_t n = 1001;
  Tensor losses = randn({n}, 160, 2.0);
  std::vector<int32_t> tgt(n);
  for (int64_t i = 0; i < n; ++i) tgt[i] = i % 7 == 3 ? -1 : i % 11 == 5 ? -100 : static_cast<int32_t>(i % 50);
  const Tensor targets = tokens_tensor({n}, tgt);
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (tgt[i] >= 0) sum += losses.data<float>()[i], ++count;
  REQUIRE(count > 0);
  REQUIRE(count < n);
  Tensor out = full({1}, 1.5f);
  ops::masked_mean(MaskedMeanArgs{.out = out, .losses = losses, .targets = targets, .weight = 0.25f});
  const double want = 1.5 + 0.25 * (sum / static_cast<double>(count));
  CHECK(std::fabs(out.data<float>()[0] - want) <= 1e-6 * std::fabs(want));
  // Accumulates: a second call adds the same amount again.
  ops::masked_mean(MaskedMeanArgs{.out = out, .losses = losses, .targets = targets, .weight = 0.25f});
  CHECK(std::fabs(out.data<float>()[0] - (want + (want - 1.5))) <= 1e-6 * std::fabs(want));
  // Every target ignored: nothing is added (no 0/0).
  Tensor none = full({1}, 1.5f);
  ops::masked_mean(MaskedMeanArgs{.out = none, .losses = losses, .targets = tokens_tensor({n}, std::vector<int32_t>(n, -1)),
                                  .weight = 1.f});
  CHECK(none.data<float>()[0] == 1.5f);
  // Targets that do not match the losses are an error naming the tensor.
  CHECK_THROWS_WITH(ops::masked_mean(MaskedMeanArgs{.out = out, .losses = losses, .targets = tokens_tensor({3}, {0, 1, 2})}),
                    Catch::Contains("masked_mean") && Catch::Contains("targets"));
}

TEST_CASE("scale multiplies in place") {
  Tensor x = randn({4097}, 150);
  const Vec x0 = to_f64(x);
  ops::scale(ScaleArgs{x, 0.25f});
  Vec want(x0);
  for (double& v : want) v *= 0.25;
  check_close(x, want, 0.0, "scale by a power of two is exact");
}

TEST_CASE("cast between f32, bf16, f16 and i32 copies") {
  const Tensor x = randn({3, 11}, 160, 10.0);
  Tensor b = Tensor::empty({33}, DType::BF16), h = Tensor::empty({33}, DType::F16);
  ops::cast(CastArgs{b, x});
  ops::cast(CastArgs{h, x});
  Tensor back = Tensor::empty({3, 11}, DType::F32), hb = Tensor::empty({33}, DType::BF16);
  ops::cast(CastArgs{back, b});
  ops::cast(CastArgs{hb, h});
  for (int64_t i = 0; i < 33; ++i) {
    const float v = x.data<float>()[i];
    CHECK(b.data<uint16_t>()[i] == f32_to_bf16(v));
    CHECK(h.data<uint16_t>()[i] == f32_to_f16(v));
    CHECK(back.data<float>()[i] == bf16_to_f32(f32_to_bf16(v)));
    CHECK(hb.data<uint16_t>()[i] == f32_to_bf16(f16_to_f32(f32_to_f16(v))));
  }
  const Tensor t = tokens_tensor({4}, {1, -2, 3, 40000});
  Tensor t2 = Tensor::empty({2, 2}, DType::I32);
  ops::cast(CastArgs{t2, t});
  CHECK(bit_equal(t, t2));
  REQUIRE_THROWS(ops::cast(CastArgs{Tensor::empty({4}, DType::F32), t}));
  REQUIRE_THROWS(ops::cast(CastArgs{Tensor::empty({5}, DType::BF16), x}));
}

TEST_CASE("1-bit pack, server sum and unpack: hand-computed bits and values") {
  // pack: 16 values, sum of squares given; bits MSB first, 0 counts as +.
  const float v[16] = {1.f, -2.f, 0.f, 3.f, -0.5f, 0.25f, -1.f, 4.f, -3.f, -3.f, 2.f, 2.f, 0.f, -0.f, 1.f, -1.f};
  Tensor x = Tensor::empty({16}, DType::F32);
  std::memcpy(x.data<float>(), v, sizeof(v));
  Tensor sumsq = Tensor::empty({1}, DType::F32);
  sumsq.data<float>()[0] = 64.f;  // scale = sqrt(64) / sqrt(16) = 2
  Tensor bits = Tensor::empty({2}, DType::U8), scale = Tensor::empty({1}, DType::F32);
  ops::onebit_pack({.bits = bits, .scale = scale, .x = x, .sumsq = sumsq});
  CHECK(scale.data<float>()[0] == 2.f);
  CHECK(bits.data<uint8_t>()[0] == 0b10110101);
  CHECK(bits.data<uint8_t>()[1] == 0b00111110);  // -0 counts as + (not negative)
  const float err[16] = {-1.f, 0.f, -2.f, 1.f, 1.5f, -1.75f, 1.f, 2.f, -1.f, -1.f, 0.f, 0.f, -2.f, -2.f, -1.f, 1.f};
  for (int i = 0; i < 16; ++i) CHECK(x.data<float>()[i] == err[i]);
  // server: two ranks' signs of an 8-element chunk, scales 4 and 2 (each / 2).
  Tensor acc = Tensor::zeros({8}, DType::F32), rows = Tensor::empty({2, 1}, DType::U8),
         scales = Tensor::empty({2}, DType::F32);
  acc.data<float>()[0] = 0.5f;
  rows.data<uint8_t>()[0] = 0b11110000;
  rows.data<uint8_t>()[1] = 0b10101010;
  scales.data<float>()[0] = 4.f;
  scales.data<float>()[1] = 2.f;
  ops::onebit_server({.x = acc, .bits = rows, .scales = scales});
  const float want[8] = {3.5f, 1.f, 3.f, 1.f, -1.f, -3.f, -1.f, -3.f};
  for (int k = 0; k < 8; ++k) CHECK(acc.data<float>()[k] == want[k]);
  // unpack: 11 elements, chunks of 8 with their own scales.
  Tensor out = Tensor::empty({11}, DType::F32);
  ops::onebit_unpack({.out = out, .bits = rows.view(0, {2}), .scales = scales, .chunk = 8});
  const float un[11] = {4.f, 4.f, 4.f, 4.f, -4.f, -4.f, -4.f, -4.f, 2.f, -2.f, 2.f};
  for (int i = 0; i < 11; ++i) CHECK(out.data<float>()[i] == un[i]);
  // A length that is not a multiple of 8 is refused.
  CHECK_THROWS_WITH(ops::onebit_pack({.bits = bits, .scale = scale, .x = x.view(0, {12}), .sumsq = sumsq}),
                    Catch::Contains("onebit_pack: x has 12 elements, not a multiple of 8"));
}
