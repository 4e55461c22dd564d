// DeepSpeed's batch-size triple rules (resolve_batch) and Megatron's vocabulary padding.
#include <catch2/catch.hpp>

#include "lib/config/config.h"
#include "lib/core/error.h"

using namespace ds;

namespace {

BatchConfig batch(int64_t tbs, int64_t mbs, int64_t gas, int dp) {
  BatchConfig b;
  b.train_batch_size = tbs;
  b.micro_batch_size = mbs;
  b.grad_accum_steps = gas;
  b.dp_size = dp;
  resolve_batch(b);
  return b;
}

void check(const BatchConfig& b, int64_t tbs, int64_t mbs, int64_t gas) {
  CHECK(b.train_batch_size == tbs);
  CHECK(b.micro_batch_size == mbs);
  CHECK(b.grad_accum_steps == gas);
}

}  // namespace

TEST_CASE("batch triple: derivations", "[config][batch]") {
  check(batch(32, 4, 2, 4), 32, 4, 2);  // all three, consistent
  check(batch(32, 4, 0, 4), 32, 4, 2);  // gas = tbs / (mbs * dp)
  check(batch(32, 0, 2, 4), 32, 4, 2);  // mbs = tbs / (gas * dp)
  check(batch(0, 4, 2, 4), 32, 4, 2);   // tbs = mbs * gas * dp
  check(batch(32, 0, 0, 4), 32, 8, 1);  // tbs alone: gas 1
  check(batch(0, 4, 0, 4), 16, 4, 1);   // mbs alone: gas 1
  check(batch(8, 8, 0, 1), 8, 8, 1);
}

TEST_CASE("batch triple: every error names the values", "[config][batch]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(batch(30, 4, 2, 4),
                    Contains("train_batch_size 30 != train_micro_batch_size_per_gpu 4 * "
                             "gradient_accumulation_steps 2 * data parallel size 4 (= 32)"));
  CHECK_THROWS_WITH(batch(30, 4, 0, 4), Contains("train_batch_size 30 is not divisible by "
                                                 "train_micro_batch_size_per_gpu 4 * data parallel size 4 (= 16)"));
  CHECK_THROWS_WITH(batch(30, 0, 4, 4), Contains("train_batch_size 30 is not divisible by "
                                                 "gradient_accumulation_steps 4 * data parallel size 4 (= 16)"));
  CHECK_THROWS_WITH(batch(30, 0, 0, 4), Contains("train_batch_size 30 is not divisible by data parallel size 4"));
  CHECK_THROWS_WITH(batch(0, 0, 0, 4), Contains("give train_batch_size (--global-batch-size) or "
                                                "train_micro_batch_size_per_gpu (--micro-batch-size)"));
  CHECK_THROWS_WITH(batch(0, 0, 4, 4), Contains("gradient_accumulation_steps 4 alone is not enough"));
  CHECK_THROWS_WITH(batch(-8, 4, 0, 1), Contains("train_batch_size -8"));
  CHECK_THROWS_WITH(batch(8, 4, 0, 0), Contains("data parallel size must be positive, got 0"));
  CHECK_THROWS_AS(batch(30, 4, 2, 4), UserError);
}

TEST_CASE("padded vocab follows Megatron's rule", "[config][vocab]") {
  CHECK(padded_vocab(50257, 128, 1) == 50304);
  CHECK(padded_vocab(50257, 128, 2) == 50432);
  CHECK(padded_vocab(50257, 128, 8) == 51200);
  CHECK(padded_vocab(50304, 128, 1) == 50304);  // already a multiple
  CHECK(padded_vocab(32000, 64, 1) == 32000);
  CHECK(padded_vocab(1, 1, 1) == 1);
  CHECK_THROWS_AS(padded_vocab(0, 128, 1), UserError);
}

// An enabled `elasticity` section sets the global and micro batch for the
// data-parallel size (DeepSpeed's rules, lib/core/elasticity.h); accumulation
// makes up the rest. {1, 2} under 16 on at most 4 GPUs: global batch 12.
TEST_CASE("batch triple: the elasticity section keeps the global batch at every valid size", "[config][batch]") {
  auto elastic = [](int64_t tbs, int dp, bool ignore) {
    BatchConfig b;
    b.train_batch_size = tbs;
    b.dp_size = dp;
    b.elasticity.enabled = true;
    b.elasticity.max_train_batch_size = 16;
    b.elasticity.micro_batch_sizes = {1, 2};
    b.elasticity.max_gpus = 4;
    b.elasticity.ignore_non_elastic_batch_info = ignore;
    resolve_batch(b);
    return b;
  };
  check(elastic(0, 3, false), 12, 2, 2);
  check(elastic(0, 2, false), 12, 2, 3);
  check(elastic(0, 4, false), 12, 1, 3);
  check(elastic(64, 1, true), 12, 2, 6);  // the configured batch is ignored
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(elastic(64, 1, false), Contains("elasticity is enabled, so the batch sizes come from the "
                                                    "'elasticity' section; remove train_batch_size"));
  CHECK_THROWS_WITH(elastic(0, 5, false), Contains("data-parallel size 5 is not one of the valid sizes [1, 2, 3, 4]"));
}
