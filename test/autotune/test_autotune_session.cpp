// Real autotuning sessions: dsrun --autotuning with dstrain on the CPU backend,
// 2 ranks, a 4-layer hidden-32 model on a dataset made by dsprep. One `tune`
// session over ZeRO 0/1 x PP 1/2 x virtual stages 1/2 x three micro batches
// (global batch 24 held) checks that points over the memory limit are pruned
// without running, that an experiment dstrain rejects at run time (the
// interleaved schedule with 3 micro-batches on 2 stages) is recorded as failed
// while the search goes on, and that the chosen configuration is the best of
// those measured; `run` then reuses the measurements (overwrite false) and
// trains with ds_config_optimal.json. Also the one-line user errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test/launcher/test_util.h"

using namespace ds::launch::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string bin(const std::string& app) { return binary_dir() + "/apps/" + app + "/" + app; }

struct Data {
  TempDir tmp;
  std::string dir = tmp.path();
  Data() {
    const std::string d = dir;
    REQUIRE(sh(bin("dsprep") + " --generate-corpus " + d + "/corpus.txt --size-mb 0.2 --seed 3") == 0);
    REQUIRE(sh(bin("dsprep") + " --train-tokenizer --input " + d + "/corpus.txt --vocab-size 320 --output-dir " + d +
               "/tok") == 0);
    REQUIRE(sh(bin("dsprep") + " --input " + d + "/corpus.txt --output-prefix " + d + "/data/c --vocab-file " + d +
               "/tok/vocab.json --merge-file " + d + "/tok/merges.txt") == 0);
  }
};

Data& data() {
  static Data d;
  return d;
}

// dsrun --autotuning MODE --num_gpus 2 dstrain --config CONFIG <tiny model flags>.
RunResult autotune(const std::string& mode, const std::string& config, int port, int iters = 12) {
  const std::string d = data().dir;
  std::vector<std::string> argv = {dsrun_bin(), "--autotuning", mode, "--num_gpus", "2", "--master_port",
                                   std::to_string(port), bin("dstrain"), "--config", config,
                                   "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "2",
                                   "--seq-length", "32", "--max-position-embeddings", "32",
                                   "--micro-batch-size", "1", "--train-iters", std::to_string(iters),
                                   "--lr", "1e-3", "--log-interval", "1", "--eval-interval", "1000",
                                   "--eval-iters", "1", "--data-path", d + "/data/c", "--vocab-file",
                                   d + "/tok/vocab.json", "--merge-file", d + "/tok/merges.txt"};
  return run_cmd(argv, {{"OMP_NUM_THREADS", "1"}}, 240);
}

json session_config(const std::string& dir, bool overwrite) {
  return {{"train_batch_size", 24},
          {"train_micro_batch_size_per_gpu", "auto"},
          {"gradient_accumulation_steps", "auto"},
          {"zero_optimization", {{"stage", 0}}},
          {"autotuning",
           {{"enabled", true},
            {"start_profile_step", 2},
            {"end_profile_step", 4},
            {"tuner_early_stopping", 0},
            {"overwrite", overwrite},
            {"results_dir", dir + "/results"},
            {"exps_dir", dir + "/exps"},
            // The estimate of micro batch 24 on one pipeline stage's rank is
            // about 9.3 MiB, micro batch 8 about 3.5 MiB: 6 MiB prunes the first.
            {"memory_per_process_gb", 0.006},
            {"memory_overhead_gb", 0},
            {"tuning_space",
             {{"zero_stage", {0, 1}},
              {"pipeline_model_parallel_size", {1, 2}},
              {"virtual_pipeline_stages", {1, 2}},
              {"micro_batch_size", {2, 8, 24}}}}}}};
}

// The trainer's start-up line for an experiment's configuration (2 ranks).
std::string fmt_batch(const json& c) {
  const int dp = 2 / (c.at("pipeline_model_parallel_size").get<int>() * c.at("tensor_model_parallel_size").get<int>());
  return "batch: global " + std::to_string(c.at("train_batch_size").get<int>()) + " = micro " +
         std::to_string(c.at("train_micro_batch_size_per_gpu").get<int>()) + " x grad accum " +
         std::to_string(c.at("gradient_accumulation_steps").get<int>()) + " x data parallel " + std::to_string(dp);
}

}  // namespace

TEST_CASE("tune prunes, survives a failing experiment and picks the best; run trains with it") {
  const std::string dir = data().dir + "/session";
  fs::create_directories(dir);
  const std::string cfg = dir + "/ds.json";
  write_file(cfg, session_config(dir, false).dump(2));
  const int port = free_port();
  RunResult r = autotune("tune", cfg, port);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const json summary = json::parse(read_file(dir + "/results/summary.json"));
  const json& exps = summary.at("experiments");
  int ok = 0, pruned = 0, failed = 0, after_failure = 0;
  const json* best = nullptr;
  double best_metric = -1;
  for (const json& e : exps) {
    const std::string status = e.at("status"), name = e.at("name");
    const std::string exp = dir + "/exps/" + name;
    if (failed > 0 && status == "ok") ++after_failure;
    if (status == "ok") {
      ++ok;
      CHECK(fs::exists(exp + "/metrics.json"));
      CHECK(e.at("estimated_bytes").get<double>() <= 0.006 * (1 << 30));
      CHECK(e.at("peak_bytes").get<int64_t>() > 0);
      if (e.at("metric").get<double>() > best_metric) best_metric = e.at("metric"), best = &e;
    } else if (status == "pruned") {
      ++pruned;
      CHECK(e.at("config").at("train_micro_batch_size_per_gpu") == 24);
      CHECK(e.at("estimated_bytes").get<double>() > 0.006 * (1 << 30));
      CHECK_FALSE(fs::exists(exp + "/stdout.log"));  // never launched
      CHECK_FALSE(fs::exists(exp + "/metrics.json"));
    } else {
      // The interleaved schedule needs the micro-batch count to be a multiple of PP.
      CHECK(status == "failed");
      CHECK(e.at("config").at("virtual_pipeline_stages") == 2);
      CHECK(e.at("config").at("gradient_accumulation_steps").get<int>() % 2 == 1);
      CHECK_THAT(e.at("reason").get<std::string>(), Catch::Contains("not divisible by pipeline-model-parallel-size"));
      CHECK(fs::exists(exp + "/stderr.log"));
      ++failed;
    }
  }
  CHECK(ok >= 6);
  CHECK(pruned >= 2);
  CHECK(failed == 2);  // ZeRO 0 and 1
  CHECK(after_failure >= 1);  // the search went on
  REQUIRE(best != nullptr);
  CHECK(best->at("best") == true);
  CHECK(exps.at(0).at("default") == true);
  // ds_config_optimal.json is the best experiment's configuration, and the command uses it.
  const json optimal = json::parse(read_file(dir + "/results/ds_config_optimal.json"));
  const json& bc = best->at("config");
  CHECK(optimal.at("train_micro_batch_size_per_gpu") == bc.at("train_micro_batch_size_per_gpu"));
  CHECK(optimal.at("zero_optimization").at("stage") == bc.at("zero_stage"));
  CHECK(optimal.at("parallel").at("pipeline_model_parallel_size") == bc.at("pipeline_model_parallel_size"));
  CHECK_FALSE(optimal.contains("autotuning"));
  const std::string cmd = read_file(dir + "/results/cmd_optimal.txt");
  CHECK_THAT(cmd, Catch::Contains("ds_config_optimal.json") && Catch::Contains("--num_gpus 2") &&
                      !Catch::Contains("--autotuning") && !Catch::Contains("--micro-batch-size"));
  CHECK_THAT(read_file(dir + "/results/summary.txt"), Catch::Contains("BEST") && Catch::Contains("pruned"));

  // run: the earlier measurements are reused (overwrite false), then the best trains for 6 iterations.
  RunResult run = autotune("run", cfg, port, 6);
  INFO(run.out << run.err);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.err, Catch::Contains("launching the best configuration"));
  CHECK_THAT(run.out, Catch::Contains("iteration        6/       6"));
  CHECK_THAT(run.out, Catch::Contains(fmt_batch(bc)));
}

TEST_CASE("user errors are one line naming the input") {
  const std::string dir = data().dir + "/errors";
  fs::create_directories(dir);
  const int port = free_port();
  RunResult r = run_cmd({dsrun_bin(), "--autotuning", "bogus", bin("dstrain"), "--config", "x.json"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("--autotuning"));
  write_file(dir + "/plain.json", R"({"train_batch_size": 8})");
  r = autotune("tune", dir + "/plain.json", port);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("dsrun: error:") && Catch::Contains("'autotuning' section"));
  write_file(dir + "/typo.json", R"({"train_batch_size": 8, "autotuning": {"enabled": true, "tunner_type": "random"}})");
  r = autotune("tune", dir + "/typo.json", port);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("'autotuning.tunner_type'"));
  r = run_cmd({dsrun_bin(), "--autotuning", "tune", "--num_gpus", "2", bin("dstrain"), "--lr", "1"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("--config FILE"));
  std::string lines = r.err;
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 1);
  // A space whose every candidate is invalid (micro batches 5 and 7 never divide 24 over DP 2): no BEST
  // default, no experiment run, one line saying why.
  json none = session_config(dir, true);
  none["autotuning"]["tuning_space"] = {{"micro_batch_size", {5, 7}}};
  write_file(dir + "/none.json", none.dump());
  r = autotune("tune", dir + "/none.json", port);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("every candidate of autotuning.tuning_space was dropped") &&
                        Catch::Contains("does not divide train_batch_size 24"));
  CHECK_THAT(r.out, !Catch::Contains("BEST"));
  CHECK_FALSE(fs::exists(dir + "/results/summary.txt"));
}
