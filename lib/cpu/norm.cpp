// LayerNorm and RMSNorm on the CPU, forward and backward.
// Row statistics are accumulated in double. Weight/bias gradients are reduced
// over rows in fixed 32-row chunks whose double partials are combined in chunk
// order, so results do not depend on the OpenMP thread count.
#include <cmath>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

constexpr int64_t kRowChunk = 32;

struct NormDims {
  int64_t N, C;
};

// (N, C) of inp; the shapes were validated by the op API.
NormDims norm_dims(const Tensor& x) { return {rows_of(x), x.size(-1)}; }

// dst[c] += sum over chunks k of part[k * C + c], chunks in order.
void reduce_partials(float* dst, const double* part, int64_t nchunks, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t k = 0; k < nchunks; ++k) s += part[k * C + c];
    dst[c] = static_cast<float>(dst[c] + s);
  }
}

}  // namespace

void layernorm_forward(const LayerNormArgs& a, const Stream&) {
  const char* op = "layernorm_forward";
  require_defined(a.bias, op, "bias");
  require_defined(a.mean, op, "mean");
  require_defined(a.rstd, op, "rstd");
  const NormDims d = norm_dims(a.inp);
  const float* inp = a.inp.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();  // (C)
  const float* bias = a.bias.data<float>();  // (C)
  float* out = a.out.data<float>();  // (N, C)
  float* mean = a.mean.data<float>();  // (N)
  float* rstd = a.rstd.data<float>();  // (N)
  const int64_t C = d.C;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) {
    const float* x = inp + n * C;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double v = 0.0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const double r = 1.0 / std::sqrt(v / C + a.eps);
    const float mf = static_cast<float>(m), rf = static_cast<float>(r);
    float* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - mf) * rf * w[c] + bias[c];
    mean[n] = mf;
    rstd[n] = rf;
  }
}

void layernorm_backward(const LayerNormBwdArgs& a, const Stream&) {
  const char* op = "layernorm_backward";
  require_defined(a.dinp, op, "dinp");
  require_defined(a.dweight, op, "dweight");
  require_defined(a.dbias, op, "dbias");
  const NormDims d = norm_dims(a.inp);
  const float* inp = a.inp.data<float>();    // (N, C)
  const float* dout = a.dout.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();   // (C)
  const float* mean = a.mean.data<float>();  // (N)
  const float* rstd = a.rstd.data<float>();  // (N)
  float* dinp = a.dinp.data<float>();        // (N, C)
  const int64_t C = d.C, nchunks = (d.N + kRowChunk - 1) / kRowChunk;
  const bool add = a.accum == Accum::Add;
  double* part = thread_scratch_f64(static_cast<size_t>(2 * nchunks * C));  // (2, nchunks, C)
  double* part_w = part;
  double* part_b = part + nchunks * C;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < nchunks; ++k) {
    double* pw = part_w + k * C;
    double* pb = part_b + k * C;
    for (int64_t c = 0; c < C; ++c) pw[c] = pb[c] = 0.0;
    for (int64_t n = k * kRowChunk; n < std::min(d.N, (k + 1) * kRowChunk); ++n) {
      const float* x = inp + n * C;
      const float* g = dout + n * C;
      const float m = mean[n], r = rstd[n];
      double sd = 0.0, sdn = 0.0;  // sum(dnorm), sum(dnorm * norm)
#pragma omp simd reduction(+ : sd, sdn)
      for (int64_t c = 0; c < C; ++c) {
        const float dn = g[c] * w[c];
        sd += dn;
        sdn += dn * ((x[c] - m) * r);
      }
      const float md = static_cast<float>(sd / C), mdn = static_cast<float>(sdn / C);
      float* di = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float nrm = (x[c] - m) * r;
        const float gc = g[c];
        pw[c] += gc * nrm;
        pb[c] += gc;
        const float v = r * (gc * w[c] - md - nrm * mdn);
        di[c] = add ? di[c] + v : v;
      }
    }
  }
  reduce_partials(a.dweight.data<float>(), part_w, nchunks, C);
  reduce_partials(a.dbias.data<float>(), part_b, nchunks, C);
}

void rmsnorm_forward(const RMSNormArgs& a, const Stream&) {
  const char* op = "rmsnorm_forward";
  require_defined(a.rstd, op, "rstd");
  const NormDims d = norm_dims(a.inp);
  const float* inp = a.inp.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();  // (C)
  float* out = a.out.data<float>();  // (N, C)
  float* rstd = a.rstd.data<float>();  // (N)
  const int64_t C = d.C;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.N; ++n) {
    const float* x = inp + n * C;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(s / C + a.eps));
    float* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

void rmsnorm_backward(const RMSNormBwdArgs& a, const Stream&) {
  const char* op = "rmsnorm_backward";
  require_defined(a.dinp, op, "dinp");
  require_defined(a.dweight, op, "dweight");
  const NormDims d = norm_dims(a.inp);
  const float* inp = a.inp.data<float>();    // (N, C)
  const float* dout = a.dout.data<float>();  // (N, C)
  const float* w = a.weight.data<float>();   // (C)
  const float* rstd = a.rstd.data<float>();  // (N)
  float* dinp = a.dinp.data<float>();        // (N, C)
  const int64_t C = d.C, nchunks = (d.N + kRowChunk - 1) / kRowChunk;
  const bool add = a.accum == Accum::Add;
  double* part_w = thread_scratch_f64(static_cast<size_t>(nchunks * C));  // (nchunks, C)
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < nchunks; ++k) {
    double* pw = part_w + k * C;
    for (int64_t c = 0; c < C; ++c) pw[c] = 0.0;
    for (int64_t n = k * kRowChunk; n < std::min(d.N, (k + 1) * kRowChunk); ++n) {
      const float* x = inp + n * C;
      const float* g = dout + n * C;
      const float r = rstd[n];
      double sdn = 0.0;  // sum(dnorm * norm)
#pragma omp simd reduction(+ : sdn)
      for (int64_t c = 0; c < C; ++c) sdn += g[c] * w[c] * (x[c] * r);
      const float mdn = static_cast<float>(sdn / C);
      float* di = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float nrm = x[c] * r;
        const float gc = g[c];
        pw[c] += gc * nrm;
        const float v = r * (gc * w[c] - nrm * mdn);
        di[c] = add ? di[c] + v : v;
      }
    }
  }
  reduce_partials(a.dweight.data<float>(), part_w, nchunks, C);
}

}  // namespace ds::cpu
