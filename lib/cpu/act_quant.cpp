// act_quantize on the CPU (lib/ops/op_args.h, ActQuantArgs): PyTorch's
// elementwise rounding reproduced per storage dtype.
#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/error.h"
#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

struct F32 {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static float load(T v) { return bf16_to_f32(v); }
  static T store(float v) { return f32_to_bf16(v); }
};
struct F16 {
  using T = uint16_t;
  static float load(T v) { return f16_to_f32(v); }
  static T store(float v) { return f32_to_f16(v); }
};

// One elementwise result as PyTorch writes it: computed in f32, stored in D.
template <class D> float rnd(float v) { return D::load(D::store(v)); }
float round_even(float v) { return std::nearbyint(v); }  // the default rounding mode: half to even

template <class D> void extremes(const typename D::T* x, int64_t n, float& lo, float& hi) {
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
#pragma omp parallel for reduction(min : mn) reduction(max : mx) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = D::load(x[i]);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  lo = mn, hi = mx;
}

// The static path: scale and zero point are 0-dim f32 tensors upstream,
// computed in f32; an elementwise op with x first converts them to x's dtype
// (PyTorch's common dtype), then computes in f32 and rounds.
template <class D> void quantize_static(typename D::T* x, int64_t n, float lo, float hi, int bits, bool sym) {
  const float q = static_cast<float>(int64_t{1} << bits);
  if (sym) {
    const float scale = rnd<D>(2.f * std::max(std::fabs(lo), hi) / q);
    const float top = q / 2 - 1, bottom = -q / 2;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float t = std::clamp(round_even(rnd<D>(D::load(x[i]) / scale)), bottom, top);
      x[i] = D::store(t * scale);
    }
    return;
  }
  const float scale32 = (hi - lo) / q;
  const float scale = rnd<D>(scale32), zp = rnd<D>(round_even(lo / scale32) * scale32);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float t = std::clamp(round_even(rnd<D>(rnd<D>(D::load(x[i]) - zp) / scale)), 0.f, q - 1);
    x[i] = D::store(rnd<D>(t * scale) + zp);
  }
}

// The dynamic path: each row's scale (and zero point) in D.
template <class D> void quantize_rows(typename D::T* x, int64_t rows, int64_t C, int bits, bool sym) {
  const float q = static_cast<float>(int64_t{1} << bits);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    typename D::T* row = x + r * C;
    float lo = std::numeric_limits<float>::infinity(), hi = -lo, amax = 0.f;
    for (int64_t c = 0; c < C; ++c) {
      const float v = D::load(row[c]);
      lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
    }
    if (sym) {
      const float scale = rnd<D>(rnd<D>(2.f * amax) / q);
      for (int64_t c = 0; c < C; ++c) {
        const float t = std::clamp(round_even(rnd<D>(D::load(row[c]) / scale)), -q / 2, q / 2 - 1);
        row[c] = D::store(t * scale);
      }
      continue;
    }
    const float scale = rnd<D>(rnd<D>(hi - lo) / q);
    const float zp = rnd<D>(round_even(rnd<D>(lo / scale)) * scale);
    for (int64_t c = 0; c < C; ++c) {
      const float t = std::clamp(round_even(rnd<D>(rnd<D>(D::load(row[c]) - zp) / scale)), 0.f, q - 1);
      row[c] = D::store(rnd<D>(t * scale) + zp);
    }
  }
}

template <class D> void act_quantize_as(const ActQuantArgs& a) {
  auto* x = static_cast<typename D::T*>(a.x.raw());
  const int64_t n = a.x.numel();
  if (n == 0) return;
  if (!a.range.defined()) {
    const int64_t C = a.x.size(a.x.dim() - 1);
    quantize_rows<D>(x, n / C, C, a.bits, a.symmetric);
    return;
  }
  float* r = a.range.data<float>();
  if (a.update) {
    float lo = 0, hi = 0;
    extremes<D>(x, n, lo, hi);
    if (r[0] == r[1]) r[0] = lo, r[1] = hi;
    // x_min * (1 - momentum): the Python float meets a 0-dim tensor of x's
    // dtype and is converted to that dtype first.
    const float m = static_cast<float>(a.momentum), c = rnd<D>(static_cast<float>(1.0 - a.momentum));
    r[0] = r[0] * m + rnd<D>(lo * c);
    r[1] = r[1] * m + rnd<D>(hi * c);
  }
  quantize_static<D>(x, n, r[0], r[1], a.bits, a.symmetric);
}

}  // namespace

void act_quantize(const ActQuantArgs& a, const Stream&) {
  const char* op = "act_quantize";
  DS_CHECK(a.bits >= 1 && a.bits <= 16, "{}: {} bits", op, a.bits);
  DS_CHECK(!a.range.defined() || (a.range.dtype() == DType::F32 && a.range.numel() == 2),
           "{}: the range must be a (2) f32 tensor", op);
  switch (a.x.dtype()) {
    case DType::F32: return act_quantize_as<F32>(a);
    case DType::BF16: return act_quantize_as<BF16>(a);
    case DType::F16: return act_quantize_as<F16>(a);
    default: DS_THROW("{}: x is {}", op, dtype_name(a.x.dtype()));
  }
}

}  // namespace ds::cpu
