// --cuda-graph on the device (docs/cuda.md, "CUDA graphs"): the step captured
// after the warm-up and replayed must give the eager run's losses bit for bit
// (the same kernels in the same order on the same data) in fp32 and bf16,
// with GPT-2 and LLaMA blocks, also when the schedule changes the learning
// rate every step and clipping is active (both applied by the eager update
// after the read), and across an evaluation (the graph is dropped and
// captured again). A replay synchronises the host once (the read), and the
// capture happens at iteration warm-up + 1. Skipped (exit 77) without a device.
#include <catch2/catch.hpp>

#include <cstring>

#include "cuda/cuda_api.h"
#include "test/skip.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

struct Run {
  std::vector<float> losses;
  int64_t captured_at = 0, captures = 0, replays = 0, syncs = -1;
};

Run run(std::vector<std::string> flags) {
  Trainer t(make_config(std::move(flags)), single_process());
  Run r;
  r.losses = t.run();
  r.captured_at = t.graph_captured_at();
  r.captures = t.graph_captures();
  r.replays = t.graph_replays();
  r.syncs = t.profiled_host_syncs();
  return r;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void require_same(const std::vector<float>& eager, const std::vector<float>& graph) {
  REQUIRE(eager.size() == graph.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("iteration " << i + 1 << ": eager " << eager[i] << ", graph " << graph[i]);
    CHECK(std::isfinite(graph[i]));
    CHECK(std::memcmp(&eager[i], &graph[i], sizeof(float)) == 0);
  }
}

// Dropout off (its keys change every step; --cuda-graph refuses it); two
// micro-batches per step (the fixture's global batch 8 of micro-batches of 4).
const std::vector<std::string> kBase = {"--device", "cuda", "--train-iters", "10", "--hidden-dropout", "0",
                                        "--attention-dropout", "0"};

}  // namespace

TEST_CASE("a replayed step equals the eager step bit for bit (fp32, bf16; GPT-2 and LLaMA blocks)", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  for (const char* precision : {"fp32", "bf16"}) {
    for (bool llama : {false, true}) {
      INFO(precision << (llama ? " llama" : " gpt-2"));
      std::vector<std::string> f = kBase;
      if (std::string(precision) == "bf16") f.push_back("--bf16");
      if (llama) f = plus(f, llama_flags());
      const Run eager = run(f);
      const Run graph = run(plus(f, {"--cuda-graph"}));
      require_same(eager.losses, graph.losses);
      CHECK(eager.captures == 0);
      CHECK(graph.captured_at == 3);  // steps 1 and 2 eager (the default warm-up), step 3 captured
      CHECK(graph.captures == 1);
      CHECK(graph.replays == 8);  // steps 3..10
    }
  }
}

TEST_CASE("a replay synchronises the host once; the capture follows the warm-up", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::string dir = (fixture().dir / "graph_profile").string();
  fs::create_directories(dir);
  const Run r = run(plus(kBase, {"--bf16", "--cuda-graph", "--cuda-graph-warmup-steps", "3", "--profile",
                                 "--profile-dir", dir}));
  CHECK(r.captured_at == 4);
  CHECK(r.replays == 7);
  CHECK(r.syncs == 1);  // the profiled step (5) is a replay: only the packed read waits
}

TEST_CASE("a schedule that changes every step and active clipping still match eager", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  // Warm-up over 4 steps then cosine decay; a clip far below the norm of a
  // fresh model, so every update is clipped; one eager step before the capture.
  const std::vector<std::string> f = plus(kBase, {"--bf16", "--lr-warmup-iters", "4", "--lr-decay-style", "cosine",
                                                  "--clip-grad", "0.05", "--weight-decay", "0.1"});
  const Run eager = run(f);
  const Run graph = run(plus(f, {"--cuda-graph", "--cuda-graph-warmup-steps", "1"}));
  require_same(eager.losses, graph.losses);
  CHECK(graph.captured_at == 2);
  CHECK(graph.replays == 9);
}

TEST_CASE("an evaluation drops the graph; the next step captures again and the curve is unchanged", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::vector<std::string> f = plus(kBase, {"--eval-interval", "4", "--eval-iters", "2", "--split", "90,10,0"});
  const Run eager = run(f);
  const Run graph = run(plus(f, {"--cuda-graph"}));
  require_same(eager.losses, graph.losses);
  CHECK(graph.captures == 3);      // at step 3, and after the evaluations at steps 4 and 8
  CHECK(graph.captured_at == 9);   // the last capture
  CHECK(graph.replays == 8);       // every step from 3 on
}
