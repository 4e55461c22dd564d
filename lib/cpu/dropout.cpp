// Hidden dropout fused with the residual add, CPU forward and backward: the
// mask of row (b, t) is drawn from the hash of (sample0 + b, pos0 + t) and the
// channel (lib/ops/dropout_mask.h), so the backward redraws it instead of
// storing it. One row at a time, rows in parallel. A spec with a per-step key
// in memory (step_key) is resolved first.
#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

// out = residual + mask(inp) / (1 - p); residual may be null.
void dropout_rows(const DropoutArgs& a, const float* residual) {
  const int64_t B = a.inp.size(0), T = a.inp.size(1), C = a.inp.size(2);
  const DropoutSpec d = dropout_resolve(a.dropout);
  const uint32_t threshold = dropout_threshold(d.p);
  const float scale = dropout_scale(d.p);
  const float* x = a.inp.data<float>();
  float* y = a.out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < B * T; ++r) {
    const uint64_t row = dropout_hidden_row(d.stream, d.sample0 + r / T, d.pos0 + r % T);
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float* rr = residual ? residual + r * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const float v = xr[c] * dropout_factor(row, c, threshold, scale);
      yr[c] = rr ? rr[c] + v : v;
    }
  }
}

}  // namespace

void dropout_forward(const DropoutArgs& a, const Stream&) {
  dropout_rows(a, a.residual.defined() ? a.residual.data<float>() : nullptr);
}

void dropout_backward(const DropoutArgs& a, const Stream&) { dropout_rows(a, nullptr); }

}  // namespace ds::cpu
