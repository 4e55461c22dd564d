// Exact LayerNorm (mean, rstd) and RMSNorm (rms_rstd) statistics of f32 rows,
// computed in double on the host: the saved statistics the GPU norm backward
// cases feed to both the CUDA and the CPU op (eps 1e-5, as the model uses).
#pragma once
#include <cmath>

#include "lib/core/tensor.h"

namespace ds::test {

inline void norm_stats(const Tensor& inp, Tensor& mean, Tensor& rstd, Tensor& rms_rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  mean = Tensor::empty({N}, DType::F32);
  rstd = Tensor::empty({N}, DType::F32);
  rms_rstd = Tensor::empty({N}, DType::F32);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp.data<float>() + n * C;
    double s = 0, v = 0, ss = 0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    for (int64_t c = 0; c < C; ++c) {
      v += (x[c] - m) * (x[c] - m);
      ss += double(x[c]) * x[c];
    }
    mean.data<float>()[n] = float(m);
    rstd.data<float>()[n] = float(1.0 / std::sqrt(v / C + 1e-5));
    rms_rstd.data<float>()[n] = float(1.0 / std::sqrt(ss / C + 1e-5));
  }
}

}  // namespace ds::test
