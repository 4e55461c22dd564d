// bf16 / fp16 mixed precision in the trainer, on the CPU backend (ops read
// low-precision tensors, compute in f32 and round what they write, as the CUDA
// kernels do): loss curves track fp32, fp16 dynamic loss scaling skips
// overflowing steps with DeepSpeed's rules (Adam's step count counts the
// applied steps), resume is exact, ZeRO stores give the same numbers as the
// flat store.
#include <catch2/catch.hpp>

#include <cmath>

#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

struct Run {
  std::vector<float> losses;
  TrainState state;
  int64_t adam_steps = 0;
};

Run run(std::vector<std::string> extra) {
  Trainer t(make_config(std::move(extra)), single_process());
  Run r;
  r.losses = t.run();
  r.state = t.state();
  r.adam_steps = t.optimizer_steps();
  return r;
}

// Largest per-step relative difference of b against a.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(b[i]) - a[i]) / std::abs(double(a[i])));
  return m;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("bf16 and fp16 loss curves track fp32 (gpt2 and llama)", "[bf16]") {
  for (bool llama : {false, true}) {
    std::vector<std::string> base = {"--train-iters", "30"};
    if (llama) base = with(base, llama_flags());
    const Run f32 = run(base);
    const Run bf = run(with(base, {"--bf16"}));
    // A loss scale that never overflows here: fp16 then differs from fp32 by rounding only.
    const Run fp = run(with(base, {"--fp16", "--initial-loss-scale", "256"}));
    INFO((llama ? "llama" : "gpt2") << ": fp32 " << f32.losses.front() << " -> " << f32.losses.back() << ", bf16 "
                                   << bf.losses.back() << ", fp16 " << fp.losses.back());
    REQUIRE(fp.state.skipped_steps == 0);
    REQUIRE(bf.losses != f32.losses);  // really computed in low precision
    REQUIRE(fp.losses != f32.losses);
    CHECK(max_rel_diff(f32.losses, bf.losses) < 0.03);
    CHECK(max_rel_diff(f32.losses, fp.losses) < 0.01);
    REQUIRE(bf.losses.back() < bf.losses.front() - 0.5f);
  }
}

TEST_CASE("a bf16 curve stays within 2% of fp32 over 300 steps", "[bf16]") {
  // The issue's bar for the CPU's bf16 (native bf16 matmuls where the CPU has
  // them; test_train_bf16_f32 runs this with the emulated fallback).
  const std::vector<std::string> base = {"--train-iters", "300"};
  const Run f32 = run(base);
  const Run bf = run(with(base, {"--bf16"}));
  const double d = max_rel_diff(f32.losses, bf.losses);
  INFO("fp32 " << f32.losses.front() << " -> " << f32.losses.back() << ", bf16 " << bf.losses.back()
               << ", largest relative difference " << d);
  REQUIRE(bf.losses != f32.losses);
  CHECK(d < 0.02);
  REQUIRE(bf.losses.back() < bf.losses.front() - 1.0f);
}

TEST_CASE("fp16 dynamic loss scaling skips overflowing steps and lowers the scale") {
  // 2^30 overflows f16 in the logits gradient: the first steps are skipped
  // (the first one only spends the hysteresis), the scale halves until the
  // gradients fit, then training proceeds.
  const Run r = run({"--train-iters", "40", "--fp16", "--initial-loss-scale", "1073741824", "--hysteresis", "2"});
  INFO("skipped " << r.state.skipped_steps << ", final scale " << r.state.loss_scale);
  REQUIRE(r.state.skipped_steps >= 3);
  REQUIRE(r.state.skipped_steps < 30);
  // hysteresis 2: one overflow spends it, every later one halves.
  REQUIRE(r.state.loss_scale == std::ldexp(1.0, 30 - static_cast<int>(r.state.skipped_steps - 1)));
  // The update is gated on the device (one process): Adam counts the applied steps only.
  REQUIRE(r.adam_steps == 40 - r.state.skipped_steps);
  REQUIRE(std::isfinite(r.losses.back()));
  REQUIRE(r.losses.back() < r.losses.front() - 0.5f);
  // A static scale never moves; overflowing steps are still skipped.
  const Run s = run({"--train-iters", "6", "--fp16", "--loss-scale", "1073741824"});
  REQUIRE(s.state.skipped_steps == 6);
  REQUIRE(s.adam_steps == 0);
  REQUIRE(s.state.loss_scale == 1073741824.0);
}

TEST_CASE("fp16 loss scale rises after a window of good steps") {
  const Run r = run({"--train-iters", "9", "--fp16", "--initial-loss-scale", "16", "--loss-scale-window", "4"});
  REQUIRE(r.state.skipped_steps == 0);
  REQUIRE(r.state.loss_scale == 64.0);  // 16 * 2 * 2 after steps 4 and 8
  REQUIRE(r.state.good_steps == 1);
}

TEST_CASE("fp16 and bf16 resume continue bit for bit, loss scaler state included", "[bf16]") {
  for (const char* prec : {"--fp16", "--bf16"}) {
    fs::path ck = fixture().dir / (std::string("ckpt_mp") + prec);
    fs::remove_all(ck);
    // Scale 2^24 overflows at first: the scaler is mid-way (skips, then raises) at the save.
    std::vector<std::string> base = {"--train-iters", "10", prec};
    const bool fp16 = std::string(prec) == "--fp16";
    if (fp16) base = with(base, {"--initial-loss-scale", "16777216", "--loss-scale-window", "3"});
    const Run full = run(base);
    const Run first = run(with(base, {"--exit-interval", "5", "--save", ck.string(), "--save-interval", "5"}));
    const Run second = run(with(base, {"--load", ck.string()}));
    std::vector<float> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    INFO(prec << ": skipped " << full.state.skipped_steps);
    REQUIRE((full.state.skipped_steps > 0) == fp16);
    REQUIRE(joined == full.losses);
    REQUIRE(second.state.loss_scale == full.state.loss_scale);
    REQUIRE(second.state.skipped_steps == full.state.skipped_steps);
    REQUIRE(second.adam_steps == full.adam_steps);
  }
}

TEST_CASE("load_from_fp32_weights false: the master weights resume from the 16-bit weights where DeepSpeed does",
          "[bf16]") {
  // The first step after the load sees the same 16-bit weights either way
  // (the model's copy is the rounded master); the updates then start from
  // the rounded masters, so later losses move off the exact resume. Where
  // DeepSpeed never reads the key (fp32, fp16 at stage 0, stage 3) the
  // resume stays exact.
  struct Case {
    std::vector<std::string> flags;
    bool rounds;
  };
  const std::vector<Case> cases = {{{"--bf16", "--zero-stage", "1"}, true},
                                   {{"--fp16", "--zero-stage", "2"}, true},
                                   {{"--bf16"}, true},
                                   {{"--fp16"}, false},
                                   {{"--bf16", "--zero-stage", "3"}, false},
                                   {{"--zero-stage", "1"}, false}};
  const fs::path cfg = fixture().dir / "masters_from_16bit.json";
  std::ofstream(cfg) << R"({"zero_optimization": {"load_from_fp32_weights": false}})";
  for (const Case& c : cases) {
    std::string name = "ckpt_from16";
    for (const std::string& f : c.flags) name += f;
    INFO(name);
    const fs::path ck = fixture().dir / name;
    fs::remove_all(ck);
    const std::vector<std::string> base = with({"--train-iters", "8", "--config", cfg.string()}, c.flags);
    const Run full = run(base);
    (void)run(with(base, {"--exit-interval", "4", "--save", ck.string(), "--save-interval", "4"}));
    const Run resumed = run(with(base, {"--load", ck.string()}));
    const std::vector<float> tail(full.losses.begin() + 4, full.losses.end());
    REQUIRE(resumed.losses.size() == tail.size());
    CHECK(resumed.losses[0] == tail[0]);
    if (c.rounds)
      CHECK(resumed.losses != tail);
    else
      CHECK(resumed.losses == tail);
  }
}

TEST_CASE("bf16 with ZeRO stages 1-3 on one rank equals the flat store bit for bit", "[bf16]") {
  const std::vector<std::string> base = {"--train-iters", "6", "--bf16"};
  const Run flat = run(base);
  for (const char* stage : {"1", "2", "3"}) {
    INFO("stage " << stage);
    REQUIRE(run(with(base, {"--zero-stage", stage})).losses == flat.losses);
  }
  // Stage 3 with nothing persistent: every unit is gathered in f32 and cast on use.
  const fs::path cfg = fixture().dir / "zero3_gather_all.json";
  std::ofstream(cfg) << R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})";
  REQUIRE(run(with(base, {"--config", cfg.string()})).losses == flat.losses);
}
