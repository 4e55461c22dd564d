// Naive double references of causal (grouped-query) attention on a packed
// qkv buffer, forward and backward, shared by the CPU op tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "test/ops_harness/op_test_util.h"

namespace ds::test {

struct AttnShape {
  int64_t B, T, NH, HS;
  int64_t NKV = 0;  // kv heads; 0: NH
  // Right padding (AttentionArgs::lengths): sample b's queries see keys
  // [0, min(t + 1, len[b])); empty: plain causal.
  std::vector<int32_t> len = {};
  int64_t visible(int64_t b, int64_t t) const { return len.empty() ? t + 1 : std::min<int64_t>(t + 1, len[b]); }
  int64_t kv() const { return NKV == 0 ? NH : NKV; }
  int64_t width() const { return (NH + 2 * kv()) * HS; }  // packed qkv row
  // Column of head h of part 0 (q), 1 (k) or 2 (v; h a kv head) in a row.
  int64_t col(int64_t part, int64_t h) const { return (part == 0 ? h : NH + (part - 1) * kv() + h) * HS; }
};

// Naive causal attention in double; fills lse (B, NH, T) if given. Query
// head h reads kv head h / (NH / NKV).
Vec ref_attention(const Vec& qkv, const AttnShape& s, Vec* lse) {
  const int64_t C = s.NH * s.HS, C3 = s.width(), G = s.NH / s.kv();
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  Vec out(s.B * s.T * C, 0.0), p(s.T);
  if (lse) lse->assign(s.B * s.NH * s.T, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.NH; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const double* q = qkv.data() + (b * s.T + t) * C3 + s.col(0, h);
        double mx = -1e300, sum = 0;
        const int64_t nv = s.visible(b, t);
        for (int64_t j = 0; j < nv; ++j) {
          const double* k = qkv.data() + (b * s.T + j) * C3 + s.col(1, h / G);
          double d = 0;
          for (int64_t e = 0; e < s.HS; ++e) d += q[e] * k[e];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < nv; ++j) sum += (p[j] = std::exp(p[j] - mx));
        if (lse) (*lse)[(b * s.NH + h) * s.T + t] = mx + std::log(sum);
        double* o = out.data() + (b * s.T + t) * C + h * s.HS;
        for (int64_t j = 0; j < nv; ++j) {
          const double* v = qkv.data() + (b * s.T + j) * C3 + s.col(2, h / G);
          for (int64_t e = 0; e < s.HS; ++e) o[e] += p[j] / sum * v[e];
        }
      }
  return out;
}

// Naive double backward of ref_attention (materialised probabilities).
Vec ref_attention_backward(const Vec& qkv, const Vec& dout, const AttnShape& s) {
  const int64_t C = s.NH * s.HS, C3 = s.width(), G = s.NH / s.kv();
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  Vec lse;
  ref_attention(qkv, s, &lse);
  Vec dqkv(qkv.size(), 0.0), p(s.T), dp(s.T);
  // Offset of (b, t, part in {q, k, v}, query head h) in the packed layout.
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h) {
    return (b * s.T + t) * C3 + s.col(part, part == 0 ? h : h / G);
  };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.NH; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const double* q = qkv.data() + at(b, t, 0, h);
        const double* dO = dout.data() + (b * s.T + t) * C + h * s.HS;
        double D = 0;
        const int64_t nv = s.visible(b, t);
        for (int64_t j = 0; j < nv; ++j) {
          const double* k = qkv.data() + at(b, j, 1, h);
          const double* v = qkv.data() + at(b, j, 2, h);
          double d = 0, g = 0;
          for (int64_t e = 0; e < s.HS; ++e) d += q[e] * k[e], g += dO[e] * v[e];
          p[j] = std::exp(d * scale - lse[(b * s.NH + h) * s.T + t]);
          dp[j] = g;
          D += p[j] * g;
        }
        for (int64_t j = 0; j < nv; ++j) {
          const double ds = p[j] * (dp[j] - D) * scale;
          double* dq = dqkv.data() + at(b, t, 0, h);
          double* dk = dqkv.data() + at(b, j, 1, h);
          double* dv = dqkv.data() + at(b, j, 2, h);
          const double* k = qkv.data() + at(b, j, 1, h);
          for (int64_t e = 0; e < s.HS; ++e) {
            dq[e] += ds * k[e];
            dk[e] += ds * q[e];
            dv[e] += p[j] * dO[e];
          }
        }
      }
  return dqkv;
}

}  // namespace ds::test
