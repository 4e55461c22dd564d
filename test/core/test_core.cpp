// Tests of lib/core: tensor views and copies, dtype conversion, strict JSON, rng.
#include <catch2/catch.hpp>

#include "lib/core/dtype.h"
#include "lib/core/json_config.h"
#include "lib/core/rng.h"
#include "lib/core/tensor.h"

using namespace ds;

TEST_CASE("tensor views share storage and copies do not") {
  Tensor t = Tensor::zeros({4, 3}, DType::F32);
  Tensor v = t.view(3, {3});
  v.data<float>()[1] = 7.f;
  REQUIRE(t.data<float>()[4] == 7.f);
  Tensor c = t.clone();
  c.data<float>()[4] = 1.f;
  REQUIRE(t.data<float>()[4] == 7.f);
  REQUIRE_THROWS(t.view(10, {3}));
  REQUIRE_THROWS(t.reshape({5}));
  REQUIRE(t.reshape({12}).numel() == 12);
}

TEST_CASE("bf16 and f16 round to nearest even") {
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  REQUIRE(bf16_to_f32(f32_to_bf16(1.00390625f)) == 1.0f);      // tie -> even
  REQUIRE(bf16_to_f32(f32_to_bf16(1.01171875f)) == 1.015625f);  // tie -> even (up)
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    REQUIRE(f16_to_f32(f32_to_f16(f)) == f);
  REQUIRE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST_CASE("strict json sections name unknown keys") {
  auto j = nlohmann::json::parse(R"({"a": 1, "b": {"c": true}, "typo": 3})");
  JsonSection s(j, "model");
  REQUIRE(s.get<int>("a", 0) == 1);
  REQUIRE(s.section("b").get<bool>("c", false));
  try {
    s.finish(UnknownKeys::Error);
    FAIL("expected an error");
  } catch (const UserError& e) {
    REQUIRE(std::string(e.what()).find("model.typo") != std::string::npos);
  }
  JsonSection t(j, "");
  REQUIRE_THROWS_AS(t.get<std::string>("a", ""), UserError);
}

TEST_CASE("rng is deterministic and roughly normal") {
  double sum = 0, sq = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double x = normal_at(42, 7, i);
    REQUIRE(x == normal_at(42, 7, i));
    sum += x;
    sq += x * x;
  }
  REQUIRE(std::abs(sum / n) < 0.02);
  REQUIRE(std::abs(sq / n - 1.0) < 0.02);
  REQUIRE(normal_at(42, 7, 0) != normal_at(42, 8, 0));
}
