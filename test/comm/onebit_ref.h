// A reference of the 1-bit all-reduce (lib/optim/onebit_exchange.h) written from its
// formulas: every rank's error buffers of one tensor, and one exchange of
// all ranks' inputs computed in this process. The communication tests and
// the 1-bit optimizers' simulation check the real exchange against it.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "lib/optim/onebit_exchange.h"

namespace ds::test {

struct OneBitSim {
  int W;
  int64_t n, np;
  std::vector<std::vector<float>> worker, server;  // per rank: n' and n' / W elements
  OneBitSim(int w, int64_t n_) : W(w), n(n_), np(onebit_padded_size(n_, w)) { reset(); }
  void reset() {
    worker.assign(W, std::vector<float>(np, 0.f));
    server.assign(W, std::vector<float>(np / W, 0.f));
  }
  static float scale_of(const std::vector<float>& v) {
    double s = 0;
    for (float a : v) s += static_cast<double>(a) * a;
    return static_cast<float>(std::sqrt(s) / std::sqrt(static_cast<double>(v.size())));
  }
  static float sgn(float v) { return v < 0.f ? -1.f : 1.f; }
  // x[r]: rank r's n inputs; returns the result every rank receives.
  std::vector<float> reduce(const std::vector<std::vector<float>>& x) {
    const int64_t chunk = np / W;
    std::vector<std::vector<float>> signs(W, std::vector<float>(np));
    std::vector<float> scale(W);
    for (int r = 0; r < W; ++r) {
      std::vector<float> b(np);
      for (int64_t i = 0; i < np; ++i) b[i] = (i < n ? x[r][i] : 0.f) + worker[r][i];
      scale[r] = scale_of(b);
      for (int64_t i = 0; i < np; ++i) {
        signs[r][i] = sgn(b[i]);
        worker[r][i] = b[i] - scale[r] * signs[r][i];
      }
    }
    std::vector<float> out(n);
    for (int j = 0; j < W; ++j) {  // server j: chunk j
      std::vector<float> c(chunk);
      for (int64_t k = 0; k < chunk; ++k) {
        float acc = 0.f;
        for (int r = 0; r < W; ++r) acc += signs[r][j * chunk + k] * (scale[r] * (1.f / static_cast<float>(W)));
        c[k] = acc + server[j][k];
      }
      const float t = scale_of(c);
      for (int64_t k = 0; k < chunk; ++k) {
        const float sg = sgn(c[k]);
        server[j][k] = c[k] - t * sg;
        if (j * chunk + k < n) out[j * chunk + k] = t * sg;
      }
    }
    return out;
  }
};

}  // namespace ds::test
