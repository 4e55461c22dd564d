// A sequence-length curriculum (DeepSpeed's curriculum_learning) in every
// layout that splits the batch, the model or the sequence: DP2 with ZeRO-1,
// TP2 with Megatron sequence parallelism, PP2 and DeepSpeed-Ulysses SP2 each
// reproduce the single-process curriculum curve to a relative 1e-5 over 20
// steps while the length grows from 8 to 32 (dropout 0.1 on: masks keyed by
// global positions stay those of the single process at every length).
#include <catch2/catch.hpp>
#include <fstream>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

std::vector<double> run(const std::string& name, int world, std::vector<std::string> extra, int zero = -1,
                        std::string* log = nullptr) {
  const DistData& d = dist_data();
  const std::string cfg = d.dir + "/" + name + ".json";
  {
    std::ofstream f(cfg);
    f << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,)";
    if (zero >= 0) f << R"( "zero_optimization": {"stage": )" << zero << R"(, "reduce_bucket_size": 5000},)";
    f << R"( "csv_monitor": {"enabled": true, "output_path": ")" << d.dir << R"(/csv", "job_name": ")" << name
      << R"("}, "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
      "max_difficulty": 32, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 12, "difficulty_step": 4}}})";
  }
  std::vector<std::string> args = small_model_args(SmallModel{});
  args.insert(args.begin(), {"--config", cfg});
  args.insert(args.end(), extra.begin(), extra.end());
  DstrainJob job{world, args};
  job.rank0_output = log;
  const std::string err = run_dstrain(job);
  INFO(name << ": " << err);
  REQUIRE(err.empty());
  std::vector<double> losses = read_losses(d.dir + "/csv/" + name + "/train.csv");
  REQUIRE(losses.size() == 20);
  return losses;
}

}  // namespace

TEST_CASE("a curriculum run in DP2, TP2 + sequence parallel, PP2 and Ulysses SP2 is the single-process curve") {
  std::string log;
  const std::vector<double> ref = run("cl_single", 1, {}, -1, &log);
  // The length grows 8, 12, 12, 16, ... (8 + s/12 * 24 in multiples of 4) and holds 32 from step 12.
  CHECK(log.find("| curriculum seqlen:     8 |") != std::string::npos);
  CHECK(log.find(" iteration       12/      20 ") != std::string::npos);
  CHECK(log.find("curriculum seqlen:    32 |") != std::string::npos);
  require_same_curve(ref, run("cl_dp2_z1", 2, {}, 1));
  require_same_curve(ref, run("cl_tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}));
  require_same_curve(ref, run("cl_pp2", 2, {"--pipeline-model-parallel-size", "2"}));
  require_same_curve(ref, run("cl_ulysses2", 2, {"--ds-sequence-parallel-size", "2"}));
}
