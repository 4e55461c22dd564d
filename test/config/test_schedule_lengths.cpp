// Sample- and token-based training lengths (Megatron's --train-samples,
// Megatron-DeepSpeed's --train-tokens, --lr-warmup/decay-samples/tokens):
// parsing with Megatron's exclusivity rules, and the learning rate on the
// LrClock against a transcription of Megatron-DeepSpeed's scheduler.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <tuple>
#include <unistd.h>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/optim/lr_schedule.h"

using namespace ds;
using Catch::Matchers::Contains;

namespace {

TrainConfig parse_flags(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"dstrain", "--micro-batch-size", "2", "--global-batch-size", "8"});
  std::vector<char*> argv;
  for (auto& a : flags) argv.push_back(a.data());
  return parse_train_config(static_cast<int>(argv.size()), argv.data(), 1);
}

// OptimizerParamScheduler of Megatron-DeepSpeed, transcribed step by step
// (get_lr with its lr_warmup_tokens side effect, and step(increment)).
struct MegatronScheduler {
  double max_lr, min_lr;
  double warmup_steps, decay_steps;   // in samples
  double warmup_tokens, decay_tokens;  // < 0: None
  std::string style;
  double num_steps = 0, num_tokens = 0;

  double get_lr() {
    if (warmup_tokens < 0) {
      if (warmup_steps > 0 && num_steps <= warmup_steps) {
        if (num_steps == warmup_steps && decay_tokens >= 0) warmup_tokens = num_tokens;
        return max_lr * num_steps / warmup_steps;
      }
    } else if (warmup_tokens > 0 && num_tokens <= warmup_tokens) {
      return max_lr * num_tokens / warmup_tokens;
    }
    if (style == "constant") return max_lr;
    if (decay_tokens < 0 ? num_steps > decay_steps : num_tokens > decay_tokens) return min_lr;
    const double ratio = decay_tokens < 0 ? (num_steps - warmup_steps) / (decay_steps - warmup_steps)
                                          : (num_tokens - warmup_tokens) / (decay_tokens - warmup_tokens);
    const double coeff = style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
    return min_lr + coeff * (max_lr - min_lr);
  }
  // Megatron-DeepSpeed calls step() after the optimizer step, before the
  // iteration's tokens are added to consumed_train_tokens.
  double step(double increment, double tokens) {
    num_tokens = tokens;
    num_steps += increment;
    return get_lr();
  }
};

// Runs both for `iters` iterations of `gbs` samples of `seq` tokens, with the
// iterations in `skipped` not applied (an fp16 overflow), comparing each lr.
void compare(const OptimizerConfig& o, MegatronScheduler ref, int64_t iters, int64_t gbs, int64_t seq,
             std::vector<int64_t> skipped = {}) {
  LrClock clock;
  double ref_lr = ref.step(0, 0);
  int64_t consumed_tokens = 0;
  for (int64_t it = 0; it < iters; ++it) {
    INFO("iteration " << it);
    CHECK(lr_at(o, clock) == Approx(ref_lr).epsilon(1e-6).margin(1e-12));
    if (std::find(skipped.begin(), skipped.end(), it) == skipped.end()) {
      advance_lr_clock(o, clock, gbs, consumed_tokens);
      ref_lr = ref.step(static_cast<double>(gbs), static_cast<double>(consumed_tokens));
    }
    consumed_tokens += gbs * seq;
  }
}

}  // namespace

TEST_CASE("sample-based training: train iters, lengths, round trip", "[config][lr]") {
  TrainConfig c = parse_flags({"--train-samples", "1003", "--lr-warmup-samples", "80", "--lr-decay-style", "linear"});
  CHECK(c.train_iters == 125);  // 1003 / 8, the partial batch dropped as Megatron does
  CHECK(c.optim.decay_samples == 1003);
  CHECK(c.optim.warmup_samples == 80);
  CHECK(c.optim.warmup_tokens == -1);
  CHECK(train_config_from_json(c.resolved, 1).resolved == c.resolved);
  CHECK_FALSE(c.resolved["training"].contains("train_iters"));
  TrainConfig d = parse_flags({"--train-samples", "1000", "--lr-decay-samples", "900", "--lr-warmup-fraction", "0.1"});
  CHECK(d.optim.decay_samples == 900);
  CHECK(d.optim.warmup_samples == 90);
  CHECK(train_config_from_json(d.resolved, 1).resolved == d.resolved);
  // Iteration-based lengths in samples: iterations x global batch.
  TrainConfig i = parse_flags({"--train-iters", "50", "--lr-warmup-iters", "5"});
  CHECK(i.optim.decay_samples == 400);
  CHECK(i.optim.warmup_samples == 40);
  TrainConfig t = parse_flags({"--train-samples", "800", "--train-tokens", "4096", "--lr-warmup-tokens", "512",
                               "--lr-decay-tokens", "8192"});
  CHECK(t.lengths.train_tokens == 4096);
  CHECK(t.optim.warmup_tokens == 512);
  CHECK(t.optim.decay_tokens == 8192);
  CHECK(train_config_from_json(t.resolved, 1).resolved == t.resolved);
  // A warmup of 0 iterations is Megatron's default and mixes with samples.
  CHECK(parse_flags({"--train-samples", "800", "--lr-warmup-iters", "0"}).train_iters == 100);
}

TEST_CASE("iteration- and sample-based lengths do not mix", "[config][lr]") {
  auto err = [](std::vector<std::string> flags, const std::string& needle) {
    CHECK_THROWS_WITH(parse_flags(flags), Contains(needle));
  };
  err({"--train-iters", "10", "--train-samples", "80"}, "give one of them");
  err({"--train-samples", "80", "--lr-decay-iters", "5"}, "--lr-decay-samples");
  err({"--train-samples", "80", "--lr-warmup-iters", "5"}, "--lr-warmup-samples");
  err({"--train-iters", "10", "--lr-decay-samples", "80"}, "needs sample-based training");
  err({"--train-iters", "10", "--lr-warmup-samples", "8"}, "needs sample-based training");
  err({"--train-samples", "80", "--lr-warmup-samples", "8", "--lr-warmup-fraction", "0.1"}, "only one of");
  err({"--train-samples", "800", "--lr-warmup-samples", "800"}, "fewer than lr decay samples");
  err({"--train-samples", "-8"}, "must be >= 0");
  err({"--train-iters", "10", "--lr-decay-tokens", "-5"}, "--lr-decay-tokens");
}

TEST_CASE("iteration-based: the clock gives exactly lr_at of the applied steps", "[lr]") {
  TrainConfig c = parse_flags({"--train-iters", "40", "--lr-warmup-iters", "6", "--lr", "1e-3", "--min-lr", "1e-5"});
  LrClock clock;
  for (int64_t it = 0; it < 40; ++it) {
    REQUIRE(lr_at(c.optim, clock) == lr_at(c.optim, it, c.train_iters));
    advance_lr_clock(c.optim, clock, 8, it * 8 * 32);
  }
}

TEST_CASE("Megatron-DeepSpeed's scheduler: samples, tokens and the mixed case", "[lr]") {
  const int64_t gbs = 8, seq = 32, tokens_per_iter = gbs * seq;
  SECTION("sample-based warmup and cosine decay") {
    TrainConfig c = parse_flags({"--train-samples", "400", "--lr-warmup-samples", "44", "--lr", "1e-3",
                                 "--min-lr", "1e-5"});
    compare(c.optim, {1e-3, 1e-5, 44, 400, -1, -1, "cosine"}, c.train_iters, gbs, seq, {7, 8});
  }
  SECTION("token-based warmup and decay (the rebase scripts)") {
    TrainConfig c = parse_flags({"--train-samples", "400", "--lr-warmup-tokens", std::to_string(3 * tokens_per_iter),
                                 "--lr-decay-tokens", std::to_string(40 * tokens_per_iter), "--lr", "6e-4",
                                 "--min-lr", "1e-6", "--lr-decay-style", "cosine"});
    compare(c.optim, {6e-4, 1e-6, 0, 400, 3.0 * tokens_per_iter, 40.0 * tokens_per_iter, "cosine"}, 50, gbs, seq,
            {2, 20});
  }
  SECTION("iteration warmup, token decay: the decay starts at the tokens where the warmup ended") {
    TrainConfig c = parse_flags({"--train-iters", "50", "--lr-warmup-iters", "4", "--lr-decay-tokens",
                                 std::to_string(30 * tokens_per_iter), "--lr-decay-style", "linear", "--lr", "1e-3"});
    compare(c.optim, {1e-3, 0, 32, 400, -1, 30.0 * tokens_per_iter, "linear"}, 50, gbs, seq, {1});
  }
}

TEST_CASE("a repeated flag: the last one wins, as with argparse", "[config]") {
  TrainConfig c = parse_flags({"--train-iters", "10", "--lr", "1e-3", "--train-iters", "20", "--lr", "2e-3",
                               "--data-path", "a", "--data-path", "1", "b", "2", "c", "--seed", "7"});
  CHECK(c.train_iters == 20);
  CHECK(c.optim.lr == 2e-3f);
  CHECK(c.data.data_path == std::vector<std::string>{"1", "b", "2", "c"});
  CHECK(c.seed == 7);
  TrainConfig d = parse_flags({"--data-path", "x", "y", "--train-iters", "5", "--data-path=z"});
  CHECK(d.data.data_path == std::vector<std::string>{"z"});
  CHECK(parse_flags({"--bf16", "--bf16", "--train-iters", "5"}).precision.precision == Precision::BF16);
}

TEST_CASE("engine settings: the DeepSpeed config wins over a disagreeing Megatron flag, with a warning",
          "[config]") {
  const std::string path = "/tmp/ds_precedence_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
                             "zero_optimization": {"stage": 2}, "fp16": {"enabled": true, "hysteresis": 4}})";
  auto warned = [](const TrainConfig& c, const std::string& s) {
    for (const auto& w : c.warnings)
      if (w.find(s) != std::string::npos) return true;
    return false;
  };
  TrainConfig c = parse_flags({"--deepspeed_config", path, "--train-iters", "5", "--clip-grad", "1.0",
                               "--zero-stage", "1", "--hysteresis", "2", "--fp16"});
  CHECK(c.optim.grad_clip == 0.5f);
  CHECK(c.zero.stage == 2);
  CHECK(c.precision.hysteresis == 4);
  CHECK(warned(c, "--clip-grad 1.0 differs from the DeepSpeed config's gradient_clipping 0.5"));
  CHECK(warned(c, "--zero-stage 1 differs from the DeepSpeed config's zero_optimization/stage 2"));
  CHECK(warned(c, "--hysteresis 2 differs"));
  // Agreeing values, or keys the file does not set: no warning, the flag applies.
  TrainConfig d = parse_flags({"--deepspeed_config", path, "--train-iters", "5", "--zero-stage", "2",
                               "--loss-scale-window", "500", "--fp16"});
  CHECK(d.warnings.empty());
  CHECK(d.precision.loss_scale_window == 500);
  std::remove(path.c_str());
}

TEST_CASE("engine settings under --deepspeed: a key the config leaves out has DeepSpeed's default", "[config]") {
  // run_deepspeed_example.sh's config: fp16 with only initial_scale_power, no clipping key; its flags say
  // --loss-scale 12 and --clip-grad 1.0, which Megatron-DeepSpeed's engine never sees.
  const std::string path = "/tmp/ds_defaults_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                             "zero_optimization": {"stage": 2}, "fp16": {"enabled": true, "initial_scale_power": 12}})";
  auto warned = [](const TrainConfig& c, const std::string& s) {
    for (const auto& w : c.warnings)
      if (w.find(s) != std::string::npos) return true;
    return false;
  };
  const std::vector<std::string> flags = {"--deepspeed_config", path, "--train-iters", "5", "--loss-scale", "12",
                                          "--clip-grad", "1.0", "--global-batch-size", "32", "--fp16"};
  std::vector<std::string> with_engine = flags;
  with_engine.push_back("--deepspeed");
  TrainConfig c = parse_flags(with_engine);
  CHECK(c.precision.loss_scale == 0);  // dynamic, from 2^12
  CHECK(c.precision.initial_scale_power == 12);
  CHECK(c.optim.grad_clip == 0);
  CHECK(warned(c, "--loss-scale 12.0 differs from the DeepSpeed config's fp16/loss_scale 0.0 (DeepSpeed's default"));
  CHECK(warned(c, "--clip-grad 1.0 differs from the DeepSpeed config's gradient_clipping 0.0 (DeepSpeed's default"));
  // The batch is Megatron's: Megatron-DeepSpeed resets the engine's batch size from the flag.
  CHECK(c.batch.train_batch_size == 32);
  CHECK(warned(c, "--global-batch-size 32 differs from the DeepSpeed config's train_batch_size 64; the flag wins"));
  // Without --deepspeed a flag fills what the file leaves out.
  TrainConfig d = parse_flags(flags);
  CHECK(d.precision.loss_scale == 12);
  CHECK(d.optim.grad_clip == 1.0f);
  CHECK_FALSE(warned(d, "--clip-grad"));
  std::remove(path.c_str());
}

TEST_CASE("fp16 without the DeepSpeed engine starts at Megatron's initial loss scale, 2^32", "[config]") {
  CHECK(parse_flags({"--fp16", "--train-iters", "5", "--micro-batch-size", "2"}).precision.initial_scale_power == 32);
  CHECK(parse_flags({"--fp16", "--train-iters", "5", "--micro-batch-size", "2", "--initial-loss-scale", "1024"})
            .precision.initial_scale_power == 10);
  // With --deepspeed (or a config file) DeepSpeed's default, 2^16, holds.
  CHECK(parse_flags({"--fp16", "--train-iters", "5", "--micro-batch-size", "2", "--deepspeed"})
            .precision.initial_scale_power == 16);
}

namespace {

// Megatron's RampupBatchsizeNumMicroBatches.update and update_train_iters,
// transcribed (float division as in Python).
struct MegatronRampup {
  int64_t start, increment, samples, global;
  int64_t current(int64_t consumed) const {
    if (consumed > samples) return global;
    const double per_increment = static_cast<double>(samples) / static_cast<double>((global - start) / increment);
    return start + static_cast<int64_t>(static_cast<double>(consumed) / per_increment) * increment;
  }
  int64_t train_iters(int64_t train_samples) const {
    int64_t iterations = 0, consumed = 0;
    while (consumed <= samples) {
      consumed += current(consumed);
      iterations += 1;
    }
    return iterations + (train_samples - consumed) / global;
  }
};

}  // namespace

TEST_CASE("--rampup-batch-size follows Megatron's ramp-up and iteration count") {
  for (const auto& [start, inc, samples, global, train] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {8, 8, 200, 32, 1000}, {16, 16, 1000, 64, 5000}, {32, 32, 4882812, 1024, 40000000}, {8, 8, 0, 16, 400}}) {
    INFO(start << " " << inc << " " << samples << " -> " << global);
    const MegatronRampup ref{start, inc, samples, global};
    const BatchRampup r{.start = start, .increment = inc, .samples = samples};
    for (int64_t consumed = 0; consumed <= samples + 3 * global; consumed += std::max<int64_t>(1, samples / 97))
      REQUIRE(r.batch_at(consumed, global) == ref.current(consumed));
    CHECK(r.iterations(train, global) == ref.train_iters(train));
  }
  // Parsed: the iteration count is derived, and the ramp lives in the training section.
  const TrainConfig c = parse_flags({"--train-samples", "400", "--rampup-batch-size", "4", "4", "40"});
  CHECK(c.lengths.rampup.enabled());
  CHECK(c.train_iters == MegatronRampup{4, 4, 40, 8}.train_iters(400));
  CHECK(c.resolved.at("training").at("rampup_batch_size") == nlohmann::json::array({4, 4, 40}));
  CHECK_THROWS_WITH(parse_flags({"--train-iters", "10", "--rampup-batch-size", "4", "4", "40"}),
                    Contains("--rampup-batch-size needs sample-based training"));
  CHECK_THROWS_WITH(parse_flags({"--train-samples", "400", "--rampup-batch-size", "3", "5", "40"}),
                    Contains("must be multiples of the micro batch x data-parallel size 2"));
  CHECK_THROWS_WITH(parse_flags({"--train-samples", "400", "--rampup-batch-size", "4", "3", "40"}),
                    Contains("must be a non-negative multiple of the increment 3"));
  CHECK_THROWS_WITH(parse_flags({"--train-samples", "400", "--rampup-batch-size", "4", "4"}),
                    Contains("--rampup-batch-size"));
}
