// CPU test of AdamW's stochastic rounding of a bf16 param_lowp (sr_seed != 0):
// every result is one of the two bf16 neighbours of the f32 master value, the
// mean over many elements approaches the exact value (unbiased), the bits are
// a pure function of (seed, index) (same seed -> same bits, any thread count),
// exact bf16 values and NaN are kept, and sr_seed = 0 is round-to-nearest.
#include <cmath>
#include <cstring>

#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

// AdamW step with lr = 0 and zero gradient: the master weights stay as they
// are, so param_lowp receives exactly round(param).
Tensor round_via_adamw(const Tensor& param, uint64_t seed) {
  const int64_t n = param.numel();
  AdamWArgs a;
  a.param = param.clone();
  a.grad = Tensor::zeros({n}, DType::F32);
  a.m = Tensor::zeros({n}, DType::F32);
  a.v = Tensor::zeros({n}, DType::F32);
  a.param_lowp = Tensor::zeros({n}, DType::BF16);
  a.lr = 0.0f;
  a.sr_seed = seed;
  ops::adamw_step(a);
  return a.param_lowp;
}

// Largest bf16 value <= |x| (truncation of the magnitude) and the next one up.
void neighbours(float x, float& lo, float& hi) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  lo = bf16_to_f32(static_cast<uint16_t>(u >> 16));
  hi = bf16_to_f32(static_cast<uint16_t>((u >> 16) + 1));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("stochastic rounding to bf16 is unbiased and between the neighbours") {
  const int64_t n = 200000;
  // Values between bf16 neighbours at several scales and signs, plus
  // fractions near 0 and 1 of an ulp.
  for (float x : {1.0f + 0.3f * 0x1p-7f, -3.7e-3f, 1234.567f, 1.0f + 0.01f * 0x1p-7f,
                  -(2.0f + 0.97f * 0x1p-6f), 7.1e-20f}) {
    const Tensor p = full({n}, x);
    const Tensor r = round_via_adamw(p, 0x5eed1234ull);
    float lo, hi;
    neighbours(x, lo, hi);
    const uint16_t* bits = r.data<uint16_t>();
    double sum = 0;
    int64_t up = 0;
    bool all_neighbours = true;
    for (int64_t i = 0; i < n; ++i) {
      const float v = bf16_to_f32(bits[i]);
      all_neighbours &= v == lo || v == hi;
      up += v == hi;
      sum += v;
    }
    const double ulp = std::fabs(double(hi) - double(lo));
    const double frac = (std::fabs(double(x)) - std::fabs(double(lo))) / ulp;
    const double mean = sum / n;
    INFO("x = " << x << " lo = " << lo << " hi = " << hi << " mean = " << mean
                << " rounded up: " << up << " of " << n << ", exact fraction " << frac);
    CHECK(all_neighbours);
    // Binomial: the rounded-up fraction is within 5 standard deviations.
    const double sd = std::sqrt(std::max(frac * (1 - frac), 1e-6) / n);
    CHECK(std::fabs(double(up) / n - frac) <= 5 * sd + 1.0 / n);
    CHECK(std::fabs(mean - double(x)) <= (5 * sd + 1.0 / n) * ulp);
  }
}

TEST_CASE("stochastic rounding bits depend only on (seed, index)") {
  const int64_t n = 3 * 4096 + 77;  // several chunks, so threads split the work
  const Tensor p = randn({n}, 301, 2.0);
  const Tensor a1 = round_via_adamw(p, 42);
  const Tensor a2 = round_via_adamw(p, 42);
  CHECK(same_bits(a1, a2));
  Tensor t1, t3;
  with_threads(1, [&] { t1 = round_via_adamw(p, 42); });
  with_threads(3, [&] { t3 = round_via_adamw(p, 42); });
  CHECK(same_bits(t1, a1));
  CHECK(same_bits(t3, a1));
  // Another seed gives other bits (for a good share of the elements).
  const Tensor b = round_via_adamw(p, 43);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += a1.data<uint16_t>()[i] != b.data<uint16_t>()[i];
  CHECK(differ > n / 10);
  // Seed 0: round to nearest even, exactly as the plain cast.
  const Tensor rn = round_via_adamw(p, 0);
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(rn.data<uint16_t>()[i] == f32_to_bf16(p.data<float>()[i]));
}

TEST_CASE("stochastic rounding keeps exact values, zero and nan") {
  // (No -0 or inf: the AdamW update itself turns them into +0 and nan, as
  // 0 * inf is nan in the decay term, before any rounding.)
  const float vals[] = {0.0f, 1.0f, -2.5f, 0x1p-100f, -0x1p-126f, NAN};
  const int64_t k = sizeof(vals) / sizeof(vals[0]), reps = 1000;
  Tensor p = Tensor::empty({k * reps}, DType::F32);
  for (int64_t i = 0; i < k * reps; ++i) p.data<float>()[i] = vals[i % k];
  const Tensor r = round_via_adamw(p, 7);
  for (int64_t i = 0; i < k * reps; ++i) {
    const float want = vals[i % k], got = bf16_to_f32(r.data<uint16_t>()[i]);
    INFO("value " << want << " -> " << got);
    if (std::isnan(want))
      REQUIRE(std::isnan(got));
    else
      REQUIRE(std::memcmp(&got, &want, 4) == 0);
  }
}

TEST_CASE("adamw with stochastic rounding writes a neighbour of the updated master") {
  const int64_t n = 5003;
  AdamWArgs a;
  a.param = randn({n}, 311);
  a.grad = randn({n}, 312, 0.01);
  a.m = randn({n}, 313, 1e-3);
  a.v = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) a.v.data<float>()[i] = 1e-3f * float(std::fabs(normal_at(314, 7, i)));
  a.param_lowp = Tensor::zeros({n}, DType::BF16);
  a.lr = 1e-3f;
  a.weight_decay = 0.1f;
  a.step = 3;
  a.sr_seed = 99;
  ops::adamw_step(a);
  int64_t up = 0;
  for (int64_t i = 0; i < n; ++i) {
    float lo, hi;
    const float w = a.param.data<float>()[i];
    neighbours(w, lo, hi);
    const float got = bf16_to_f32(a.param_lowp.data<uint16_t>()[i]);
    INFO("element " << i << ": master " << w << " -> " << got);
    REQUIRE((got == lo || got == hi));
    up += got == hi && hi != lo;
  }
  CHECK(up > 0);  // some were rounded up, some down
  CHECK(up < n);
}
