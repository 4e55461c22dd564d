// Random-LTD in the trainer: Megatron-DeepSpeed's actual_seq_length,
// (T (L - n) + R n) // L while R < T, is what the consumed tokens count, so
// --train-tokens (and the token-based schedules) see fewer tokens per step;
// the iteration line names the reserved length.
#include <catch2/catch.hpp>
#include <fstream>

#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

// Layers 1 and 2 of 4 drop; reserved 8 + s/4 * 24 in multiples of 8: 8, 8,
// 16, 24, then 32 (= T, nothing dropped). Per sample (32*2 + R*2) // 4: 20,
// 20, 24, 28, 32.
std::string ltd_config() {
  const fs::path p = fixture().dir / "ltd.json";
  std::ofstream(p) << R"({"data_efficiency": {"enabled": true, "data_routing": {"enabled": true, "random_ltd": {
    "enabled": true, "total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2],
    "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "seq_batch_dim",
    "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"require_steps": 4, "seq_per_step": 8}}}}}})";
  return p.string();
}

}  // namespace

TEST_CASE("random-LTD: consumed tokens count the kept positions, as Megatron-DeepSpeed's actual_seq_length") {
  const std::vector<std::string> base = {"--config", ltd_config(), "--random-ltd", "--num-layers", "4"};
  {
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--train-iters", "5"});
    Trainer t(make_config(a), single_process());
    REQUIRE(t.run().size() == 5);
    CHECK(t.state().consumed_tokens == 8 * (20 + 20 + 24 + 28 + 32));
  }
  {  // --train-tokens 8 x 64: two full-length steps, three random-LTD steps
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--train-iters", "100", "--train-tokens", std::to_string(8 * 64)});
    Trainer t(make_config(a), single_process());
    CHECK(t.run().size() == 3);
    CHECK(t.state().consumed_tokens == 8 * (20 + 20 + 24));
  }
}
