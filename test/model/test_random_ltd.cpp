// Random-LTD's pieces in one process (lib/model/random_ltd.h): the kept
// positions (ascending, distinct, every subset equally likely, a function of
// the key only), DeepSpeed's fixed_linear schedule against a transcription of
// its stateful scheduler, and the model: evaluation and full-length steps are
// untouched, recomputation repeats the kept positions bit for bit, and the
// gradients agree with finite differences of the dropping forward. The
// forward itself is checked against transformers with upstream's gather /
// scatter in test/interop (test_random_ltd_reference).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "lib/model/random_ltd.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

// DeepSpeed's RandomLTDScheduler (fixed_linear): the state starts at
// min_value and, while below max_value, moves to the schedule's value each
// time update_seq(global_steps) runs (every training forward).
struct UpstreamScheduler {
  RandomLtdSchedule s;
  int64_t current;
  explicit UpstreamScheduler(RandomLtdSchedule sc) : s(sc), current(sc.min_value) {}
  int64_t get_value(int64_t steps) const {
    double next = std::floor(static_cast<double>(steps) / static_cast<double>(s.require_steps) *
                                 static_cast<double>(s.max_value - s.min_value) +
                             static_cast<double>(s.min_value));
    int64_t v = static_cast<int64_t>(next);
    v -= v % s.seq_per_step;
    return std::min(v, s.max_value);
  }
  int64_t update_seq(int64_t steps) {
    if (current < s.max_value) current = get_value(steps);
    return current;
  }
};

std::vector<int32_t> positions(int64_t iteration, int64_t sample, int layer, int64_t T, int64_t R) {
  std::vector<int32_t> v(static_cast<size_t>(R));
  random_ltd_positions(42, iteration, sample, layer, T, R, v.data());
  return v;
}

}  // namespace

TEST_CASE("random-LTD positions: ascending, distinct, uniform, keyed", "[model][random_ltd]") {
  for (const auto& [T, R] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 3}, {64, 16}, {2048, 128}, {9, 9}}) {
    const std::vector<int32_t> p = positions(3, 5, 1, T, R);
    REQUIRE(p.size() == static_cast<size_t>(R));
    for (size_t i = 0; i < p.size(); ++i) {
      CHECK(p[i] >= 0);
      CHECK(p[i] < T);
      if (i) CHECK(p[i - 1] < p[i]);
    }
    CHECK(p == positions(3, 5, 1, T, R));  // the key decides
  }
  CHECK(positions(3, 5, 1, 64, 16) != positions(4, 5, 1, 64, 16));
  CHECK(positions(3, 5, 1, 64, 16) != positions(3, 6, 1, 64, 16));
  CHECK(positions(3, 5, 1, 64, 16) != positions(3, 5, 2, 64, 16));
  // Every 2-subset of 6 positions equally likely: 15 subsets, 30000 draws;
  // chi-square with 14 degrees of freedom stays below 36.1 (p = 0.001).
  std::map<std::pair<int, int>, int> count;
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) {
    const std::vector<int32_t> p = positions(i, 7, 0, 6, 2);
    count[{p[0], p[1]}] += 1;
  }
  REQUIRE(count.size() == 15);
  double chi2 = 0, expect = draws / 15.0;
  for (const auto& [k, n] : count) chi2 += (n - expect) * (n - expect) / expect;
  CHECK(chi2 < 36.1);
}

TEST_CASE("random-LTD schedule equals DeepSpeed's stateful fixed_linear scheduler", "[model][random_ltd]") {
  Rng rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    RandomLtdSchedule s;
    s.min_value = 1 + static_cast<int64_t>(rng.below(300));
    s.max_value = 1 + static_cast<int64_t>(rng.below(2048));
    s.require_steps = 1 + static_cast<int64_t>(rng.below(500));
    s.seq_per_step = 1 + static_cast<int64_t>(rng.below(64));
    INFO("min " << s.min_value << " max " << s.max_value << " require " << s.require_steps << " per step "
                << s.seq_per_step);
    UpstreamScheduler up(s);
    for (int64_t step = 0; step < 700; ++step) REQUIRE(random_ltd_reserved(s, step) == up.update_seq(step));
  }
  // The data-efficiency scripts: 128 -> 2048 over 200000 steps, multiples of 16.
  const RandomLtdSchedule gpt{.min_value = 128, .max_value = 2048, .require_steps = 200000, .seq_per_step = 16};
  CHECK(random_ltd_reserved(gpt, 0) == 128);
  CHECK(random_ltd_reserved(gpt, 100000) == 1088);
  CHECK(random_ltd_reserved(gpt, 200000) == 2048);
}

namespace {

struct Pass {
  std::vector<float> losses, grads;
};

ModelConfig ltd_model() {
  ModelConfig cfg = test::tiny_model(false);
  cfg.num_layers = 3;
  return cfg;
}

// reserved < 0: a model without random-LTD.
Pass train(RecomputeConfig rc, int64_t reserved, bool train_key = true) {
  const ModelConfig cfg = ltd_model();
  GptModel m(cfg, Device::cpu());
  m.set_recompute(rc);
  if (reserved >= 0) m.set_random_ltd({.layers = {0, 2}, .reserved = reserved});
  m.init_weights(3, 0.2f);
  m.grads().zero_();
  const int64_t B = 2, T = 8;
  Pass p;
  for (int step = 0; step < 3; ++step) {
    const DropoutKey key{.train = train_key, .seed = 7, .iteration = step, .first_sample = 2 * step, .step = {}};
    p.losses.push_back(m.forward_backward(test::random_tokens(B, T, cfg.vocab_size, 10 + step),
                                          test::random_tokens(B, T, cfg.vocab_size, 20 + step), 1.0f / (B * T), key));
  }
  const float* g = m.grads().data<float>();
  p.grads.assign(g, g + m.layout().total);
  return p;
}

bool same(const Pass& a, const Pass& b) {
  return a.losses == b.losses && a.grads.size() == b.grads.size() &&
         std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("random-LTD in the model: off at full length, recomputation bit-identical", "[model][random_ltd]") {
  using K = RecomputeConfig::Kind;
  const Pass full = train({}, 8), dropping = train({}, 5);
  CHECK(same(full, train({}, -1)));  // reserved >= T drops nothing: a model without random-LTD
  CHECK(!same(full, dropping));
  CHECK(same(dropping, train({K::Full, 0}, 5)));
  CHECK(same(dropping, train({K::Full, 1}, 5)));
  CHECK(same(dropping, train({K::Selective, 0}, 5)));
  // Evaluation keys never drop.
  CHECK(same(train({}, 5, false), train({}, -1, false)));
}

TEST_CASE("random-LTD gradients agree with finite differences of the dropping forward", "[model][random_ltd]") {
  ModelConfig cfg = ltd_model();
  cfg.hidden_dropout = cfg.attention_dropout = 0.f;
  GptModel m(cfg, Device::cpu());
  m.set_random_ltd({.layers = {0, 2}, .reserved = 5});
  m.init_weights(5, 0.3f);
  const int64_t B = 2, T = 8;
  const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
  const DropoutKey key{.train = true, .seed = 7, .iteration = 3, .first_sample = 4, .step = {}};
  m.grads().zero_();
  m.forward_backward(tok, tgt, 1.0f / (B * T), key);
  const std::vector<float> g(m.grads().data<float>(), m.grads().data<float>() + m.layout().total);
  float* w = m.params().data<float>();
  auto loss = [&] {
    m.grads().zero_();
    return static_cast<double>(m.forward_backward(tok, tgt, 0.f, key));
  };
  Rng pick(9);
  int checked = 0;
  for (const ParamSpec& p : m.layout().params) {
    for (int k = 0; k < 3; ++k) {
      const int64_t i = p.offset + static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.numel)));
      const float w0 = w[i], h = 1e-2f;
      w[i] = w0 + h;
      const double up = loss();
      w[i] = w0 - h;
      const double down = loss();
      w[i] = w0;
      const double fd = (up - down) / (2.0 * h);
      INFO(p.name << "[" << i - p.offset << "]: analytic " << g[static_cast<size_t>(i)] << " finite difference " << fd);
      CHECK(std::fabs(g[static_cast<size_t>(i)] - fd) <= 2e-3 + 2e-2 * std::fabs(fd));
      ++checked;
    }
  }
  CHECK(checked > 40);
}
