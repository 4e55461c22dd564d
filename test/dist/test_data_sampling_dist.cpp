// DeepSpeed Data Efficiency's data-sampling curriculum in the layouts that
// split the batch or the model: every rank computes the sampler's stream and
// takes its part of each micro-step, so DP2 with ZeRO-1, DP2 with ZeRO-2 and
// two micro-batches per rank, and TP2 with Megatron sequence parallelism each
// reproduce the single-process curve to a relative 1e-5 over 20 steps while
// seqlen_truncate grows from 8 to 32 (dropout 0.1 on). The same with a
// vocabulary-rarity curriculum from dsprep's data analysis of the training
// data (the data-efficiency scripts' pair of metrics): the clusters grow by
// percentile of rarity as DeepSpeed's scheduler says, in every layout.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

const char* kSeqlen = R"("seqlen_truncate": {"difficulty_type": "value", "clustering_type": "single_cluster",
    "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 12, "difficulty_step": 4}})";

// The config's data-efficiency keys with `metrics` (JSON members).
std::string sampling_section(const std::string& metrics) {
  return R"("dataloader_drop_last": true, "data_efficiency": {"enabled": true, "seed": 99, "data_sampling": {
    "enabled": true, "num_workers": 0, "curriculum_learning": {"enabled": true, "data_cluster_path": ")" +
         dist_data().dir + R"(/clusters", "curriculum_metrics": {)" + metrics + "}}}}";
}

std::vector<double> run(const std::string& name, int world, std::vector<std::string> extra, int micro, int zero = -1,
                        std::string* log = nullptr, const std::string& metrics = kSeqlen) {
  std::vector<std::string> args = small_model_args(SmallModel{});
  args.push_back("--data-efficiency-curriculum-learning");
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<double> losses;
  const std::string err = run_with_config(name, world, micro, zero, args, &losses, log, sampling_section(metrics));
  INFO(name << ": " << err);
  REQUIRE(err.empty());
  REQUIRE(losses.size() == 20);
  return losses;
}

}  // namespace

TEST_CASE("the data-sampling curriculum in DP2 (ZeRO-1, ZeRO-2 with accumulation) and TP2 + SP is the single-process curve") {
  std::string log;
  const std::vector<double> ref = run("dsamp_single", 1, {}, 8, -1, &log);
  CHECK(log.find("data-sampling curriculum: seqlen_truncate (value single_cluster, fixed_linear from 8 to 32)") !=
        std::string::npos);
  CHECK(log.find("| curriculum seqlen:     8 |") != std::string::npos);
  CHECK(log.find("| curriculum seqlen:    32 |") != std::string::npos);
  require_same_curve(ref, run("dsamp_dp2_z1", 2, {}, 4, 1));
  require_same_curve(ref, run("dsamp_dp2_z2_ga2", 2, {}, 2, 2));
  require_same_curve(ref, run("dsamp_tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 8));
}

TEST_CASE("a vocabulary-rarity curriculum from dsprep's analysis is one curve in every layout") {
  const DistData& d = dist_data();
  const std::string save = d.dir + "/analysis";
  const std::string common = "--analyzing-data-type GPT --data-path " + d.data_prefix + " --vocab-file " + d.vocab +
                             " --merge-file " + d.merges + " --seq-length 32 --save " + save +
                             " --analyzing-num-threads 2";
  for (const char* metric : {"total_vocab_freq", "vocab_rarity"})
    for (const char* task : {"map", "reduce"}) {
      std::string out;
      const int rc = run_tool("dsprep", fmt::format("--analyzing-task {} --analyzing-metric {} {}", task, metric,
                                                    common), &out);
      INFO(out);
      REQUIRE(rc == 0);
    }
  // Rarity by percentile on a square-root schedule over 15 steps, with seqlen_truncate, as the scripts pair them.
  const std::string metrics = std::string(R"("voc": {"index_to_sample_path": ")") + save +
                              R"(/vocab_rarity/vocab_rarity_index_to_sample_percentile_merged",
    "index_to_metric_path": ")" + save + R"(/vocab_rarity/vocab_rarity_index_to_metric",
    "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 1,
    "max_difficulty": 100, "schedule_type": "fixed_root",
    "schedule_config": {"total_curriculum_step": 15, "difficulty_step": 1, "root_degree": 2}}, )" + kSeqlen;
  std::string log;
  const std::vector<double> ref = run("dsamp_voc_single", 1, {}, 8, -1, &log, metrics);
  // Step 1: percentile floor(sqrt(1/15) * 99 + 1) = 26, so the first cluster holds 26 x (N // 100) samples.
  const std::string tag = "samples of the train dataset's first epoch";
  const size_t at = log.find(tag);
  REQUIRE(at != std::string::npos);
  const size_t num = log.rfind("over the ", at);
  const long n = std::stol(log.substr(num + 9, at - num - 9));
  INFO(log.substr(num, 200));
  CHECK(log.find(fmt::format("new cluster 0 of {} samples (difficulties seqlen_truncate 8, voc 26)", 26 * (n / 100))) !=
        std::string::npos);
  CHECK(log.find("(difficulties seqlen_truncate 32, voc 100)") != std::string::npos);
  require_same_curve(ref, run("dsamp_voc_dp2_z1", 2, {}, 4, 1, nullptr, metrics));
  require_same_curve(ref, run("dsamp_voc_tp2", 2, {"--tensor-model-parallel-size", "2"}, 8, -1, nullptr, metrics));
  // Another order than the seqlen-only curriculum's.
  CHECK(ref != run("dsamp_seqlen_only", 1, {}, 8));
}
