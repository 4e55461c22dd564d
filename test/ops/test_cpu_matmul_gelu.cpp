// The CPU versions of the fused GELU GEMM ops (matmul_bias_gelu_forward,
// matmul_dgelu_bgrad) against the unfused ops they stand for, bit for bit,
// in f32, bf16 and f16 (the model's CPU path must not change by a bit when
// it switches to them), plus their argument checks.
#include <catch2/catch.hpp>

#include <cstring>

#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/ops/ops.h"

using namespace ds;

namespace {

// Seeded N(0, scale^2) values in dtype dt.
Tensor randn_as(const Shape& s, DType dt, uint64_t seed, float scale = 1.f) {
  Tensor f = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(normal_at(seed, 5, uint64_t(i))) * scale;
  if (dt == DType::F32) return f;
  Tensor t = Tensor::empty(s, dt);
  ops::cast({.out = t, .inp = f}, Stream{});
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

const DType kTypes[] = {DType::F32, DType::BF16, DType::F16};

}  // namespace

TEST_CASE("matmul_bias_gelu_forward on the CPU is matmul_forward then gelu_forward, bit for bit") {
  const int64_t N = 37, C = 29, OC = 43;
  for (DType dt : kTypes)
    for (bool bias : {true, false}) {
      INFO(dtype_name(dt) << (bias ? " with bias" : " no bias"));
      const Tensor inp = randn_as({N, C}, dt, 1), w = randn_as({OC, C}, dt, 2, 0.3f);
      const Tensor b = bias ? randn_as({OC}, dt, 3) : Tensor();
      Tensor out = Tensor::zeros({N, OC}, dt), pre = Tensor::zeros({N, OC}, dt);
      ops::matmul_bias_gelu_forward({.out = out, .pre = pre, .inp = inp, .weight = w, .bias = b});
      Tensor out2 = Tensor::zeros({N, OC}, dt), pre2 = Tensor::zeros({N, OC}, dt);
      ops::matmul_forward({.out = pre2, .inp = inp, .weight = w, .bias = b});
      ops::gelu_forward({.out = out2, .inp = pre2, .dout = Tensor()});
      CHECK(same_bits(pre, pre2));
      CHECK(same_bits(out, out2));
    }
}

// dbias starts non-zero: the op must add to it (gradient accumulation over
// micro-batches), as matmul_backward does.
TEST_CASE("matmul_dgelu_bgrad on the CPU is matmul_backward, gelu_backward and the bias sum, bit for bit") {
  const int64_t N = 37, C = 43, OC = 29;
  for (DType dt : kTypes)
    for (DType gdt : {DType::F32, dt})
      for (bool bias : {true, false}) {
        INFO(dtype_name(dt) << " dbias " << dtype_name(gdt) << (bias ? " with dbias" : " no dbias"));
        const Tensor dout = randn_as({N, OC}, dt, 11), w = randn_as({OC, C}, dt, 12, 0.3f);
        const Tensor pre = randn_as({N, C}, dt, 13, 2.f);
        const Tensor db0 = randn_as({C}, gdt, 14);
        Tensor dinp = randn_as({N, C}, dt, 15), db = bias ? db0.clone() : Tensor();
        ops::matmul_dgelu_bgrad({.dinp = dinp, .dbias = db, .dout = dout, .weight = w, .pre = pre});
        // The unfused sequence the model ran before: dact, then dfc, then
        // fc's bias gradient from dfc (matmul_backward of a layer whose
        // output gradient is dfc; its dweight goes to a throwaway buffer).
        Tensor dact = Tensor::zeros({N, C}, dt), dfc = Tensor::zeros({N, C}, dt);
        Tensor db2 = bias ? db0.clone() : Tensor();
        ops::matmul_backward({.dinp = dact, .dweight = Tensor::zeros({OC, C}, DType::F32), .dbias = Tensor(),
                              .dout = dout, .inp = pre, .weight = w});
        ops::gelu_backward({.out = dfc, .inp = pre, .dout = dact});
        if (bias) {
          const int64_t K = 7;  // any fc layer: the bias sum does not depend on its weight
          ops::matmul_backward({.dinp = Tensor(), .dweight = Tensor::zeros({C, K}, DType::F32), .dbias = db2,
                                .dout = dfc, .inp = randn_as({N, K}, dt, 16), .weight = randn_as({C, K}, dt, 17)});
        }
        CHECK(same_bits(dinp, dfc));
        if (bias) {
          CHECK(same_bits(db, db2));
          CHECK_FALSE(same_bits(db, db0));  // it did add something
        }
      }
}

TEST_CASE("the fused GELU GEMM ops name the wrong field") {
  const int64_t N = 5, C = 8, OC = 16;
  const Tensor inp = Tensor::zeros({N, C}, DType::F32), w = Tensor::zeros({OC, C}, DType::F32);
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string e1 = msg([&] {
    ops::matmul_bias_gelu_forward({.out = Tensor::zeros({N, OC}, DType::F32), .pre = Tensor::zeros({N, OC + 1}, DType::F32),
                                   .inp = inp, .weight = w, .bias = Tensor()});
  });
  CHECK_THAT(e1, Catch::Contains("matmul_bias_gelu_forward") && Catch::Contains("pre"));
  const std::string e2 = msg([&] {
    ops::matmul_bias_gelu_forward({.out = Tensor::zeros({N, OC - 1}, DType::F32), .pre = Tensor::zeros({N, OC}, DType::F32),
                                   .inp = inp, .weight = w, .bias = Tensor()});
  });
  CHECK_THAT(e2, Catch::Contains("'out'"));
  // Backward: weight (OC, C) maps dout (N, OC) to dinp (N, C).
  const std::string e3 = msg([&] {
    ops::matmul_dgelu_bgrad({.dinp = Tensor::zeros({N, C}, DType::F32), .dbias = Tensor::zeros({C + 1}, DType::F32),
                             .dout = Tensor::zeros({N, OC}, DType::F32), .weight = w,
                             .pre = Tensor::zeros({N, C}, DType::F32)});
  });
  CHECK_THAT(e3, Catch::Contains("matmul_dgelu_bgrad") && Catch::Contains("dbias"));
  const std::string e4 = msg([&] {
    ops::matmul_dgelu_bgrad({.dinp = Tensor::zeros({N, C}, DType::F32), .dbias = Tensor(),
                             .dout = Tensor::zeros({N, OC}, DType::F32), .weight = w,
                             .pre = Tensor::zeros({N, C + 2}, DType::F32)});
  });
  CHECK_THAT(e4, Catch::Contains("pre"));
}
