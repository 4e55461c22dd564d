// ParallelLayout: the world split into TP x Ulysses x DP x PP once
// (make_parallel_layout), the config's copy of it (derive_config), the layout
// a saved config was trained with, and a saved config re-targeted to another
// layout (retarget_config), the one function dsgen and dsconvert use.
#include <catch2/catch.hpp>
#include <tuple>

#include "lib/config/config.h"
#include "lib/core/error.h"

using namespace ds;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// A resolved config as dstrain saves it, for `world` ranks.
TrainConfig resolved(const json& parallel, int world) {
  json j = {{"train_batch_size", 16},
            {"train_micro_batch_size_per_gpu", 2},
            {"model", {{"num_layers", 4}, {"hidden_size", 64}, {"num_heads", 4}, {"seq_length", 64},
                       {"max_position_embeddings", 64}, {"vocab_size", 100}}},
            {"training", {{"train_iters", 10}}},
            {"parallel", parallel}};
  return train_config_from_json(j, world);
}

// The same with MoE (4 experts on layers 2 and 4) at expert-parallel size ep.
TrainConfig moe_config(int ep, int world, int zero_stage = 0, int experts = 4) {
  json j = {{"train_batch_size", 16},
            {"train_micro_batch_size_per_gpu", 2},
            {"zero_optimization", {{"stage", zero_stage}}},
            {"model", {{"num_layers", 4}, {"hidden_size", 64}, {"num_heads", 4}, {"seq_length", 64},
                       {"max_position_embeddings", 64}, {"vocab_size", 100},
                       {"moe", {{"num_experts", experts}, {"expert_parallel_size", ep}}}}},
            {"training", {{"train_iters", 10}}}};
  return train_config_from_json(j, world);
}

}  // namespace

TEST_CASE("model.moe.expert_parallel_size gives the layout's EP for a model with MoE layers") {
  const TrainConfig c = moe_config(2, 4);
  CHECK(c.layout.dp == 4);
  CHECK(c.layout.ep == 2);
  CHECK(c.layout.edp() == 2);
  CHECK(c.layout.describe() == "TP=1 PP=1 DP=4 EP=2");
  CHECK(c.batch.grad_accum_steps == 2);  // EP splits experts, not the batch: 16 / (2 x DP 4)
  CHECK(saved_parallel_layout(c.resolved, "x") == c.layout);
  // A dense model ignores the size (Megatron-DeepSpeed).
  CHECK(moe_config(2, 1, 0, 1).layout.ep == 1);
  CHECK_THROWS_WITH(moe_config(4, 2),
                    Contains("--moe-expert-parallel-size 4 does not divide the data-parallel size 2 (world 2 / "
                             "(TP 1 x PP 1 x Ulysses 1))"));
  CHECK(moe_config(2, 4, 2).layout.edp() == 2);  // ZeRO partitions over the expert-data-parallel ranks
  CHECK_THROWS_WITH(moe_config(4, 4, 0, 2), Contains("not divisible by the expert-parallel size 4"));
  SECTION("retarget_config sets the target's EP (1 for ParallelRequest{})") {
    const TrainConfig one = retargeted_train_config(c.resolved, ParallelRequest{}, 1, BatchOnRetarget::Drop);
    CHECK(one.layout.ep == 1);
    CHECK(one.model.moe.expert_parallel_size == 1);
    const TrainConfig ep4 = retargeted_train_config(c.resolved, {.ep = 4}, 4, BatchOnRetarget::Keep);
    CHECK(ep4.layout.ep == 4);
    CHECK(ep4.model.moe.expert_parallel_size == 4);
  }
}

TEST_CASE("expert parallelism with optimizer offload: the CPU backend accepts cpu and nvme, a GPU refuses both") {
  auto with_offload = [](const std::string& where, int stage, const std::string& device) {
    json j = {{"train_batch_size", 16},
              {"train_micro_batch_size_per_gpu", 2},
              {"zero_optimization", {{"stage", stage}, {"offload_optimizer", {{"device", where}, {"nvme_path", "/tmp"}}}}},
              {"model", {{"num_layers", 4}, {"hidden_size", 64}, {"num_heads", 4}, {"seq_length", 64},
                         {"max_position_embeddings", 64}, {"vocab_size", 100},
                         {"moe", {{"num_experts", 4}, {"expert_parallel_size", 2}}}}},
              {"training", {{"train_iters", 10}, {"device", device}}}};
    return train_config_from_json(j, 4);
  };
  CHECK(with_offload("nvme", 3, "cpu").layout.ep == 2);
  CHECK(with_offload("cpu", 1, "cpu").layout.ep == 2);
  CHECK_THROWS_WITH(with_offload("cpu", 1, "cuda"),
                    Contains("--moe-expert-parallel-size 2 with zero_optimization.offload_optimizer.device cpu on a "
                             "GPU: expert parallelism runs without optimizer offload there so far"));
  CHECK_THROWS_WITH(with_offload("nvme", 3, "cuda"),
                    Contains("--moe-expert-parallel-size 2 with zero_optimization.offload_optimizer.device nvme on a "
                             "GPU"));
}

TEST_CASE("make_parallel_layout derives DP, the sequence-data-parallel size, virtual stages and local T") {
  const ParallelLayout l = make_parallel_layout({.tp = 2, .pp = 2, .ulysses = 2, .sequence_parallel = true,
                                                 .layers_per_virtual_stage = 2},
                                                24, 8, 1024);
  CHECK(l.dp == 3);
  CHECK(l.sdp() == 6);
  CHECK(l.replica() == 8);
  CHECK(l.vp == 2);
  CHECK(l.local_seq() == 512);
  CHECK(l.local_seq_sp() == 256);
  CHECK(l.describe() == "TP=2 PP=2 DP=3 Ulysses=2 (sequence-data-parallel 6) SP VP=2");
  CHECK(make_parallel_layout(l.request(), 24, 8, 1024) == l);
  // Megatron drops sequence parallelism with one tensor-parallel rank.
  CHECK_FALSE(make_parallel_layout({.tp = 1, .sequence_parallel = true}, 2).sequence_parallel);
  CHECK_THROWS_WITH(make_parallel_layout({.tp = 2, .ulysses = 2}, 6),
                    Contains("world size 6 is not divisible by tensor_model_parallel_size 2 * "
                             "pipeline_model_parallel_size 1 * ds_sequence_parallel_size 2"));
  CHECK_THROWS_WITH(make_parallel_layout({.ulysses = 0}, 2), Contains("must be positive"));
  CHECK_THROWS_WITH(make_parallel_layout({.pp = 2, .layers_per_virtual_stage = 3}, 2, 8),
                    Contains("layers per pipeline stage 4 (num_layers 8 / pp 2) is not divisible by "
                             "num_layers_per_virtual_pipeline_stage 3"));
}

TEST_CASE("make_parallel_layout splits DP into expert-parallel x expert-data-parallel") {
  const ParallelLayout l = make_parallel_layout({.tp = 2, .ep = 2}, 8);
  CHECK(l.dp == 4);
  CHECK(l.ep == 2);
  CHECK(l.edp() == 2);
  CHECK(l.describe() == "TP=2 PP=1 DP=4 EP=2");
  CHECK(l.shard(1) == ShardCoords{2, 1, 1, 0, 1, 2, 0});
  CHECK(make_parallel_layout(l.request(), 8) == l);
  CHECK(make_parallel_layout({}, 4).edp() == 4);
  // With Ulysses the expert-data-parallel ranks include every sequence rank:
  // EP divides DP, and EDP = Ulysses x DP / EP.
  const ParallelLayout u = make_parallel_layout({.ulysses = 2, .ep = 2}, 8);
  CHECK(std::tie(u.dp, u.ep) == std::make_tuple(4, 2));
  CHECK(u.edp() == 4);
  CHECK_THROWS_WITH(make_parallel_layout({.ulysses = 2, .ep = 4}, 4),
                    Contains("--moe-expert-parallel-size 4 does not divide the data-parallel size 2"));
  CHECK_THROWS_WITH(make_parallel_layout({.ep = 4}, 2),
                    Contains("--moe-expert-parallel-size 4 does not divide the data-parallel size 2 (world 2 / "
                             "(TP 1 x PP 1 x Ulysses 1))"));
  CHECK_THROWS_WITH(make_parallel_layout({.ep = 0}, 2), Contains("model.moe.expert_parallel_size"));
}

TEST_CASE("the config's layout is the one derive_config computes (DP excludes the Ulysses ranks)") {
  const TrainConfig c = resolved({{"ds_sequence_parallel_size", 2}, {"tensor_model_parallel_size", 2}}, 8);
  CHECK(c.layout.dp == 2);
  CHECK(c.layout.sdp() == 4);
  CHECK(c.batch.dp_size == 2);
  CHECK(c.batch.grad_accum_steps == 4);  // 16 / (2 x DP 2)
}

TEST_CASE("saved_parallel_layout: the world and sizes a saved config was trained with") {
  const TrainConfig c = resolved({{"ds_sequence_parallel_size", 2}, {"tensor_model_parallel_size", 2},
                                  {"pipeline_model_parallel_size", 2}, {"sequence_parallel", true},
                                  {"num_layers_per_virtual_pipeline_stage", 1}},
                                 16);
  const ParallelLayout l = saved_parallel_layout(c.resolved, "ck/global_step4");
  CHECK(l == c.layout);
  CHECK(l.world == 16);
  CHECK(l.vp == 2);
  json broken = c.resolved;
  broken["gradient_accumulation_steps"] = 3;
  CHECK_THROWS_WITH(saved_parallel_layout(broken, "ck/global_step4"),
                    Contains("checkpoint 'ck/global_step4': inconsistent batch sizes"));
  broken = c.resolved;
  broken["parallel"]["ds_sequence_parallel_size"] = "2";
  CHECK_THROWS_WITH(saved_parallel_layout(broken, "ck/global_step4"),
                    Contains("field 'config.parallel.ds_sequence_parallel_size' must be an integer"));
}

TEST_CASE("retarget_config moves a saved config of any layout to another world") {
  // Trained as TP 2 x SP x Ulysses 2 x PP 2 with virtual stages, DP 1.
  const TrainConfig c = resolved({{"ds_sequence_parallel_size", 2}, {"tensor_model_parallel_size", 2},
                                  {"pipeline_model_parallel_size", 2}, {"sequence_parallel", true},
                                  {"num_layers_per_virtual_pipeline_stage", 1}},
                                 8);
  SECTION("to one process, the global batch dropped (dsgen)") {
    const TrainConfig one = retargeted_train_config(c.resolved, ParallelRequest{}, 1, BatchOnRetarget::Drop);
    CHECK(one.layout == make_parallel_layout({}, 1, 4, 64));
    CHECK(one.batch.train_batch_size == 2);
    CHECK(one.model.num_layers == 4);
  }
  SECTION("to one process, the global batch kept (dsconvert, --load)") {
    const TrainConfig one = retargeted_train_config(c.resolved, ParallelRequest{}, 1, BatchOnRetarget::Keep);
    CHECK(one.batch.train_batch_size == 16);
    CHECK(one.batch.grad_accum_steps == 8);
    CHECK_FALSE(one.parallel.sequence_parallel);
  }
  SECTION("to Ulysses 4 x DP 2") {
    const TrainConfig u = retargeted_train_config(c.resolved, {.ulysses = 4}, 8, BatchOnRetarget::Keep);
    CHECK(u.layout.dp == 2);
    CHECK(u.layout.sdp() == 8);
    CHECK(u.batch.grad_accum_steps == 4);
    CHECK(saved_parallel_layout(u.resolved, "x") == u.layout);
  }
  SECTION("a layout the model cannot take names the sizes") {
    CHECK_THROWS_WITH(retargeted_train_config(c.resolved, {.tp = 3}, 3, BatchOnRetarget::Keep),
                      Contains("not divisible by tensor_model_parallel_size 3"));
  }
}
