// Host synchronisations per training step on the CPU backend, as
// `dstrain --profile` reports them for its profiled (second) step: the count
// for each layout is derived from the collectives the layout must block on,
// so a new blocking collective or wait in the step makes this test fail.
// Counted (lib/core/sync_counter.h): every blocking collective issued from the
// training thread and the first wait on each operation issued asynchronously
// (whether or not it had finished: the count does not depend on timing).
// The GPU counterpart is test/train/test_host_syncs_cuda.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

constexpr int kLayers = 2;

// One bucket for every gradient collective (buckets larger than the model),
// global batch 8 in micro-batches of 2.
std::string write_config(const std::string& name, int stage, bool overlap) {
  const std::string cfg = dist_data().dir + "/" + name + ".json";
  std::ofstream f(cfg);
  f << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": " << stage
    << ", \"reduce_bucket_size\": 500000000, \"allgather_bucket_size\": 500000000, \"overlap_comm\": "
    << (overlap ? "true" : "false") << "}}";
  return cfg;
}

// Rank 0's count for the profiled step of a 4-iteration run.
int64_t profiled_syncs(const std::string& name, int world, int stage, bool overlap, std::vector<std::string> extra) {
  SmallModel m;
  m.layers = kLayers;
  m.iters = 4;
  std::vector<std::string> args = small_model_args(m);
  const std::string dir = dist_data().dir + "/prof_" + name;
  std::filesystem::create_directories(dir);
  args.insert(args.begin(), {"--config", write_config(name, stage, overlap)});
  args.insert(args.end(), {"--profile", "--profile-dir", dir});
  args.insert(args.end(), extra.begin(), extra.end());
  std::string log;
  DstrainJob job{world, args};
  job.rank0_output = &log;
  const std::string err = run_dstrain(job);
  INFO(name << ": " << err << log);
  REQUIRE(err.empty());
  std::smatch mm;
  REQUIRE(std::regex_search(log, mm, std::regex(R"(profile: iteration 2: (\d+) host synchronisations in the step)")));
  return std::stoll(mm[1].str());
}

}  // namespace

// Every layout ends its step with the same one blocking collective: the
// all-reduce over the world of the step's statistics (this rank's shares of
// the gradient sum of squares, the fp16 overflow flag and the mean loss:
// Trainer::read_step_stats), counted as kStats below; a single process has
// no collective at all.
constexpr int64_t kStats = 1;

TEST_CASE("one process: no host synchronisation in the step", "[multiproc]") {
  CHECK(profiled_syncs("single", 1, 0, false, {}) == 0);
  CHECK(profiled_syncs("single_fp16", 1, 0, false, {"--fp16"}) == 0);
}

TEST_CASE("data parallel: the gradient collectives and the step statistics", "[multiproc]") {
  // DP2, 2 micro-batches per rank. Stage 0: one bucket all-reduce; the loss
  // mean and (fp16) the overflow flag travel in the statistics' all-reduce.
  CHECK(profiled_syncs("dp_z0", 2, 0, false, {}) == 1 + kStats);
  CHECK(profiled_syncs("dp_z0_fp16", 2, 0, false, {"--fp16"}) == 1 + kStats);
  // Stage 1: + the all-gather of the updated parameters.
  CHECK(profiled_syncs("dp_z1", 2, 1, false, {}) == 2 + kStats);
  // overlap_comm: the bucket's all-reduce runs on the communication thread
  // and is waited for once.
  CHECK(profiled_syncs("dp_z0_overlap", 2, 0, true, {}) == 1 + kStats);
  // ZeRO-2: each unit's gradient reduce-scatter (kLayers + 2 units, 2
  // micro-batches) is issued asynchronously and waited for once; then the
  // parameters' all-gather. The norm of the shards needs no collective of
  // its own: each rank's share is in the statistics.
  CHECK(profiled_syncs("dp_z2", 2, 2, false, {}) == 2 * (kLayers + 2) + 1 + kStats);
  CHECK(profiled_syncs("dp_z2_overlap", 2, 2, true, {}) == 2 * (kLayers + 2) + 1 + kStats);
}

TEST_CASE("tensor parallel: the tp collectives of every micro-batch", "[multiproc]") {
  // TP2 (dp 1, 4 micro-batches of 2). Per micro-batch: forward 2 all-reduces
  // per layer, 1 for the vocab-parallel embedding, 2 for the vocab-parallel
  // loss (row max, statistics); backward 2 per layer and 1 for the head's
  // input gradient. The norm's tp sum is in the statistics.
  const int64_t ga = 4;
  CHECK(profiled_syncs("tp2", 2, 0, false, {"--tensor-model-parallel-size", "2"}) == ga * (4 * kLayers + 4) + kStats);
}

TEST_CASE("pipeline parallel: the stage's p2p batches", "[multiproc]") {
  // Rank 0 is stage 0 of 1F1B over 2 stages with n micro-batches: one warm-up
  // forward, then each steady-state forward sends its output together with
  // the receive of the oldest gradient, and the last gradient arrives alone:
  //   F0 [SF0] F1 [SF1 RB0] B0 ... F(n-1) [SF(n-1) RB(n-2)] B(n-2) [RB(n-1)] B(n-1)
  // n + 1 asynchronous batches, each waited for once. Then the tied
  // embedding's gradient all-reduce over the first and last stage (blocking)
  // and the statistics; the loss and the norm no longer need a broadcast
  // from the last stage or a scalar all-reduce over the model-parallel group.
  const std::vector<std::string> pp2 = {"--pipeline-model-parallel-size", "2"};
  const int64_t n = 4;  // global batch 8 = micro 2 x 4, dp 1
  CHECK(profiled_syncs("pp2", 2, 0, false, pp2) == (n + 1) + 1 + kStats);
  // PP2 x DP2: 2 micro-batches per pipeline; + the stage's gradient bucket
  // all-reduce over its data-parallel group (ZeRO-0, one bucket).
  const int64_t n_dp = 2;
  CHECK(profiled_syncs("pp2_dp2", 4, 0, false, pp2) == (n_dp + 1) + 1 + 1 + kStats);
}
