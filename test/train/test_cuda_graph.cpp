// --cuda-graph on the device (docs/cuda.md, "CUDA graphs"): the step captured
// after the warm-up, AdamW update included, and replayed must give the eager
// run's losses and final weights, Adam moments and step count bit for bit
// (the eager single-GPU step is the same work: the update gated on the
// device, docs/distributed.md) in fp32, bf16 and fp16, with GPT-2 and LLaMA
// blocks, also when the schedule changes the learning rate every step and
// clipping is active (the step scalars the host writes before each replay,
// the clip coefficient the graph computes), when steps are skipped on
// non-finite values (the graph's gate; Adam's step count and the
// skipped-step count stay in line), with hidden and attention dropout (each
// micro-batch's key {iteration, first sample} copied into the graph from a
// pinned buffer), across an evaluation (the graph is dropped and captured
// again), across a checkpoint and resume, and in fp16 with a dynamic loss
// scale that changes between replays (read from the step block) or a static
// one. A replay synchronises the host once (the read) and submits nothing
// outside the graph but its launch and that read (counted with CUPTI).
// Skipped (exit 77) without a device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/cuda_api.h"
#include "test/dist/curve_check.h"
#include "test/skip.h"
#include "test/train/launch_counter.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

struct Run {
  std::vector<float> losses;
  int64_t captured_at = 0, captures = 0, replays = 0, syncs = -1;
  int64_t iteration = 0, skipped = 0, adam_steps = 0;
  double loss_scale = 0;
};

Run run(std::vector<std::string> flags, LaunchCounts* launches = nullptr) {
  Trainer t(make_config(std::move(flags)), single_process());
  Run r;
  if (launches) {  // run() only: the construction's uploads and initialisation are not counted
    LaunchCounter counter;
    r.losses = t.run();
    *launches = counter.counts();
  } else {
    r.losses = t.run();
  }
  r.captured_at = t.graph_captured_at();
  r.captures = t.graph_captures();
  r.replays = t.graph_replays();
  r.syncs = t.profiled_host_syncs();
  r.iteration = t.state().iteration;
  r.skipped = t.state().skipped_steps;
  r.adam_steps = t.optimizer_steps();
  r.loss_scale = t.state().loss_scale;
  return r;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Bit for bit, NaN and Inf included (a skipped step's loss).
void require_same(const std::vector<float>& eager, const std::vector<float>& graph) {
  REQUIRE(eager.size() == graph.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("iteration " << i + 1 << ": eager " << eager[i] << ", graph " << graph[i]);
    CHECK(std::memcmp(&eager[i], &graph[i], sizeof(float)) == 0);
  }
}

void require_finite(const std::vector<float>& losses) {
  for (size_t i = 0; i < losses.size(); ++i) {
    INFO("iteration " << i + 1);
    CHECK(std::isfinite(losses[i]));
  }
}

// The weights and the optimizer shard (Adam's m, v and step count) of the
// checkpoint `step` under two save directories, byte for byte.
void require_same_checkpoint(const fs::path& a, const fs::path& b, const std::string& step) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(a / step)) {
    if (e.path().extension() != ".safetensors") continue;
    INFO(e.path().filename().string());
    REQUIRE(fs::exists(b / step / e.path().filename()));
    CHECK(read_bytes(e.path()) == read_bytes(b / step / e.path().filename()));
    ++n;
  }
  CHECK(n >= 2);  // model.safetensors and the optimizer shard
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fixture().dir / name;
  fs::remove_all(d);
  return d;
}

// Dropout off (a case below turns it on); two micro-batches per step (the
// fixture's global batch 8 of micro-batches of 4).
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
      const fs::path ck_eager = fresh_dir("graph_eq_eager"), ck_graph = fresh_dir("graph_eq_graph");
      const Run eager = run(plus(f, {"--save", ck_eager.string()}));
      const Run graph = run(plus(f, {"--cuda-graph", "--save", ck_graph.string()}));
      require_finite(graph.losses);
      require_same(eager.losses, graph.losses);
      require_same_checkpoint(ck_eager, ck_graph, "global_step10");
      CHECK(eager.captures == 0);
      CHECK(graph.captured_at == 3);  // steps 1 and 2 eager (the default warm-up), step 3 captured
      CHECK(graph.captures == 1);
      CHECK(graph.replays == 8);  // steps 3..10
      CHECK(graph.adam_steps == 10);
    }
  }
}

TEST_CASE("with hidden and attention dropout a replayed step equals the eager step bit for bit", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  struct Variant {
    const char* name;
    std::vector<std::string> flags;
  };
  const std::vector<std::string> dropout = {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"};
  for (const Variant& v : {Variant{"bf16 gpt-2 flash", {"--bf16", "--attention-backend", "flash"}},
                           Variant{"bf16 llama flash2", plus(llama_flags(), {"--bf16", "--attention-backend", "flash2"})},
                           Variant{"fp32 gpt-2 plain", {"--attention-backend", "plain"}}}) {
    INFO(v.name);
    const std::vector<std::string> f = plus(plus(kBase, v.flags), dropout);
    const fs::path ck_eager = fresh_dir("graph_drop_eager"), ck_graph = fresh_dir("graph_drop_graph");
    const Run eager = run(plus(f, {"--save", ck_eager.string()}));
    const Run graph = run(plus(f, {"--cuda-graph", "--save", ck_graph.string()}));
    require_finite(graph.losses);
    require_same(eager.losses, graph.losses);
    require_same_checkpoint(ck_eager, ck_graph, "global_step10");
    CHECK(graph.captured_at == 3);
    CHECK(graph.replays == 8);
    // Dropout is really on: the curve differs from the dropout-0 one.
    const Run off = run(plus(kBase, v.flags));
    CHECK(off.losses != eager.losses);
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
  CHECK(r.syncs == 1);  // the profiled step (5) is a replay: only the read of the step block waits
}

TEST_CASE("a replay submits one graph launch and one read, nothing else (CUPTI)", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  // Runs of 10 and 6 steps differ by 4 steps (7-10) and nothing else: the
  // same construction, warm-up, capture (step 3) and closing evaluation.
  const std::vector<std::string> f = {"--device", "cuda", "--bf16", "--hidden-dropout", "0", "--attention-dropout",
                                      "0"};
  auto per_step = [&](const std::vector<std::string>& extra) {
    LaunchCounts longer, shorter;
    run(plus(f, plus(extra, {"--train-iters", "10"})), &longer);
    run(plus(f, plus(extra, {"--train-iters", "6"})), &shorter);
    return longer - shorter;
  };
  const LaunchCounts replays = per_step({"--cuda-graph"}), eager = per_step({});
  std::printf("launches in 4 steps: replayed: %s; eager: %s\n", replays.str().c_str(), eager.str().c_str());
  INFO("4 replayed steps: " << replays.str() << "; 4 eager steps: " << eager.str());
  CHECK(replays.graphs == 4);
  CHECK(replays.sync_copies == 4);  // the read of the step block
  CHECK(replays.kernels == 0);
  CHECK(replays.driver_kernels == 0);
  CHECK(replays.memsets == 0);
  CHECK(replays.async_copies == 0);
  // The counter sees the eager steps' work: every op's kernels and the
  // uploads (per step: 2 micro-batches' tokens and targets, the step scalars).
  CHECK(eager.kernels + eager.driver_kernels > 4 * 20);
  CHECK(eager.async_copies >= 4 * 5);
  CHECK(eager.graphs == 0);
}

TEST_CASE("a schedule that changes every step and active clipping still match eager", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  // Warm-up over 4 steps then cosine decay; a clip far below the norm of a
  // fresh model, so every update is clipped; one eager step before the capture.
  const std::vector<std::string> f = plus(kBase, {"--bf16", "--lr-warmup-iters", "4", "--lr-decay-style", "cosine",
                                                  "--weight-decay", "0.1"});
  const std::vector<std::string> clipped = plus(f, {"--clip-grad", "0.05"});
  const fs::path ck_eager = fresh_dir("graph_clip_eager"), ck_graph = fresh_dir("graph_clip_graph");
  const Run eager = run(plus(clipped, {"--save", ck_eager.string()}));
  const Run graph = run(plus(clipped, {"--cuda-graph", "--cuda-graph-warmup-steps", "1", "--save", ck_graph.string()}));
  require_finite(graph.losses);
  require_same(eager.losses, graph.losses);
  require_same_checkpoint(ck_eager, ck_graph, "global_step10");
  CHECK(graph.captured_at == 2);
  CHECK(graph.replays == 9);
  // The clip acted: without it the curve is another one.
  const Run unclipped = run(plus(f, {"--clip-grad", "0", "--cuda-graph"}));
  CHECK(unclipped.losses != graph.losses);
}

TEST_CASE("steps skipped on non-finite values inside the graph: counts, step count and curve match eager", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  // An absurd learning rate: step 1 applies it, later steps meet NaN/Inf and
  // are skipped by the gate (in the warm-up step 2 and in the replays).
  const std::vector<std::string> f = plus(kBase, {"--lr", "1e20", "--lr-warmup-iters", "0", "--clip-grad", "0",
                                                  "--max-nan-iterations", "100"});
  const Run eager = run(f);
  const Run graph = run(plus(f, {"--cuda-graph"}));
  require_same(eager.losses, graph.losses);
  INFO("eager: " << eager.skipped << " skipped; graph: " << graph.skipped << " skipped");
  CHECK(graph.skipped > 0);
  CHECK(graph.skipped == eager.skipped);
  CHECK(graph.iteration == 10);
  CHECK(graph.adam_steps == eager.adam_steps);
  CHECK(graph.adam_steps == graph.iteration - graph.skipped);
  CHECK(graph.replays == 8);
}

TEST_CASE("fp16: a dynamic loss scale that moves inside the replays, and a static one, match eager", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  // 2^24 overflows at first: after the hysteresis the scale halves on every
  // overflowing step (skipped by the graph's gate), then rises after every 3
  // good steps; the scale reaches the replays only through the step block.
  // On the CPU backend the same run skips 4 of its 12 steps.
  const std::vector<std::string> dyn =
      plus(kBase, {"--fp16", "--train-iters", "12", "--initial-loss-scale", "16777216", "--loss-scale-window", "3"});
  const fs::path ck_eager = fresh_dir("graph_fp16_eager"), ck_graph = fresh_dir("graph_fp16_graph");
  const Run eager = run(plus(dyn, {"--save", ck_eager.string()}));
  const Run graph = run(plus(dyn, {"--cuda-graph", "--save", ck_graph.string()}));
  require_same(eager.losses, graph.losses);
  require_same_checkpoint(ck_eager, ck_graph, "global_step12");
  INFO("eager: " << eager.skipped << " skipped, scale " << eager.loss_scale << "; graph: " << graph.skipped
                 << " skipped, scale " << graph.loss_scale);
  CHECK(graph.skipped > 2);  // overflows beyond the 2 warm-up steps: inside the captured step
  CHECK(graph.skipped == eager.skipped);
  CHECK(graph.loss_scale == eager.loss_scale);
  CHECK(graph.adam_steps == eager.adam_steps);
  CHECK(graph.adam_steps == graph.iteration - graph.skipped);
  CHECK(graph.captures == 1);
  CHECK(graph.replays == 10);
  // A static scale is a constant of the captured loss weight.
  const std::vector<std::string> fixed = plus(kBase, {"--fp16", "--loss-scale", "1024"});
  const Run se = run(fixed), sg = run(plus(fixed, {"--cuda-graph"}));
  require_finite(sg.losses);
  require_same(se.losses, sg.losses);
  CHECK(sg.replays == 8);
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

TEST_CASE("with --cuda-graph, N steps + checkpoint + resume + N steps equal 2N steps bit for bit", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::vector<std::string> f = plus(kBase, {"--bf16", "--cuda-graph", "--train-iters", "8"});
  const fs::path ck = fresh_dir("graph_resume"), ck_full = fresh_dir("graph_resume_full");
  const Run full = run(plus(f, {"--save", ck_full.string()}));
  const Run first = run(plus(f, {"--exit-interval", "4", "--save", ck.string(), "--save-interval", "4"}));
  REQUIRE(first.losses.size() == 4);
  const Run second = run(plus(f, {"--load", ck.string(), "--save", ck.string()}));
  REQUIRE(second.losses.size() == 4);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  require_same(full.losses, joined);
  require_same_checkpoint(ck_full, ck, "global_step8");
  CHECK(second.adam_steps == 8);
  CHECK(second.captured_at == 7);  // the resumed run warms up again (steps 5, 6), then captures
}
