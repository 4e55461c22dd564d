// Random-LTD (DeepSpeed Data Efficiency's random layerwise token dropping) in
// every layout it runs in: the kept positions are keyed by (seed, iteration,
// global sample, layer), so DP2 with ZeRO-1, DP2 with ZeRO-2 and two
// micro-batches per rank, DP2 with ZeRO-3, TP2, full and selective recomputation, and
// an MoE model with expert parallelism over DP2 reproduce the
// single-process curve to a relative 1e-5 over 20 steps while the reserved
// length grows from 8 to 32 (dropout 0.1 on). The log names the reserved
// length as Megatron-DeepSpeed does, and the consumed tokens count the
// dropped positions as its actual_seq_length.
#include <catch2/catch.hpp>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

const char* kRandomLtd = R"("data_efficiency": {"enabled": true, "seed": 1234, "data_routing": {"enabled": true,
  "random_ltd": {"enabled": true, "total_layer_num": 3, "random_ltd_layer_num": 2, "random_ltd_layer_id": [0, 1],
  "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "seq_batch_dim",
  "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
  "schedule_config": {"require_steps": 12, "seq_per_step": 4}}}}})";

std::vector<double> run(const std::string& name, int world, std::vector<std::string> extra, int micro, int zero = -1,
                        std::string* log = nullptr) {
  SmallModel m;
  m.layers = 3;
  std::vector<std::string> args = small_model_args(m);
  args.push_back("--random-ltd");
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<double> losses;
  const std::string err = run_with_config(name, world, micro, zero, args, &losses, log, kRandomLtd);
  INFO(name << ": " << err);
  REQUIRE(err.empty());
  REQUIRE(losses.size() == 20);
  return losses;
}

}  // namespace

TEST_CASE("random-LTD in DP2 (ZeRO-1, ZeRO-2 with accumulation, ZeRO-3), TP2 and full recompute is the single-process curve") {
  std::string log;
  const std::vector<double> ref = run("ltd_single", 1, {}, 8, -1, &log);
  // Reserved length 8 + s/12 * 24 in multiples of 4 at step s (0-based): 8 at
  // iteration 1, 28 at iteration 12 (s = 11), 32 and no dropping from iteration 13.
  CHECK(log.find("| random ltd reserved length:     8 |") != std::string::npos);
  CHECK(log.find("| random ltd reserved length:    28 |") != std::string::npos);
  CHECK(log.find("| random ltd reserved length:    32 |") != std::string::npos);
  CHECK(log.find("random-LTD: 2 of 3 layers drop tokens in training") != std::string::npos);
  require_same_curve(ref, run("ltd_dp2_z1", 2, {}, 4, 1));
  require_same_curve(ref, run("ltd_dp2_z2_ga2", 2, {}, 2, 2));
  require_same_curve(ref, run("ltd_dp2_z3", 2, {}, 4, 3));
  require_same_curve(ref, run("ltd_tp2", 2, {"--tensor-model-parallel-size", "2"}, 8));
  require_same_curve(ref, run("ltd_recompute", 1, {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                  "--recompute-num-layers", "1"}, 8));
  require_same_curve(ref, run("ltd_selective", 1, {"--recompute-granularity", "selective"}, 8));
  // Mixture of Experts: the gate sees the kept rows; expert parallelism over DP2 draws the same ones.
  const std::vector<std::string> moe = {"--num-experts", "4", "--topk", "2"};
  const std::vector<double> moe_ref = run("ltd_moe_single", 1, moe, 4);
  std::vector<std::string> ep2 = moe;
  ep2.insert(ep2.end(), {"--moe-expert-parallel-size", "2"});
  require_same_curve(moe_ref, run("ltd_moe_ep2", 2, ep2, 4, 1));
}
