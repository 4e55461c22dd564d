// Helpers of the CPU op tests (test/ops) and of the op-test harness
// (op_case.h): seeded random tensors, double copies, error metrics, central
// finite differences and bitwise comparison.
// Error metric: max |got - ref| / max |ref| over the whole tensor (so values
// near zero are judged against the tensor's scale, not their own).
#pragma once
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/rng.h"
#include "lib/core/tensor.h"
#include "lib/ops/ops.h"

namespace ds::test {

using Vec = std::vector<double>;

constexpr double kFwdTol = 1e-5;  // forward vs double reference
constexpr double kBwdTol = 1e-5;  // backward vs finite differences / double reference

// f32 tensor of N(0, 1) * scale values drawn from (seed, i).
inline Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale * normal_at(seed, 7, i));
  return t;
}

// A copy of host tensor t in dtype dt through the cast op (to bf16/f16:
// nearest even; to f32: exact).
inline Tensor to_dtype(const Tensor& t, DType dt) {
  CastArgs c;
  c.out = Tensor::empty(t.shape(), dt);
  c.inp = t;
  ops::cast(c);
  return c.out;
}

inline Tensor full(const Shape& shape, float v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

inline Tensor tokens_tensor(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::I32);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

// f32 or i32 (ids, slots, counts: compared as their values) host tensor in double.
inline Vec to_f64(const Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.dtype() == DType::I32 ? t.data<int32_t>()[i] : t.data<float>()[i];
  return v;
}

inline Tensor from_f64(const Vec& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

inline double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline double rel_err(const Vec& got, const Vec& ref) {
  REQUIRE(got.size() == ref.size());
  double d = 0;
  for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(got[i] - ref[i]));
  const double s = max_abs(ref);
  return s > 0 ? d / s : d;
}
inline double rel_err(const Tensor& got, const Vec& ref) { return rel_err(to_f64(got), ref); }

// Checks got against ref with relative error <= tol, naming `what`.
inline void check_close(const Tensor& got, const Vec& ref, double tol, const std::string& what) {
  const double e = rel_err(got, ref);
  INFO(what << ": rel err " << e << " (tol " << tol << ")");
  CHECK(e <= tol);
}
inline void check_close(const Vec& got, const Vec& ref, double tol, const std::string& what) {
  const double e = rel_err(got, ref);
  INFO(what << ": rel err " << e << " (tol " << tol << ")");
  CHECK(e <= tol);
}

inline double dot(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss(x) with respect to every element of x.
inline Vec fd_grad(Vec x, const std::function<double(const Vec&)>& loss, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

inline Vec add_vec(const Vec& a, const Vec& b, double sb = 1.0) {
  Vec r(a);
  for (size_t i = 0; i < r.size(); ++i) r[i] += sb * b[i];
  return r;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs fn with the given OpenMP thread count, restoring the previous one.
inline void with_threads(int n, const std::function<void()>& fn) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(prev);
}

}  // namespace ds::test
