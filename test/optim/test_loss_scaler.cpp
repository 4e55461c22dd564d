// fp16 loss scaler against DeepSpeed's DynamicLossScaler rules, step by step.
#include <catch2/catch.hpp>

#include "lib/core/error.h"
#include "lib/optim/loss_scaler.h"

using namespace ds;

namespace {
LossScalerConfig dyn(double init, int64_t window, int hysteresis, double min_scale = 1.0) {
  LossScalerConfig c;
  c.initial_scale = init;
  c.window = window;
  c.hysteresis = hysteresis;
  c.min_scale = min_scale;
  return c;
}
}  // namespace

TEST_CASE("loss scaler doubles after a window of good steps") {
  LossScaler s(dyn(1024, 3, 2));
  REQUIRE(s.update(false) == ScaleEvent::None);
  REQUIRE(s.update(false) == ScaleEvent::None);
  REQUIRE(s.scale() == 1024);
  REQUIRE(s.update(false) == ScaleEvent::Raised);
  REQUIRE(s.scale() == 2048);
  REQUIRE(s.good_steps() == 0);
}

TEST_CASE("loss scaler spends the hysteresis before halving, and keeps halving until a raise") {
  LossScaler s(dyn(1024, 4, 3));
  REQUIRE(s.update(true) == ScaleEvent::HysteresisSpent);  // 3 -> 2
  REQUIRE(s.scale() == 1024);
  REQUIRE(s.update(true) == ScaleEvent::HysteresisSpent);  // 2 -> 1
  REQUIRE(s.update(true) == ScaleEvent::Lowered);
  REQUIRE(s.scale() == 512);
  REQUIRE(s.update(false) == ScaleEvent::None);  // a good step does not refill (non-consecutive)
  REQUIRE(s.update(true) == ScaleEvent::Lowered);
  REQUIRE(s.scale() == 256);
  // The window restarts after an overflow: 4 good steps raise and refill the budget.
  for (int i = 0; i < 3; ++i) REQUIRE(s.update(false) == ScaleEvent::None);
  REQUIRE(s.update(false) == ScaleEvent::Raised);
  REQUIRE(s.scale() == 512);
  REQUIRE(s.hysteresis_left() == 3);
  REQUIRE(s.update(true) == ScaleEvent::HysteresisSpent);
}

TEST_CASE("consecutive hysteresis refills after every good step") {
  LossScalerConfig c = dyn(1024, 100, 2);
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  REQUIRE(s.update(true) == ScaleEvent::HysteresisSpent);
  REQUIRE(s.update(false) == ScaleEvent::None);
  REQUIRE(s.update(true) == ScaleEvent::HysteresisSpent);
  REQUIRE(s.update(true) == ScaleEvent::Lowered);
  REQUIRE(s.scale() == 512);
}

TEST_CASE("loss scaler stops at min_loss_scale and then reports divergence") {
  LossScaler s(dyn(4, 10, 1, 2));
  REQUIRE(s.update(true) == ScaleEvent::Lowered);
  REQUIRE(s.scale() == 2);
  REQUIRE_THROWS_AS(s.update(true), UserError);
}

TEST_CASE("static loss scale never moves") {
  LossScalerConfig c = dyn(128, 1, 1);
  c.dynamic = false;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) REQUIRE(s.update(i % 2 == 0) == ScaleEvent::None);
  REQUIRE(s.scale() == 128);
  s.restore(7, 3, 1);  // a checkpoint cannot override a static scale
  REQUIRE(s.scale() == 128);
}

TEST_CASE("restored state continues exactly") {
  LossScaler a(dyn(1024, 3, 2));
  a.update(true);
  a.update(false);
  LossScaler b(dyn(1024, 3, 2));
  b.restore(a.scale(), a.good_steps(), a.hysteresis_left());
  for (bool o : {false, false, true, true, false}) {
    REQUIRE(a.update(o) == b.update(o));
    REQUIRE(a.scale() == b.scale());
  }
}
