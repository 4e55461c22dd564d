// Pointwise ops on the CPU: GELU (tanh approximation, as GPT-2), ReLU (OPT), SwiGLU,
// rotary position embedding (rotate-half pairs, q and k only) and add.
// Elementwise loops run in fixed-size chunks so the vector/scalar split of
// every element is the same for any thread count.
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

// tanh via one exponential (vectorisable); exact limits +-1 for large |u|.
inline float tanh_approx(float u) { return 1.f - 2.f / (1.f + fast_exp(2.f * u)); }
inline float sigmoid(float x) { return 1.f / (1.f + fast_exp(-x)); }

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

}  // namespace

namespace {

template <class T, class O>
void gelu_forward_impl(const T* inp, O* out, int64_t n) {  // (n) each
  parallel_chunks(n, [inp, out](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float x = load(inp[i]);
      const float u = kGeluScale * (x + kGeluCube * x * x * x);
      store(out + i, 0.5f * x * (1.f + tanh_approx(u)));
    }
  });
}

// dinp may be dout (in place).
template <class T>
void gelu_backward_impl(const T* inp, const T* dout, T* dinp, int64_t n) {  // (n) each
  parallel_chunks(n, [inp, dout, dinp](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float x = load(inp[i]);
      const float u = kGeluScale * (x + kGeluCube * x * x * x);
      const float th = tanh_approx(u);
      const float du = kGeluScale * (1.f + 3.f * kGeluCube * x * x);
      const float g = 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * du;
      store(dinp + i, load(dout[i]) * g);
    }
  });
}

}  // namespace

void gelu_forward(const GeluArgs& a, const Stream&) {
  gelu_forward_impl(a.inp.data<float>(), a.out.data<float>(), a.inp.numel());
}

void relu_forward(const GeluArgs& a, const Stream&) {
  const float* inp = a.inp.data<float>();
  float* out = a.out.data<float>();
  parallel_chunks(a.inp.numel(), [inp, out](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = inp[i] > 0.f ? inp[i] : 0.f;
  });
}

// dinp may be dout (in place).
void relu_backward(const GeluArgs& a, const Stream&) {
  const float *inp = a.inp.data<float>(), *dout = a.dout.data<float>();
  float* dinp = a.out.data<float>();
  parallel_chunks(a.inp.numel(), [inp, dout, dinp](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dinp[i] = inp[i] > 0.f ? dout[i] : 0.f;
  });
}

void gelu_backward(const GeluArgs& a, const Stream&) {
  gelu_backward_impl(a.inp.data<float>(), a.dout.data<float>(), a.out.data<float>(), a.inp.numel());
}

// bf16 as it is: the f32 kernel's arithmetic per element, bit-identical to the
// emulation without its copies.
bool lowp::gelu_forward(const GeluArgs& a, const Stream&) {
  if (!all_bf16({&a.inp, &a.out})) return false;
  gelu_forward_impl(a.inp.data<uint16_t>(), a.out.data<uint16_t>(), a.inp.numel());
  return true;
}

bool lowp::gelu_backward(const GeluArgs& a, const Stream&) {
  if (!all_bf16({&a.inp, &a.dout, &a.out})) return false;
  gelu_backward_impl(a.inp.data<uint16_t>(), a.dout.data<uint16_t>(), a.out.data<uint16_t>(), a.inp.numel());
  return true;
}

void swiglu_forward(const SwigluArgs& a, const Stream&) {
  const int64_t F = a.out.dim() ? a.out.size(-1) : 1, N = rows_of(a.out);
  const float* inp = a.inp.data<float>();  // (N, 2F)
  float* out = a.out.data<float>();        // (N, F)
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    float* o = out + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) o[f] = g[f] * sigmoid(g[f]) * u[f];
  }
}

void swiglu_backward(const SwigluBwdArgs& a, const Stream&) {
  const int64_t F = a.dout.dim() ? a.dout.size(-1) : 1, N = rows_of(a.dout);
  const float* inp = a.inp.data<float>();    // (N, 2F)
  const float* dout = a.dout.data<float>();  // (N, F)
  float* dinp = a.dinp.data<float>();        // (N, 2F)
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    float* dg = dinp + n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float x = g[f], up = u[f], dy = d[f];
      const float sig = sigmoid(x);
      du[f] = dy * x * sig;
      dg[f] = dy * up * sig * (1.f + x * (1.f - sig));
    }
  }
}

namespace {

template <class T>
void add_impl(const T* x, const T* y, T* out, int64_t n) {  // (n) each; out may be x or y
  parallel_chunks(n, [x, y, out](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) store(out + i, load(x[i]) + load(y[i]));
  });
}

}  // namespace

void add(const AddArgs& a, const Stream&) {
  add_impl(a.a.data<float>(), a.b.data<float>(), a.out.data<float>(), a.out.numel());
}

bool lowp::add(const AddArgs& a, const Stream&) {
  if (!all_bf16({&a.a, &a.b, &a.out})) return false;
  add_impl(a.a.data<uint16_t>(), a.b.data<uint16_t>(), a.out.data<uint16_t>(), a.out.numel());
  return true;
}

// ---- RoPE ------------------------------------------------------------------

namespace {

enum class RopeDir { Forward, Inverse };

void rope_apply(const RopeArgs& a, RopeDir dir) {
  const int64_t B = a.inp.size(0), T = a.inp.size(1), W = a.inp.size(2);
  const int64_t NKV = a.NKV == 0 ? a.NH : a.NKV, HS = W / (a.NH + 2 * NKV);
  const int64_t R = a.rot_dims == 0 ? HS : a.rot_dims, half = R / 2;
  const int64_t nqk = a.NH + NKV;          // q heads then k heads
  const float* inp = a.inp.data<float>();  // (B, T, W)
  float* out = a.out.data<float>();        // (B, T, W)
  const float sgn = dir == RopeDir::Forward ? 1.f : -1.f;
  // cos/sin table for this call's positions, shared read-only by all threads.
  float* table = thread_scratch(static_cast<size_t>(T * 2 * half), 7);  // (T, 2, R/2)
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* cs = table + t * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(a.theta), -2.0 * i / R);
      const double ang = static_cast<double>(a.pos_offset + t) * inv_freq;
      cs[i] = static_cast<float>(std::cos(ang));
      cs[half + i] = sgn * static_cast<float>(std::sin(ang));
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < B * T; ++n) {
    const float* cs = table + (n % T) * 2 * half;
    const float* x = inp + n * W;
    float* y = out + n * W;
    for (int64_t h = 0; h < nqk; ++h) {
      const float* xh = x + h * HS;
      float* yh = y + h * HS;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        yh[i] = x1 * cs[i] - x2 * cs[half + i];
        yh[i + half] = x2 * cs[i] + x1 * cs[half + i];
      }
      if (y != x && R < HS) std::memcpy(yh + R, xh + R, (HS - R) * sizeof(float));
    }
    if (y != x) std::memcpy(y + nqk * HS, x + nqk * HS, NKV * HS * sizeof(float));
  }
}

}  // namespace

void rope_forward(const RopeArgs& a, const Stream&) {
  rope_apply(a, RopeDir::Forward);
}

void rope_backward(const RopeArgs& a, const Stream&) {
  rope_apply(a, RopeDir::Inverse);
}

}  // namespace ds::cpu
