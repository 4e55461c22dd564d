// Dropout op cases and the attention-dropout double reference (dropout_cases.h).
#include "test/ops_harness/dropout_cases.h"

#include <algorithm>
#include <cmath>

#include "lib/ops/ops.h"
#include "test/ops_harness/op_test_util.h"

namespace ds::test {

double hidden_factor(const DropoutSpec& d, int64_t b, int64_t t, int64_t c) {
  if (d.p == 0.f) return 1.0;
  const uint64_t row = dropout_hidden_row(d.stream, d.sample0 + b, d.pos0 + t);
  return dropout_keep(row, c, dropout_threshold(d.p)) ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0;
}

double attn_factor(const DropoutSpec& d, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (d.p == 0.f) return 1.0;
  const uint64_t row = dropout_attn_row(d.stream, d.sample0 + b, d.head0 + h, i);
  return dropout_keep(row, j, dropout_threshold(d.p)) ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0;
}

namespace {

// mask(x) over a (B, T, C) buffer in double.
Vec apply_mask(const Vec& x, const Shape& s, const DropoutSpec& d) {
  Vec y(x.size());
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t t = 0; t < s[1]; ++t)
      for (int64_t c = 0; c < s[2]; ++c) {
        const int64_t i = (b * s[1] + t) * s[2] + c;
        y[i] = x[i] * hidden_factor(d, b, t, c);
      }
  return y;
}

}  // namespace

OpCase dropout_forward_case(const DropoutArgs& a) {
  OpCase c = make_case("dropout_forward", a, ops::dropout_forward);
  const Shape s = a.inp.shape();
  const DropoutSpec d = a.dropout;
  const bool res = a.residual.defined();
  c.reference = [s, d, res](const VecMap& v) {
    Vec y = apply_mask(v.at("inp"), s, d);
    if (res) y = add_vec(y, v.at("residual"));
    return VecMap{{"out", y}};
  };
  return c;
}

OpCase dropout_backward_case(const DropoutArgs& a, const Tensor& x) {
  OpCase c = make_case("dropout_backward", a, ops::dropout_backward);
  const Shape s = a.inp.shape();
  const DropoutSpec d = a.dropout;
  c.extra["x"] = to_f64(x);
  c.loss = [s, d](const VecMap& v) { return dot(v.at("inp"), apply_mask(v.at("x"), s, d)); };
  c.grads = {FdGrad{.grad = "out", .input = "x"}};
  // The loss is linear in x: central differences are exact up to rounding.
  c.fd_tol = 1e-6;
  return c;
}

Vec ref_attention_dropout(const Vec& qkv, int64_t B, int64_t T, int64_t NH, int64_t HS, const DropoutSpec& d,
                          Vec* lse) {
  const int64_t C = NH * HS, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  Vec out(B * T * C, 0.0), p(T);
  if (lse) lse->assign(B * NH * T, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = qkv.data() + (b * T + t) * C3 + h * HS;
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = qkv.data() + (b * T + j) * C3 + C + h * HS;
          double s = 0;
          for (int64_t e = 0; e < HS; ++e) s += q[e] * k[e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        if (lse) (*lse)[(b * NH + h) * T + t] = mx + std::log(sum);
        double* o = out.data() + (b * T + t) * C + h * HS;
        for (int64_t j = 0; j <= t; ++j) {
          const double w = p[j] / sum * attn_factor(d, b, h, t, j);
          const double* v = qkv.data() + (b * T + j) * C3 + 2 * C + h * HS;
          for (int64_t e = 0; e < HS; ++e) o[e] += w * v[e];
        }
      }
  return out;
}

}  // namespace ds::test
