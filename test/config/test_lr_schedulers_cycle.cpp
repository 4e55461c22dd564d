// DeepSpeed's OneCycle and LRRangeTest, and Megatron's inverse-square-root
// decay: lr_at / betas_at for every step against a step-by-step simulation of
// the scheduler objects (built at last_batch_iteration -1 with the minimum lr
// and momentum, stepped after each optimizer step), written from the
// documented rules in deepspeed/runtime/lr_schedules.py and Megatron's
// OptimizerParamScheduler, plus hand-computed values.
#include <catch2/catch.hpp>
#include <cmath>

#include "lib/optim/lr_schedule.h"

using namespace ds;

namespace {

// OneCycle as an object: lr and momentum after construction and after each step().
struct OneCycleSim {
  OneCycleParams p;
  int64_t last = -1;
  double lr, mom;
  explicit OneCycleSim(const OneCycleParams& q) : p(q), lr(q.cycle_min_lr), mom(q.cycle_min_mom) {}
  double first() const { return double(p.cycle_first_step_size); }
  double second() const { return p.cycle_second_step_size < 0 ? first() : double(p.cycle_second_step_size); }
  double scale() const {
    const double total = first() + second(), ratio = first() / total, b = double(last + 1);
    const double cycle = std::floor(1 + b / total), x = 1 + b / total - cycle;
    const int64_t s1 = p.cycle_first_stair_count, s2 = p.cycle_second_stair_count < 0 ? s1 : p.cycle_second_stair_count;
    const bool up = x <= ratio;
    double f = up ? x / ratio : (x - 1) / (ratio - 1);
    const int64_t stairs = up ? s1 : s2;
    if (stairs > 0) {
      const double ci = std::fmod(b, total);
      f = std::floor(ci <= first() ? ci * stairs / first() : (total - ci) * stairs / second()) / stairs;
    }
    return f;
  }
  void step() {
    ++last;
    const double total = first() + second();
    if (double(last) < total) {
      lr = p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * scale();
      mom = p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * scale();
    } else {
      const double d = double(last) - total + 1;
      const bool no_decay = p.decay_step_size == 0;
      lr = no_decay || p.decay_lr_rate == 0 ? p.cycle_min_lr
                                             : p.cycle_min_lr / (1 + p.decay_lr_rate * d / p.decay_step_size);
      mom = no_decay || p.decay_mom_rate == 0 ? p.cycle_max_mom
                                               : p.cycle_max_mom * (1 + p.decay_mom_rate * d / p.decay_step_size);
    }
  }
};

void check_one_cycle(const OneCycleParams& p, OptimizerSpec spec = {}, int steps = 40) {
  OptimizerConfig o;
  o.scheduler = LrScheduler::OneCycle;
  o.one_cycle = p;
  o.spec = spec;
  OneCycleSim sim(p);
  LrClock clock;
  for (int k = 0; k < steps; ++k) {  // step k runs at the values the scheduler holds before its k-th step()
    INFO("step " << k);
    CHECK(lr_at(o, clock) == Approx(sim.lr).epsilon(1e-6));
    const auto betas = betas_at(o, clock);
    REQUIRE(betas.has_value() == p.cycle_momentum);
    if (betas) {
      CHECK(betas->first == Approx(sim.mom).epsilon(1e-6));
      CHECK(betas->second == 0.99f);
    }
    advance_lr_clock(o, clock, 8, 0);
    sim.step();
  }
}

}  // namespace

TEST_CASE("OneCycle: the cycle, staircases, the decay after it, and the momentum cycle", "[lr]") {
  OneCycleParams p;
  p.cycle_min_lr = 0.01f;
  p.cycle_max_lr = 0.1f;
  p.cycle_first_step_size = 10;
  check_one_cycle(p);  // symmetric cycle, no decay: back at min after 20 steps and staying there
  p.cycle_second_step_size = 5;
  p.decay_lr_rate = 0.5f;
  p.decay_step_size = 3;
  p.decay_mom_rate = 0.1f;
  check_one_cycle(p);
  p.cycle_first_stair_count = 4;
  p.cycle_second_stair_count = 2;
  check_one_cycle(p);
  p.cycle_momentum = false;
  check_one_cycle(p);
  // Hand values (first 10, second 10, min 0.01, max 0.1): step 0 runs at min lr and min momentum;
  // step 1 (iteration 0, position 1/10 of the rise) at 0.019 with momentum 0.89; step 10 at the peak.
  OptimizerConfig o;
  o.scheduler = LrScheduler::OneCycle;
  o.one_cycle.cycle_min_lr = 0.01f;
  o.one_cycle.cycle_max_lr = 0.1f;
  o.one_cycle.cycle_first_step_size = 10;
  LrClock c;
  CHECK(lr_at(o, c) == Approx(0.01));
  CHECK(betas_at(o, c)->first == Approx(0.8));
  c.steps = 1;
  CHECK(lr_at(o, c) == Approx(0.019));
  CHECK(betas_at(o, c)->first == Approx(0.89));
  c.steps = 10;
  CHECK(lr_at(o, c) == Approx(0.1));
  CHECK(betas_at(o, c)->first == Approx(0.8));
  // SGD and Adagrad have no betas: DeepSpeed leaves their momentum alone.
  o.spec.type = "SGD";
  CHECK_FALSE(betas_at(o, c).has_value());
  o.spec.type = "Lion";
  CHECK(betas_at(o, c).has_value());
}

TEST_CASE("LRRangeTest: continuous and staircase growth from lr_range_test_min_lr", "[lr]") {
  for (bool stairs : {false, true}) {
    OptimizerConfig o;
    o.scheduler = LrScheduler::LRRangeTest;
    o.range_test = {.min_lr = 1e-4f, .step_size = 5, .step_rate = 2.f, .staircase = stairs};
    LrClock c;
    CHECK(lr_at(o, c) == Approx(1e-4));  // built with min_lr
    for (int k = 1; k < 30; ++k) {
      c.steps = k;
      const double interval = stairs ? std::floor(k / 5.0) : k / 5.0;  // iteration k - 1: (k - 1 + 1) / step_size
      INFO("step " << k);
      CHECK(lr_at(o, c) == Approx(1e-4 * (1 + 2 * interval)).epsilon(1e-6));
    }
  }
}

TEST_CASE("Megatron inverse-square-root: warmup, then lr sqrt(warmup / step), floored at min_lr", "[lr]") {
  OptimizerConfig o;
  o.lr = 1.0f;
  o.min_lr = 0.2f;
  o.decay = LrDecay::InverseSqrt;
  o.warmup_samples = 40;  // 10 iterations of 4 samples
  o.decay_samples = 400;
  LrClock c;
  c.samples = 20;
  CHECK(lr_at(o, c) == Approx(0.5));  // warmup
  c.samples = 160;
  CHECK(lr_at(o, c) == Approx(0.5));  // sqrt(40 / 160)
  c.samples = 360;
  CHECK(lr_at(o, c) == Approx(std::sqrt(40.0 / 360)));
  c.samples = 400;
  CHECK(lr_at(o, c) == Approx(0.316227766));
  c.samples = 404;  // past the decay length: min_lr
  CHECK(lr_at(o, c) == Approx(0.2));
  o.lr = 0.5f;
  c.samples = 390;  // 0.5 sqrt(40 / 390) = 0.160 < min_lr
  CHECK(lr_at(o, c) == Approx(0.2));
  // The iteration-based form agrees.
  OptimizerConfig i = o;
  i.warmup_iters = 10;
  i.decay_iters = 100;
  CHECK(lr_at(i, 40, 100) == Approx(std::max(0.2, 0.5 * std::sqrt(10.0 / 40))));
}

TEST_CASE("Megatron-LM WSD: warmup, stable at lr, then the final decay of each style to min_lr", "[lr]") {
  OptimizerConfig o;
  o.lr = 1.0f;
  o.min_lr = 0.1f;
  o.decay = LrDecay::WSD;
  o.warmup_samples = 10;
  o.decay_samples = 100;
  o.wsd_decay_samples = 20;  // the decay runs over samples 80..100
  LrClock c;
  c.samples = 5;
  CHECK(lr_at(o, c) == Approx(0.5));  // warmup
  for (int64_t s : {10, 40, 80}) {
    c.samples = s;
    CHECK(lr_at(o, c) == Approx(1.0));  // stable
  }
  struct Want {
    WsdDecay style;
    double at90, at100;  // coefficient halfway and at the end
  };
  for (const Want& w : {Want{WsdDecay::Linear, 0.5, 0.0}, Want{WsdDecay::Cosine, 0.5, 0.0},
                        Want{WsdDecay::Exponential, 2 * std::sqrt(0.5) - 1, 0.0},
                        Want{WsdDecay::MinusSqrt, 1 - std::sqrt(0.5), 0.0}}) {
    o.wsd_style = w.style;
    c.samples = 90;
    CHECK(lr_at(o, c) == Approx(0.1 + 0.9 * w.at90));
    c.samples = 100;
    CHECK(lr_at(o, c) == Approx(0.1 + 0.9 * w.at100).margin(1e-7));
    c.samples = 101;
    CHECK(lr_at(o, c) == Approx(0.1));
  }
  // The iteration form agrees (lengths in iterations).
  o.wsd_style = WsdDecay::Linear;
  o.warmup_iters = 1;
  o.decay_iters = 10;
  o.wsd_decay_iters = 2;
  CHECK(lr_at(o, 9, 10) == Approx(0.55));
}
