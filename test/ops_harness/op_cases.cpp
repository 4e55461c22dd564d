// Shared OpCase builders (op_cases.h): norms and matmul with their double
// references and finite-difference losses.
#include "test/ops_harness/op_cases.h"

#include <cmath>

#include "test/ops_harness/op_test_util.h"

namespace ds::test {

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

Vec ref_matmul(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C, int64_t OC) {
  Vec out(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

namespace {

int64_t channels(const Tensor& weight) { return weight.numel(); }

// The gradient grads of a backward case: dinp per `accum`, the others += `calls` times.
FdGrad input_grad(const std::string& grad, const std::string& input, Accum accum, int calls) {
  return accum == Accum::Add ? FdGrad{grad, input, double(calls), true} : FdGrad{grad, input, 1, false};
}

}  // namespace

OpCase layernorm_forward_case(const LayerNormArgs& a) {
  OpCase c = make_case("layernorm_forward", a, ops::layernorm_forward);
  const int64_t C = channels(a.weight), N = a.inp.numel() / C;
  const double eps = a.eps;
  c.reference = [N, C, eps](const VecMap& in) {
    const NormRef r = ref_layernorm(in.at("inp"), in.at("weight"), in.at("bias"), N, C, eps);
    return VecMap{{"out", r.out}, {"mean", r.mean}, {"rstd", r.rstd}};
  };
  return c;
}

OpCase rmsnorm_forward_case(const RMSNormArgs& a) {
  OpCase c = make_case("rmsnorm_forward", a, ops::rmsnorm_forward);
  const int64_t C = channels(a.weight), N = a.inp.numel() / C;
  const double eps = a.eps;
  c.reference = [N, C, eps](const VecMap& in) {
    const NormRef r = ref_rmsnorm(in.at("inp"), in.at("weight"), N, C, eps);
    return VecMap{{"out", r.out}, {"rstd", r.rstd}};
  };
  return c;
}

OpCase matmul_forward_case(const MatmulArgs& a) {
  OpCase c = make_case(a.bias.defined() ? "matmul_forward (bias)" : "matmul_forward", a,
                       ops::matmul_forward);
  const int64_t OC = a.weight.size(0), C = a.weight.size(1), N = a.inp.numel() / C;
  const bool bias = a.bias.defined();
  c.reference = [N, C, OC, bias](const VecMap& in) {
    return VecMap{{"out", ref_matmul(in.at("inp"), in.at("weight"), bias ? &in.at("bias") : nullptr,
                                     N, C, OC)}};
  };
  return c;
}

OpCase layernorm_backward_case(const LayerNormBwdArgs& a, const Tensor& bias, float eps, int calls) {
  OpCase c = make_case("layernorm_backward x" + std::to_string(calls), a, ops::layernorm_backward);
  set_kind(c, {"mean", "rstd"}, Kind::F32);
  repeat(c, calls);
  const int64_t C = channels(a.weight), N = a.inp.numel() / C;
  c.extra["bias"] = to_f64(bias);
  c.loss = [N, C, eps](const VecMap& in) {
    return dot(ref_layernorm(in.at("inp"), in.at("weight"), in.at("bias"), N, C, eps).out,
               in.at("dout"));
  };
  if (a.dinp.defined()) c.grads.push_back(input_grad("dinp", "inp", a.accum, calls));
  c.grads.push_back({"dweight", "weight", double(calls), true});
  c.grads.push_back({"dbias", "bias", double(calls), true});
  return c;
}

OpCase rmsnorm_backward_case(const RMSNormBwdArgs& a, float eps, int calls) {
  OpCase c = make_case("rmsnorm_backward x" + std::to_string(calls), a, ops::rmsnorm_backward);
  set_kind(c, {"rstd"}, Kind::F32);
  repeat(c, calls);
  const int64_t C = channels(a.weight), N = a.inp.numel() / C;
  c.loss = [N, C, eps](const VecMap& in) {
    return dot(ref_rmsnorm(in.at("inp"), in.at("weight"), N, C, eps).out, in.at("dout"));
  };
  if (a.dinp.defined()) c.grads.push_back(input_grad("dinp", "inp", a.accum, calls));
  c.grads.push_back({"dweight", "weight", double(calls), true});
  return c;
}

OpCase matmul_backward_case(const MatmulBwdArgs& a, const Tensor& bias, int calls) {
  OpCase c = make_case("matmul_backward x" + std::to_string(calls), a, ops::matmul_backward);
  repeat(c, calls);
  const int64_t OC = a.weight.size(0), C = a.weight.size(1), N = a.inp.numel() / C;
  c.extra["bias"] = to_f64(bias);
  c.loss = [N, C, OC](const VecMap& in) {
    return dot(ref_matmul(in.at("inp"), in.at("weight"), &in.at("bias"), N, C, OC), in.at("dout"));
  };
  if (a.dinp.defined()) c.grads.push_back(input_grad("dinp", "inp", a.accum, calls));
  c.grads.push_back({"dweight", "weight", double(calls), true});
  if (a.dbias.defined()) c.grads.push_back({"dbias", "bias", double(calls), true});
  return c;
}

// ---- random-LTD row copies ----------------------------------------------------

namespace {
// Calls f(full row, part row) for every (b, j) of the index.
template <class F>
void for_token_rows(const TokenRowsArgs& a, const VecMap& v, F&& f) {
  const int64_t B = a.full.size(0), T = a.full.size(1), R = a.index.size(1);
  const Vec& ix = v.at("index");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < R; ++j) f(b * T + static_cast<int64_t>(ix[b * R + j]), b * R + j);
}
}  // namespace

OpCase token_gather_case(const TokenRowsArgs& a) {
  OpCase c = make_case("token_gather", a, ops::token_gather);
  const int64_t C = a.full.size(2);
  c.reference = [a, C](const VecMap& v) {
    Vec part(v.at("part").size(), 0.0);
    const Vec& full = v.at("full");
    for_token_rows(a, v, [&](int64_t f, int64_t p) {
      for (int64_t i = 0; i < C; ++i) part[p * C + i] = full[f * C + i];
    });
    return VecMap{{"part", part}, {"full", full}};
  };
  c.ref_tol = 0;
  return c;
}

OpCase token_scatter_case(const TokenRowsArgs& a) {
  OpCase c = make_case("token_scatter", a, ops::token_scatter);
  const int64_t C = a.full.size(2);
  c.reference = [a, C](const VecMap& v) {
    Vec full = v.at("full");
    const Vec& part = v.at("part");
    for_token_rows(a, v, [&](int64_t f, int64_t p) {
      for (int64_t i = 0; i < C; ++i) full[f * C + i] = part[p * C + i];
    });
    return VecMap{{"full", full}, {"part", part}};
  };
  c.ref_tol = 0;
  return c;
}

}  // namespace ds::test
