// Checkpoint reshaping with real dstrain processes: a TP2 x DP2 ZeRO-1 run
// saved at step 10 continues the single-process loss curve (relative 1e-5,
// fp32) when resumed as a single process, and as TP1 x DP2 ZeRO-2 both from
// dsconvert's rewritten checkpoint and by loading the TP2 one directly; a
// TP2 x PP2 x DP2 ZeRO-1 run (8 processes) saved at step 10 resumes as a
// single process (directly and through dsconvert --target-pp 1) and a
// single-process checkpoint resumes as TP2 x PP2 x DP2, all on the same curve;
// dsconvert refuses bad input with one line, exit 1 and no output left.
#include <catch2/catch.hpp>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sys/wait.h>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

struct Run {
  std::string name;
  int world = 1, tp = 1, zero_stage = 0;
  std::vector<std::string> extra;
};

std::vector<double> run(const Run& r) {
  const DistData& d = dist_data();
  std::string cfg = d.dir + "/" + r.name + ".json";
  {
    std::ofstream f(cfg);
    f << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": "
      << r.zero_stage << ", \"reduce_bucket_size\": 5000}, \"csv_monitor\": {\"enabled\": true, \"output_path\": \""
      << d.dir << "/csv\", \"job_name\": \"" << r.name << "\"}}";
  }
  std::vector<std::string> a = {"--config", cfg, "--num-layers", "2", "--hidden-size", "32",
                                "--num-attention-heads", "4", "--seq-length", "32",
                                "--max-position-embeddings", "32", "--train-iters", "20",
                                "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
                                "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
                                "--tensor-model-parallel-size", std::to_string(r.tp),
                                "--data-path", d.data_prefix, "--vocab-file", d.vocab, "--merge-file", d.merges};
  a.insert(a.end(), r.extra.begin(), r.extra.end());
  std::string err = run_dstrain(DstrainJob{r.world, a});
  INFO(r.name << ": " << err);
  REQUIRE(err.empty());
  return read_losses(d.dir + "/csv/" + r.name + "/train.csv");
}

int dsconvert(const std::string& args, std::string* out) { return run_tool("dsconvert", args, out); }

// The single-process curve and the TP2 x DP2 checkpoint, made once (Catch
// re-enters the test case for every section).
const std::vector<double>& reference(const std::string& ck) {
  static std::vector<double> ref;
  if (!ref.empty()) return ref;
  fs::remove_all(ck);
  const std::string single_ck = dist_data().dir + "/reshape_single_ck";
  fs::remove_all(single_ck);
  std::vector<double> r = run({"reshape_single", 1, 1, 0, {"--save", single_ck, "--save-interval", "10"}});
  REQUIRE(r.size() == 20);
  std::ofstream(single_ck + "/latest", std::ios::trunc) << "global_step10\n";  // resume from step 10
  std::vector<double> first = run({"reshape_tp2dp2", 4, 2, 1, {"--save", ck, "--save-interval", "10",
                                                               "--exit-interval", "10"}});
  REQUIRE(first.size() == 10);
  require_same_curve(r, first, 0);
  REQUIRE(fs::exists(ck + "/global_step10/optim_tp01_rank00001_of_00002.safetensors"));
  ref = r;
  return ref;
}

}  // namespace

TEST_CASE("a TP2 x DP2 ZeRO-1 checkpoint resumes in other layouts on the single-process curve") {
  const std::string dir = dist_data().dir, ck = dir + "/reshape_tp2dp2", conv = dir + "/reshape_tp1dp2";
  const std::vector<double>& ref = reference(ck);

  SECTION("as a single process") { require_same_curve(ref, run({"reshape_to_single", 1, 1, 0, {"--load", ck}}), 10); }
  SECTION("as TP1 x DP2 ZeRO-2, loading the TP2 checkpoint directly") {
    require_same_curve(ref, run({"reshape_direct_tp1dp2", 2, 1, 2, {"--load", ck}}), 10);
  }
  SECTION("as TP1 x DP2 ZeRO-2 from dsconvert's output") {
    std::string out;
    fs::remove_all(conv);
    int rc = dsconvert("--load " + ck + " --save " + conv + " --target-tp 1 --target-dp 2 --zero-stage 2", &out);
    INFO(out);
    REQUIRE(rc == 0);
    REQUIRE(fs::exists(conv + "/latest"));
    REQUIRE(fs::exists(conv + "/global_step10/optim_rank00001_of_00002.safetensors"));
    require_same_curve(ref, run({"reshape_conv_tp1dp2", 2, 1, 2, {"--load", conv}}), 10);
  }
  SECTION("dsconvert exports HF from the TP2 checkpoint") {
    std::string out;
    int rc = dsconvert("--load " + ck + " --export-hf " + dir + "/reshape_hf", &out);
    INFO(out);
    REQUIRE(rc == 0);
    REQUIRE(fs::exists(dir + "/reshape_hf/model.safetensors"));
    REQUIRE(fs::exists(dir + "/reshape_hf/config.json"));
  }
  SECTION("dsconvert errors: one line, exit 1, nothing written") {
    std::string out;
    const std::string missing = dir + "/no_such_ckpt", bad = dir + "/reshape_bad_tp";
    CHECK(dsconvert("--load " + missing + " --save " + bad + " --target-tp 1 --target-dp 1", &out) == 1);
    CHECK(out.find(missing) != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK(dsconvert("--load " + ck + " --save " + bad + " --target-tp 3 --target-dp 1", &out) == 1);
    INFO(out);
    CHECK(out.find("divisible") != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK(!fs::exists(bad));
    CHECK(dsconvert("--load " + ck + " --save " + bad + " --target-tp 1 --target-dp 1 --target-pp 3", &out) == 1);
    INFO(out);
    CHECK(out.find("num_layers 2 is not divisible by 3") != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK(dsconvert("--load " + ck + " --save " + bad + " --target-tp 1 --target-dp 2 --target-pp 2 --zero-stage 3",
                    &out) == 1);
    INFO(out);
    CHECK(out.find("stage 3 cannot be combined with pipeline_model_parallel_size 2") != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK(!fs::exists(bad));
  }
}

namespace {

// The TP2 x PP2 x DP2 ZeRO-1 checkpoint at step 10 (8 processes), made once.
const std::string& checkpoint_3d(const std::vector<double>& ref) {
  static std::string ck;
  if (!ck.empty()) return ck;
  const std::string dir = dist_data().dir + "/reshape_tp2pp2dp2";
  fs::remove_all(dir);
  std::vector<double> first = run({"reshape_tp2pp2dp2", 8, 2, 1, {"--pipeline-model-parallel-size", "2", "--save",
                                                                   dir, "--save-interval", "10", "--exit-interval",
                                                                   "10"}});
  REQUIRE(first.size() == 10);
  require_same_curve(ref, first, 0);
  REQUIRE(fs::exists(dir + "/global_step10/optim_pp01_tp01_rank00001_of_00002.safetensors"));
  ck = dir;
  return ck;
}

}  // namespace

TEST_CASE("TP2 x PP2 x DP2 and single-process checkpoints resume in each other's layout on the same curve") {
  const std::string dir = dist_data().dir;
  const std::vector<double>& ref = reference(dir + "/reshape_tp2dp2");
  SECTION("TP2 x PP2 x DP2 ZeRO-1 -> a single process") {
    require_same_curve(ref, run({"reshape_3d_to_single", 1, 1, 0, {"--load", checkpoint_3d(ref)}}), 10);
  }
  SECTION("a single process -> TP2 x PP2 x DP2 ZeRO-1") {
    require_same_curve(ref, run({"reshape_single_to_3d", 8, 2, 1, {"--pipeline-model-parallel-size", "2",
                                                                    "--load", dir + "/reshape_single_ck"}}), 10);
  }
  SECTION("PP2 -> PP1 through dsconvert --target-pp 1") {
    const std::string conv = dir + "/reshape_pp1";
    std::string out;
    fs::remove_all(conv);
    int rc = dsconvert("--load " + checkpoint_3d(ref) + " --save " + conv +
                           " --target-tp 1 --target-pp 1 --target-dp 1", &out);
    INFO(out);
    REQUIRE(rc == 0);
    REQUIRE(fs::exists(conv + "/global_step10/optim_rank00000_of_00001.safetensors"));
    require_same_curve(ref, run({"reshape_conv_pp1", 1, 1, 0, {"--load", conv}}), 10);
  }
}

TEST_CASE("a grouped-query TP2 checkpoint rewritten by dsconvert for TP4 (replicated kv head) stays on the curve") {
  const std::string dir = dist_data().dir, ck = dir + "/reshape_gqa_tp2", conv = dir + "/reshape_gqa_tp4";
  // LLaMA family with one kv head for the 4 query heads: TP2 and TP4 both replicate it.
  const std::vector<std::string> gqa = {"--model-family", "llama", "--ffn-hidden-size", "64",
                                        "--num-key-value-heads", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), gqa.begin(), gqa.end());
    return extra;
  };
  fs::remove_all(ck);
  fs::remove_all(conv);
  const std::vector<double> ref = run({"reshape_gqa_single", 1, 1, 1, with({})});
  REQUIRE(ref.size() == 20);
  const std::vector<double> first =
      run({"reshape_gqa_tp2", 2, 2, 1, with({"--save", ck, "--save-interval", "10", "--exit-interval", "10"})});
  require_same_curve(ref, first, 0);
  std::string out;
  int rc = dsconvert("--load " + ck + " --save " + conv + " --target-tp 4 --target-dp 1 --zero-stage 1", &out);
  INFO(out);
  REQUIRE(rc == 0);
  require_same_curve(ref, run({"reshape_gqa_conv_tp4", 4, 4, 1, with({"--load", conv})}), 10);
}

// Megatron's load switches on the single-process checkpoint of step 10:
// --no-load-optim (without --deepspeed) continues at iteration 11 from the
// saved weights with a fresh optimizer, so its first loss is the resumed
// run's and the next ones differ; with --deepspeed the engine loads the
// optimizer anyway (as upstream), so it is the resumed curve (given the
// saving run's betas and weight decay: with --deepspeed the optimizer is
// Megatron's, whose defaults are 0.999 and 0.01). --finetune
// trains all 20 iterations again from the saved weights.
TEST_CASE("--finetune loads the weights only; --no-load-optim the weights and the iteration") {
  const std::vector<double>& ref = reference(dist_data().dir + "/reshape_tp2dp2");
  const std::string single_ck = dist_data().dir + "/reshape_single_ck";
  const std::vector<double> nlo = run({"no_load_optim", 1, 1, 0, {"--load", single_ck, "--no-load-optim"}});
  REQUIRE(nlo.size() == 10);
  CHECK(nlo[0] == Approx(ref[10]).epsilon(1e-6));
  CHECK(std::abs(nlo[1] - ref[11]) > 1e-4 * ref[11]);
  const std::vector<double> ds =
      run({"no_load_optim_ds", 1, 1, 0, {"--load", single_ck, "--no-load-optim", "--deepspeed", "--adam-beta2", "0.95",
                                         "--weight-decay", "0.1"}});
  require_same_curve(ref, ds, 10);
  const std::vector<double> ft = run({"finetune", 1, 1, 0, {"--load", single_ck, "--finetune"}});
  REQUIRE(ft.size() == 20);
  CHECK(ft[0] < 0.98 * ref[0]);  // the trained weights on the first batch
}

// Megatron's batch-size ramp-up: 4 samples per step for the first 40 samples,
// then the global batch of 8 (25 iterations for 160 samples). One process
// (2 then 4 micro-batches) and DP2 (1 then 2) train the same curve with the
// same logged batch sizes; a run stopped mid-ramp resumes on it.
TEST_CASE("--rampup-batch-size: DP2 and a mid-ramp resume give the single-process curve") {
  auto args = [](std::vector<std::string> extra) {
    std::vector<std::string> a = small_model_args({.iters = 20});
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      if (a[i] == "--train-iters") a[i] = "--train-samples", a[i + 1] = "160";
      if (a[i] == "--lr-warmup-iters") a[i] = "--lr-warmup-samples", a[i + 1] = "24";
    }
    a.insert(a.end(), {"--rampup-batch-size", "4", "4", "40"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto batches = [](const std::string& log) {
    std::vector<int> out;
    const std::regex re(R"(global batch size: +([0-9]+))");
    for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) out.push_back(std::stoi((*it)[1]));
    return out;
  };
  std::vector<double> single, dp2, first, second;
  std::string log;
  REQUIRE(run_with_config("rampup_single", 1, 2, 0, args({}), &single, &log).empty());
  REQUIRE(single.size() == 25);
  std::vector<int> want(10, 4);
  want.resize(25, 8);
  CHECK(batches(log) == want);
  CHECK(log.find("batch size ramp-up: the global batch grows from 4 by 4 over the first 40 samples to 8") !=
        std::string::npos);
  REQUIRE(run_with_config("rampup_dp2", 2, 2, 1, args({}), &dp2, &log).empty());
  CHECK(batches(log) == want);
  require_same_curve(single, dp2, 0);
  const std::string ck = dist_data().dir + "/rampup_ck";
  fs::remove_all(ck);
  REQUIRE(run_with_config("rampup_first", 2, 2, 1,
                          args({"--save", ck, "--save-interval", "6", "--exit-interval", "6"}), &first, &log)
              .empty());
  REQUIRE(first.size() == 6);
  REQUIRE(run_with_config("rampup_second", 2, 2, 1, args({"--load", ck}), &second, &log).empty());
  REQUIRE(second.size() == 19);
  first.insert(first.end(), second.begin(), second.end());
  require_same_curve(single, first, 0);
}
