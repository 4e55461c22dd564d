// --cuda-graph / --enable-cuda-graph / training.cuda_graph: the flags and keys,
// and every refusal (docs/cuda.md "CUDA graphs"): each conflicting option is
// named in the one error line.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "test/config/temp_dir.h"

using namespace ds;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// A small model on the GPU (dropout off): a configuration --cuda-graph accepts.
std::vector<std::string> ok_flags() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--train-iters", "10", "--data-path", "a/b_text_document", "--device", "cuda",
          "--hidden-dropout", "0", "--attention-dropout", "0", "--cuda-graph"};
}

TrainConfig parse(std::vector<std::string> extra, int world = 1, const json& file = json()) {
  test::TempDir d;
  std::vector<std::string> args = ok_flags();
  args.insert(args.end(), extra.begin(), extra.end());
  if (!file.is_null()) {
    const std::string path = d.path + "/ds_config.json";
    std::ofstream(path) << file.dump(2);
    args.insert(args.begin(), {"--config", path});
  }
  args.insert(args.begin(), "dstrain");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  return parse_train_config(static_cast<int>(args.size()), argv.data(), world);
}

// Parsing must fail with a UserError whose message contains every needle.
void refused(std::vector<std::string> extra, std::vector<std::string> needles, int world = 1,
             const json& file = json()) {
  try {
    parse(extra, world, file);
    FAIL("accepted: expected an error containing " << needles.front());
  } catch (const UserError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find('\n') == std::string::npos);  // one line
    for (const auto& n : needles) CHECK_THAT(msg, Contains(n));
  }
}

}  // namespace

TEST_CASE("--cuda-graph, its alias and its keys", "[config][cuda_graph]") {
  const TrainConfig c = parse({});
  CHECK(c.cuda_graph);
  CHECK(c.cuda_graph_warmup == 2);
  CHECK(c.resolved["training"]["cuda_graph"] == true);
  CHECK(c.resolved["training"]["cuda_graph_warmup"] == 2);
  CHECK(parse({"--enable-cuda-graph"}).cuda_graph);  // Megatron's name
  CHECK(parse({"--cuda-graph-warmup-steps", "5"}).cuda_graph_warmup == 5);
  // JSON alone (the flag list always holds --cuda-graph; the key sets the same field).
  const TrainConfig j = parse({}, 1, json{{"training", {{"cuda_graph", true}, {"cuda_graph_warmup", 3}}}});
  CHECK(j.cuda_graph);
  CHECK(j.cuda_graph_warmup == 3);
  // bf16 and fp32 are accepted, and fp16 with a dynamic loss scale whose
  // floor is a power of two (every scale it reaches is one) or a static one.
  CHECK(parse({"--bf16"}).cuda_graph);
  CHECK(parse({"--fp16"}).cuda_graph);
  CHECK(parse({"--fp16", "--min-loss-scale", "0.25"}).cuda_graph);
  CHECK(parse({"--fp16", "--loss-scale", "1000"}).cuda_graph);
}

TEST_CASE("--cuda-graph accepts hidden and attention dropout", "[config][cuda_graph]") {
  // The kernels read the dropout key's per-step part from a buffer the graph refills.
  const TrainConfig c = parse({"--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
  CHECK(c.cuda_graph);
  CHECK(c.model.hidden_dropout == 0.1f);
  CHECK(c.model.attention_dropout == 0.1f);
  CHECK(parse({"--hidden-dropout", "0.1"}).cuda_graph);
  CHECK(parse({"--attention-dropout", "0.1"}).cuda_graph);
}

TEST_CASE("--cuda-graph refuses what a replay cannot repeat, naming the option", "[config][cuda_graph]") {
  refused({"--device", "cpu"}, {"needs a GPU", "--device cuda"});
  refused({"--fp16", "--min-loss-scale", "3"}, {"--cuda-graph", "min_loss_scale", "power of two", "3"});
  refused({}, {"--cuda-graph", "min_loss_scale", "power of two", "0.1"}, 1,
          json{{"fp16", {{"enabled", true}, {"min_loss_scale", 0.1}}}});
  refused({"--attention-backend", "cudnn"}, {"--cuda-graph", "cudnn"});
  refused({"--cuda-graph-warmup-steps", "0"}, {"cuda_graph_warmup", "0"});
  refused({"--tensor-model-parallel-size", "2"}, {"--cuda-graph", "tensor parallelism"}, 2);
  refused({"--pipeline-model-parallel-size", "2"}, {"--cuda-graph", "pipeline parallelism"}, 2);
  refused({}, {"--cuda-graph", "data parallelism", "2 processes"}, 2);
  refused({}, {"--cuda-graph", "zero_optimization.stage"}, 1, json{{"zero_optimization", {{"stage", 1}}}});
  refused({}, {"--cuda-graph", "curriculum_learning"}, 1,
          json{{"curriculum_learning",
                {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8}, {"max_difficulty", 32},
                 {"schedule_type", "fixed_linear"},
                 {"schedule_config", {{"total_curriculum_step", 6}, {"difficulty_step", 8}}}}}});
  // Without --cuda-graph none of these is refused on its account.
  std::vector<std::string> f = ok_flags();
  f.pop_back();
  f.insert(f.begin(), "dstrain");
  f.insert(f.end(), {"--fp16", "--min-loss-scale", "3"});
  std::vector<char*> argv;
  for (auto& s : f) argv.push_back(s.data());
  argv.push_back(nullptr);
  CHECK_FALSE(parse_train_config(static_cast<int>(f.size()), argv.data(), 1).cuda_graph);
}
