// OpCase builders of the Mixture-of-Experts ops (moe_cases.h).
#include "test/ops_harness/moe_cases.h"

#include <cfloat>
#include <cmath>

#include "test/ops_harness/op_test_util.h"

namespace ds::test {
namespace {

// Sizes of a case, read off its choice tensors and its expert buffer.
struct MoeDims {
  int64_t N, K, E, C, D;
};
MoeDims moe_dims(const Tensor& expert, const Tensor& buffer) {
  return {expert.size(0), expert.size(1), buffer.size(0), buffer.size(1), buffer.size(2)};
}

// Calls f(n, j, row) for every kept choice, row = expert * C + slot.
// Fields the op only reads although their role is Native (f32 by contract).
OpCase& read_only(OpCase& c, const std::vector<std::string>& names) {
  for (const std::string& n : names) c.fields.at(n).output = false;
  return c;
}

template <class F>
void for_kept(const VecMap& v, const MoeDims& d, F&& f) {
  const Vec& ex = v.at("expert");
  const Vec& sl = v.at("slot");
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t j = 0; j < d.K; ++j)
      if (sl[n * d.K + j] >= 0) f(n, j, int64_t(ex[n * d.K + j]) * d.C + int64_t(sl[n * d.K + j]));
}

}  // namespace

MoeGateArgs moe_gate_args(const Tensor& logits, int64_t K, int64_t capacity) {
  const int64_t N = logits.size(0), E = logits.size(1);
  return {.gates = Tensor::zeros({N, E}, DType::F32),
          .expert = Tensor::zeros({N, K}, DType::I32),
          .slot = Tensor::zeros({N, K}, DType::I32),
          .weight = Tensor::zeros({N, K}, DType::F32),
          .counts = Tensor::zeros({E}, DType::I32),
          .aux = Tensor::zeros({1}, DType::F32),
          .logits = logits,
          .capacity = capacity};
}

OpCase moe_gate_forward_case(const MoeGateArgs& a) {
  OpCase c = make_case("moe_gate_forward", a, ops::moe_gate_forward);
  return set_kind(c, {"logits"}, Kind::F32);
}

OpCase moe_gate_backward_case(const MoeGateBwdArgs& a, const Tensor& logits) {
  OpCase c = make_case("moe_gate_backward", a, ops::moe_gate_backward);
  read_only(set_kind(c, {"dlogits", "dweight", "gates"}, Kind::F32), {"dweight", "gates"});
  const int64_t N = a.gates.size(0), E = a.gates.size(1), K = a.expert.size(1);
  const double daux = a.daux;
  c.extra["logits"] = to_f64(logits);
  c.loss = [N, E, K, daux](const VecMap& v) {
    const Vec& l = v.at("logits");
    const Vec& ex = v.at("expert");
    const Vec& sl = v.at("slot");
    const Vec& r = v.at("dweight");
    Vec g(N * E), me(E, 0.0), ce(E, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double m = l[n * E], s = 0;
      for (int64_t e = 1; e < E; ++e) m = std::max(m, l[n * E + e]);
      for (int64_t e = 0; e < E; ++e) s += std::exp(l[n * E + e] - m);
      for (int64_t e = 0; e < E; ++e) g[n * E + e] = std::exp(l[n * E + e] - m) / s;
    }
    double loss = 0;
    for (int64_t n = 0; n < N; ++n) {
      double S = 0;
      for (int64_t j = 0; j < K; ++j) S += sl[n * K + j] >= 0 ? g[n * E + int64_t(ex[n * K + j])] : 0.0;
      const double denom = K == 1 ? 1.0 : std::max(S, double(FLT_EPSILON));
      for (int64_t j = 0; j < K; ++j)
        if (sl[n * K + j] >= 0) loss += r[n * K + j] * g[n * E + int64_t(ex[n * K + j])] / denom;
      for (int64_t j = 0; j < (K <= 2 ? 1 : K); ++j) ce[int64_t(ex[n * K + j])] += 1.0 / double(N);
      for (int64_t e = 0; e < E; ++e) me[e] += g[n * E + e] / double(N);
    }
    // DeepSpeed's l_aux: top-1 sum(me*ce)*E, top-2 mean(me*ce)*E*E, top-k mean(me*ce)*E*E/K.
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += me[e] * ce[e];
    const double mean = sum / double(E);
    const double aux = K == 1 ? sum * E : K == 2 ? mean * E * E : mean * E * E / double(K);
    return loss + daux * aux;
  };
  c.grads = {FdGrad{"dlogits", "logits"}};
  return c;
}

OpCase moe_dispatch_forward_case(const MoeDispatchArgs& a) {
  OpCase c = make_case("moe_dispatch_forward", a, ops::moe_dispatch_forward);
  const MoeDims d = moe_dims(a.expert, a.out);
  c.reference = [d](const VecMap& v) {
    Vec out(d.E * d.C * d.D, 0.0);
    const Vec& x = v.at("inp");
    for_kept(v, d, [&](int64_t n, int64_t, int64_t row) {
      for (int64_t i = 0; i < d.D; ++i) out[row * d.D + i] = x[n * d.D + i];
    });
    return VecMap{{"out", out}};
  };
  return c;
}

OpCase moe_dispatch_backward_case(const MoeDispatchBwdArgs& a, const Tensor& inp) {
  OpCase c = make_case("moe_dispatch_backward", a, ops::moe_dispatch_backward);
  const MoeDims d = moe_dims(a.expert, a.dout);
  c.extra["inp"] = to_f64(inp);
  c.loss = [d](const VecMap& v) {
    const Vec& x = v.at("inp");
    const Vec& g = v.at("dout");
    double loss = 0;
    for_kept(v, d, [&](int64_t n, int64_t, int64_t row) {
      for (int64_t i = 0; i < d.D; ++i) loss += g[row * d.D + i] * x[n * d.D + i];
    });
    return loss;
  };
  c.grads = {FdGrad{"dinp", "inp"}};
  return c;
}

namespace {

// out[n] = sum over kept choices of weight * inp[e, s].
Vec combine_ref(const VecMap& v, const MoeDims& d) {
  Vec out(d.N * d.D, 0.0);
  const Vec& y = v.at("inp");
  const Vec& w = v.at("weight");
  for_kept(v, d, [&](int64_t n, int64_t j, int64_t row) {
    for (int64_t i = 0; i < d.D; ++i) out[n * d.D + i] += w[n * d.K + j] * y[row * d.D + i];
  });
  return out;
}

}  // namespace

OpCase moe_combine_forward_case(const MoeCombineArgs& a) {
  OpCase c = make_case("moe_combine_forward", a, ops::moe_combine_forward);
  read_only(set_kind(c, {"weight"}, Kind::F32), {"weight"});
  const MoeDims d = moe_dims(a.expert, a.inp);
  c.reference = [d](const VecMap& v) { return VecMap{{"out", combine_ref(v, d)}}; };
  return c;
}

OpCase moe_combine_backward_case(const MoeCombineBwdArgs& a) {
  OpCase c = make_case("moe_combine_backward", a, ops::moe_combine_backward);
  read_only(set_kind(c, {"weight", "dweight"}, Kind::F32), {"weight"});
  const MoeDims d = moe_dims(a.expert, a.inp);
  c.loss = [d](const VecMap& v) { return dot(combine_ref(v, d), v.at("dout")); };
  c.grads = {FdGrad{"dinp", "inp"}, FdGrad{"dweight", "weight"}};
  return c;
}

namespace {

// out = c0 * moe + c1 * mlp, (c0, c1) = softmax(coef[n]), in double.
Vec mix_ref(const VecMap& v) {
  const Vec &moe = v.at("moe"), &mlp = v.at("mlp"), &coef = v.at("coef");
  const int64_t N = static_cast<int64_t>(coef.size()) / 2, D = static_cast<int64_t>(moe.size()) / N;
  Vec out(moe.size());
  for (int64_t n = 0; n < N; ++n) {
    const double c0 = 1.0 / (1.0 + std::exp(coef[2 * n + 1] - coef[2 * n]));
    for (int64_t d = 0; d < D; ++d) out[n * D + d] = c0 * moe[n * D + d] + (1.0 - c0) * mlp[n * D + d];
  }
  return out;
}

}  // namespace

OpCase moe_mix_forward_case(const MoeMixArgs& a) {
  OpCase c = make_case("moe_mix_forward", a, ops::moe_mix_forward);
  read_only(set_kind(c, {"coef"}, Kind::F32), {"coef"});
  c.reference = [](const VecMap& v) { return VecMap{{"out", mix_ref(v)}}; };
  return c;
}

OpCase moe_mix_backward_case(const MoeMixBwdArgs& a) {
  OpCase c = make_case("moe_mix_backward", a, ops::moe_mix_backward);
  read_only(set_kind(c, {"coef", "dcoef"}, Kind::F32), {"coef"});
  c.loss = [](const VecMap& v) { return dot(mix_ref(v), v.at("dout")); };
  c.grads = {FdGrad{"dmoe", "moe"}, FdGrad{"dmlp", "mlp"}, FdGrad{"dcoef", "coef"}};
  return c;
}

}  // namespace ds::test
