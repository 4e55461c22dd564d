// Data parallelism and ZeRO: the loss curve of 1 process equals that of 2 and
// 4 processes with ZeRO stages 0, 1 and 2 at the same global batch (relative
// 1e-5, fp32), and a ZeRO-2 checkpoint saved with DP=2 resumes with DP=4 on
// the same curve.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 20;

// Writes a config with a CSV monitor under `name`, runs it, returns rank 0's losses.
std::vector<double> run_layout(const std::string& name, int world, int zero_stage, int micro,
                               std::vector<std::string> extra = {}) {
  const DistData& d = dist_data();
  std::string cfg = d.dir + "/" + name + ".json";
  {
    std::ofstream f(cfg);
    f << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": " << micro
      << ", \"zero_optimization\": {\"stage\": " << zero_stage << ", \"reduce_bucket_size\": 5000},"
      << " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << d.dir << "/csv\", \"job_name\": \"" << name
      << "\"}}";
  }
  std::vector<std::string> args = {"--config", cfg, "--num-layers", "2", "--hidden-size", "32",
                                   "--num-attention-heads", "2", "--seq-length", "32",
                                   "--max-position-embeddings", "32", "--train-iters", std::to_string(kIters),
                                   "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
                                   "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
                                   "--data-path", d.data_prefix, "--vocab-file", d.vocab, "--merge-file", d.merges};
  args.insert(args.end(), extra.begin(), extra.end());
  std::string err = run_dstrain({world, args});
  INFO(err);
  REQUIRE(err.empty());
  return read_losses(d.dir + "/csv/" + name + "/train.csv");
}

void require_same_curve(const std::vector<double>& ref, const std::vector<double>& got, size_t offset = 0) {
  REQUIRE(!got.empty());
  REQUIRE(got.size() + offset <= ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("iteration " << i + offset + 1 << ": reference " << ref[i + offset] << " got " << got[i]);
    REQUIRE(std::abs(got[i] - ref[i + offset]) <= 1e-5 * std::abs(ref[i + offset]));
  }
}

const std::vector<double>& single() {
  static std::vector<double> l = run_layout("single", 1, 0, 2);
  return l;
}

}  // namespace

TEST_CASE("DP=2 and DP=4 with ZeRO 0/1/2 match a single process") {
  REQUIRE(single().size() == kIters);
  REQUIRE(single().back() < single().front() - 0.5);  // the model learns
  for (int stage : {0, 1, 2}) {
    INFO("DP=2 ZeRO-" << stage);
    std::vector<double> l = run_layout("dp2_z" + std::to_string(stage), 2, stage, 2);
    REQUIRE(l.size() == kIters);
    require_same_curve(single(), l);
  }
  for (int stage : {1, 2}) {
    INFO("DP=4 ZeRO-" << stage);
    std::vector<double> l = run_layout("dp4_z" + std::to_string(stage), 4, stage, 1);
    REQUIRE(l.size() == kIters);
    require_same_curve(single(), l);
  }
}

TEST_CASE("a ZeRO-2 checkpoint from DP=2 resumes with DP=4 on the same curve") {
  std::string ck = dist_data().dir + "/ckpt_dp2";
  fs::remove_all(ck);
  std::vector<double> first =
      run_layout("resume_a", 2, 2, 2, {"--save", ck, "--save-interval", "10", "--exit-interval", "10"});
  REQUIRE(first.size() == 10);
  require_same_curve(single(), first);
  REQUIRE(fs::exists(ck + "/global_step10/optim_rank00001_of_00002.safetensors"));
  std::vector<double> second = run_layout("resume_b", 4, 2, 1, {"--load", ck});
  REQUIRE(second.size() == 10);
  require_same_curve(single(), second, 10);
}
