// Random-LTD's row copies (token_gather / token_scatter) against their
// references, in f32 and through the dispatcher's bf16 path, and a clear
// error for a position outside the sequence.
#include <array>
#include <catch2/catch.hpp>

#include "lib/ops/ops.h"
#include "test/ops_harness/op_cases.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

TokenRowsArgs token_rows_args(int64_t B, int64_t T, int64_t R, int64_t C, uint64_t seed) {
  std::vector<int32_t> ix;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < R; ++j) ix.push_back(static_cast<int32_t>((j * 3 + b) % T));  // distinct: 3 and T coprime
  return {.full = randn({B, T, C}, seed), .part = randn({B, R, C}, seed + 1), .index = tokens_tensor({B, R}, ix)};
}

}  // namespace

TEST_CASE("token_gather and token_scatter copy the indexed rows") {
  for (const auto& [B, T, R, C] : std::vector<std::array<int64_t, 4>>{{1, 4, 4, 3}, {3, 16, 5, 7}, {2, 64, 17, 33}}) {
    INFO("B " << B << " T " << T << " R " << R << " C " << C);
    const TokenRowsArgs a = token_rows_args(B, T, R, C, 40 + T);
    check_reference(token_gather_case(a));
    check_reference(token_scatter_case(a));
  }
}

TEST_CASE("token rows move bf16 rows bit for bit") {
  const TokenRowsArgs a = token_rows_args(2, 16, 5, 8, 9);
  TokenRowsArgs b{.full = to_dtype(a.full, DType::BF16), .part = to_dtype(a.part, DType::BF16), .index = a.index};
  ops::token_gather(b);
  const Tensor full = to_dtype(b.full, DType::F32), part = to_dtype(b.part, DType::F32);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t c = 0; c < 8; ++c)
        CHECK(part.data<float>()[(s * 5 + j) * 8 + c] ==
              full.data<float>()[(s * 16 + a.index.data<int32_t>()[s * 5 + j]) * 8 + c]);
}

TEST_CASE("token rows refuse a position outside the sequence") {
  TokenRowsArgs a = token_rows_args(1, 4, 2, 3, 1);
  a.index.data<int32_t>()[1] = 4;
  CHECK_THROWS_WITH(ops::token_gather(a), Catch::Contains("token_gather: index 4 at (0, 1)"));
}
