// transformers' learning-rate schedules (DeepSpeed-Chat's --lr_scheduler_type,
// LrScheduler::Transformers) against transformers' get_scheduler itself on a
// torch optimizer: every step's lr for each name, warmups (none, short, as
// long as training), totals, and steps past the total. Skips without torch
// and transformers (/usr/bin/python3 with .deps/python).
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <sstream>

#include "lib/optim/lr_schedule.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;

TEST_CASE("transformers' schedules: the lr of every step, as get_scheduler gives it") {
  struct Case {
    HfSchedule s;
    const char* name;
    double lr;
    int64_t warmup, total, steps;
  };
  std::vector<Case> cases;
  for (const auto& [s, name] : kHfScheduleNames)
    for (auto [warmup, total] : {std::pair<int64_t, int64_t>{0, 20}, {5, 20}, {20, 20}, {3, 7}, {0, 1}, {9, 4}})
      if (s != HfSchedule::Polynomial || warmup != total)  // transformers divides by zero there
        cases.push_back({s, name, s == HfSchedule::Polynomial ? 1e-3 : 9.65e-6, warmup, total, total + 4});
  std::string cmd = "/usr/bin/python3 ";
  const char* src = std::getenv("DS_SOURCE_DIR");
  cmd += std::string(src ? src : ".") + "/test/config/hf_sched_ref.py";
  for (const Case& c : cases) {
    std::ostringstream o;
    o.precision(17);
    o << " " << c.name << ":" << c.lr << ":" << c.warmup << ":" << c.total << ":" << c.steps;
    cmd += o.str();
  }
  std::vector<std::string> lines;
  const int rc = test::popen_lines(cmd + " 2>/dev/null", lines);
  if (rc == 77) DS_SKIP("torch/transformers not importable by /usr/bin/python3 (PYTHONPATH .deps/python)");
  REQUIRE(rc == 0);
  REQUIRE(lines.size() == cases.size());
  int nonzero_changes = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::istringstream vals(lines[i]);
    OptimizerConfig o;
    o.scheduler = LrScheduler::Transformers;
    o.hf_schedule = c.s;
    o.lr = static_cast<float>(c.lr);
    o.warmup_iters = c.warmup;
    o.decay_iters = c.total;
    LrClock clock;
    double prev = -1;
    for (int64_t k = 0; k < c.steps; ++k) {
      double want = -1;
      REQUIRE(vals >> want);
      INFO(c.name << " warmup " << c.warmup << " total " << c.total << " step " << k);
      const float got = lr_at(o, clock);
      CHECK(got == Approx(want).epsilon(2e-6).margin(1e-12));
      CHECK(got == lr_at(o, k, c.total));
      nonzero_changes += want != prev && k > 0;
      prev = want;
      advance_lr_clock(o, clock, 1, 0);
    }
  }
  CHECK(nonzero_changes > 100);  // the schedules move
}
