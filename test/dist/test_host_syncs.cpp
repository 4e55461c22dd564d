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

TEST_CASE("one process: no host synchronisation in the step", "[multiproc]") {
  CHECK(profiled_syncs("single", 1, 0, false, {}) == 0);
  CHECK(profiled_syncs("single_fp16", 1, 0, false, {"--fp16"}) == 0);
}

TEST_CASE("data parallel: the gradient collectives and the loss mean", "[multiproc]") {
  // DP2, 2 micro-batches per rank. Stage 0: one bucket all-reduce + the loss
  // mean over dp; fp16 adds the overflow flag's all-reduce over the world.
  CHECK(profiled_syncs("dp_z0", 2, 0, false, {}) == 2);
  CHECK(profiled_syncs("dp_z0_fp16", 2, 0, false, {"--fp16"}) == 3);
  // Stage 1: + the all-gather of the updated parameters.
  CHECK(profiled_syncs("dp_z1", 2, 1, false, {}) == 3);
  // overlap_comm: the bucket's all-reduce runs on the communication thread
  // and is waited for once; the loss mean blocks.
  CHECK(profiled_syncs("dp_z0_overlap", 2, 0, true, {}) == 2);
  // ZeRO-2: each unit's gradient reduce-scatter (kLayers + 2 units, 2
  // micro-batches) is issued asynchronously and waited for once; the norm's
  // scalar all-reduce, the parameters' all-gather and the loss mean block.
  CHECK(profiled_syncs("dp_z2", 2, 2, false, {}) == 2 * (kLayers + 2) + 3);
  CHECK(profiled_syncs("dp_z2_overlap", 2, 2, true, {}) == 2 * (kLayers + 2) + 3);
}

TEST_CASE("tensor parallel: the tp collectives of every micro-batch", "[multiproc]") {
  // TP2 (dp 1, 4 micro-batches of 2). Per micro-batch: forward 2 all-reduces
  // per layer, 1 for the vocab-parallel embedding, 2 for the vocab-parallel
  // loss (row max, statistics); backward 2 per layer and 1 for the head's
  // input gradient. Then the norm's scalar all-reduce over tp.
  const int64_t ga = 4;
  CHECK(profiled_syncs("tp2", 2, 0, false, {"--tensor-model-parallel-size", "2"}) == ga * (4 * kLayers + 4) + 1);
}
