// lr_at: Megatron schedules (step k runs at f(k)) and DeepSpeed's WarmupLR,
// WarmupDecayLR, WarmupCosineLR (step k runs at f(k - 1)), with exact values.
#include <catch2/catch.hpp>
#include <cmath>

#include "lib/optim/lr_schedule.h"

using namespace ds;

namespace {

OptimizerConfig megatron(LrDecay decay, int64_t warmup, int64_t decay_iters) {
  OptimizerConfig o;
  o.lr = 1.0f;
  o.min_lr = 0.1f;
  o.decay = decay;
  o.warmup_iters = warmup;
  o.decay_iters = decay_iters;
  return o;
}

OptimizerConfig deepspeed(LrScheduler type, WarmupKind kind, int64_t warmup, int64_t total) {
  OptimizerConfig o;
  o.scheduler = type;
  o.lr = 1.0f;
  o.warmup_min_lr = 0.1f;
  o.warmup_type = kind;
  o.warmup_iters = warmup;
  o.decay_iters = total;
  return o;
}

constexpr double kPi = 3.14159265358979323846;

}  // namespace

TEST_CASE("Megatron cosine: warmup from 0, cosine to min_lr, then min_lr", "[lr]") {
  auto o = megatron(LrDecay::Cosine, 10, 110);
  CHECK(lr_at(o, 0, 200) == 0.0f);
  CHECK(lr_at(o, 5, 200) == Approx(0.5));
  CHECK(lr_at(o, 10, 200) == Approx(1.0));
  CHECK(lr_at(o, 60, 200) == Approx(0.55));  // half way: 0.1 + 0.9 * 0.5
  CHECK(lr_at(o, 35, 200) == Approx(0.1 + 0.9 * 0.5 * (std::cos(kPi * 0.25) + 1)));
  CHECK(lr_at(o, 110, 200) == Approx(0.1));
  CHECK(lr_at(o, 111, 200) == Approx(0.1));
  CHECK(lr_at(o, 5000, 200) == Approx(0.1));
}

TEST_CASE("Megatron linear and constant", "[lr]") {
  auto l = megatron(LrDecay::Linear, 10, 110);
  CHECK(lr_at(l, 35, 0) == Approx(0.775));  // 0.1 + 0.9 * 0.75
  CHECK(lr_at(l, 60, 0) == Approx(0.55));
  CHECK(lr_at(l, 110, 0) == Approx(0.1));
  auto c = megatron(LrDecay::Constant, 10, 110);
  CHECK(lr_at(c, 5, 0) == Approx(0.5));
  CHECK(lr_at(c, 60, 0) == 1.0f);
  CHECK(lr_at(c, 100000, 0) == 1.0f);
}

TEST_CASE("Megatron: warmup start value, no warmup, decay length from train_iters", "[lr]") {
  auto o = megatron(LrDecay::Linear, 10, 0);
  o.warmup_min_lr = 0.2f;
  CHECK(lr_at(o, 0, 110) == Approx(0.2));
  CHECK(lr_at(o, 5, 110) == Approx(0.6));
  CHECK(lr_at(o, 60, 110) == Approx(0.55));  // decay_iters 0 -> train_iters 110
  auto n = megatron(LrDecay::Cosine, 0, 100);
  CHECK(lr_at(n, 0, 0) == 1.0f);
  CHECK(lr_at(n, 50, 0) == Approx(0.55));
  CHECK(lr_at(n, 100, 0) == Approx(0.1));
}

TEST_CASE("DeepSpeed WarmupLR, linear and log warmup", "[lr]") {
  auto o = deepspeed(LrScheduler::WarmupLR, WarmupKind::Linear, 10, 0);
  CHECK(lr_at(o, 0, 100) == Approx(0.1));   // scheduler not started: warmup_min_lr
  CHECK(lr_at(o, 1, 100) == Approx(0.1));   // iteration 0
  CHECK(lr_at(o, 6, 100) == Approx(0.55));  // iteration 5: 0.1 + 0.9 * 5/10
  CHECK(lr_at(o, 11, 100) == 1.0f);
  CHECK(lr_at(o, 100000, 100) == 1.0f);
  auto g = deepspeed(LrScheduler::WarmupLR, WarmupKind::Log, 100, 0);
  CHECK(lr_at(g, 1, 0) == Approx(0.1));  // log(1) = 0
  CHECK(lr_at(g, 11, 0) == Approx(0.1 + 0.9 * std::log(11.0) / std::log(100.0)));
  CHECK(lr_at(g, 11, 0) == Approx(0.568627).epsilon(1e-5));
  CHECK(lr_at(g, 101, 0) == 1.0f);
  auto one = deepspeed(LrScheduler::WarmupLR, WarmupKind::Linear, 1, 0);  // clamped to 2 steps
  CHECK(lr_at(one, 2, 0) == Approx(0.55));
  CHECK(lr_at(one, 3, 0) == 1.0f);
}

TEST_CASE("DeepSpeed WarmupDecayLR decays linearly to warmup_min_lr", "[lr]") {
  auto o = deepspeed(LrScheduler::WarmupDecayLR, WarmupKind::Linear, 10, 110);
  CHECK(lr_at(o, 6, 0) == Approx(0.55));
  CHECK(lr_at(o, 11, 0) == 1.0f);            // iteration 10: (110-10)/100
  CHECK(lr_at(o, 61, 0) == Approx(0.55));    // iteration 60: 0.5
  CHECK(lr_at(o, 111, 0) == Approx(0.1));    // iteration 110: 0
  CHECK(lr_at(o, 500, 0) == Approx(0.1));
  o.warmup_min_lr = 0;
  CHECK(lr_at(o, 111, 0) == 0.0f);
}

TEST_CASE("DeepSpeed WarmupCosineLR uses ratios of the optimizer lr", "[lr]") {
  auto o = deepspeed(LrScheduler::WarmupCosineLR, WarmupKind::Linear, 10, 110);
  o.lr = 2.0f;
  o.warmup_min_ratio = 0.0f;
  o.cos_min_ratio = 0.1f;
  CHECK(lr_at(o, 0, 0) == 0.0f);  // not started: 0
  CHECK(lr_at(o, 1, 0) == 0.0f);
  CHECK(lr_at(o, 6, 0) == Approx(1.0));  // ratio 0.5
  CHECK(lr_at(o, 11, 0) == Approx(2.0 * (0.1 + 0.9 * (1 + std::cos(kPi * 0.01)) / 2)));
  CHECK(lr_at(o, 60, 0) == Approx(2.0 * 0.55));  // iteration 59: step 50 of 100
  CHECK(lr_at(o, 110, 0) == Approx(0.2));        // cos_min_ratio * lr
  o.warmup_min_ratio = 0.5f;
  CHECK(lr_at(o, 6, 0) == Approx(2.0 * 0.75));
}
