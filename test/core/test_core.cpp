// Tests of lib/core: tensor views and copies, dtype conversion, strict JSON, rng.
#include <catch2/catch.hpp>

#include "lib/core/dtype.h"
#include "lib/core/decimal.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/core/mem_tag.h"
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

TEST_CASE("a host allocation no machine can hold is a user error, not an internal one") {
  // 2^48 bytes: past the 47-bit user address space of x86-64 and AArch64.
  try {
    Tensor::empty({int64_t{1} << 46}, DType::F32);
    FAIL("expected an out-of-memory error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("out of host memory: allocating 281474976710656 bytes"));
  }
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

TEST_CASE("tagged allocations are counted while their storage lives", "[core][mem_tag]") {
  const int64_t p0 = ds::live_tagged_bytes(ds::MemTag::Params, ds::DeviceType::CPU);
  const int64_t g0 = ds::live_tagged_bytes(ds::MemTag::Grads, ds::DeviceType::CPU);
  ds::Tensor untagged = ds::Tensor::zeros({100}, ds::DType::F32);
  ds::Tensor a, b;
  {
    ds::MemTagScope params(ds::MemTag::Params);
    a = ds::Tensor::zeros({100}, ds::DType::BF16);  // 200 bytes
    {
      ds::MemTagScope grads(ds::MemTag::Grads);  // the innermost scope wins
      b = ds::Tensor::empty({10}, ds::DType::F32);
    }
    ds::Tensor view = a.view(10, {20});  // a view allocates nothing
    CHECK(ds::current_mem_tag() == ds::MemTag::Params);
  }
  CHECK(ds::current_mem_tag() == ds::MemTag::None);
  CHECK(ds::live_tagged_bytes(ds::MemTag::Params, ds::DeviceType::CPU) == p0 + 200);
  CHECK(ds::live_tagged_bytes(ds::MemTag::Grads, ds::DeviceType::CPU) == g0 + 40);
  CHECK(ds::live_tagged_bytes(ds::MemTag::Params, ds::DeviceType::CUDA) == 0);
  ds::Tensor copy = a;  // shares the storage: still counted once
  a = ds::Tensor();
  CHECK(ds::live_tagged_bytes(ds::MemTag::Params, ds::DeviceType::CPU) == p0 + 200);
  copy = ds::Tensor();
  b = ds::Tensor();
  CHECK(ds::live_tagged_bytes(ds::MemTag::Params, ds::DeviceType::CPU) == p0);
  CHECK(ds::live_tagged_bytes(ds::MemTag::Grads, ds::DeviceType::CPU) == g0);
}

TEST_CASE("strict decimals: no hex, inf, nan, spaces or partial parses", "[core][decimal]") {
  CHECK(ds::parse_decimal("949") == 949.0);
  CHECK(ds::parse_decimal("-0.5") == -0.5);
  CHECK(ds::parse_decimal(".5") == 0.5);
  CHECK(ds::parse_decimal("1e2") == 100.0);
  CHECK(ds::parse_decimal("2.5E-1") == 0.25);
  for (const char* bad : {"", "0x10", "0X1p3", "inf", "-inf", "nan", "NAN", " 1", "1 ", "\t1", "+1", "1e", "1e+",
                          ".", "-", "1.5x", "1e400", "1,5", "--1"}) {
    INFO(bad);
    CHECK_FALSE(ds::parse_decimal(bad).has_value());
  }
  CHECK(ds::parse_decimal_int("12") == 12);
  CHECK(ds::parse_decimal_int("-3") == -3);
  CHECK(ds::parse_decimal_int("9223372036854775807") == INT64_MAX);
  CHECK(ds::parse_decimal_int("-9223372036854775808") == INT64_MIN);
  for (const char* bad : {"", "0x10", "1.0", "1e2", " 5", "5 ", "+4", "-", "9223372036854775808", "inf"}) {
    INFO(bad);
    CHECK_FALSE(ds::parse_decimal_int(bad).has_value());
  }
}
