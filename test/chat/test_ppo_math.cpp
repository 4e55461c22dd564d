// DeepSpeed-Chat's PPO formulas (lib/chat/ppo_math.h) against independent
// forms: the reward lands where compute_rewards' slice puts it (an answer
// that ends early, one cut at the last position), the advantages equal the
// closed-form sum of discounted TD errors, and both losses' gradients agree
// with central finite differences in double precision. Python's
// random.shuffle (lib/chat/py_random.h) against orders CPython 3.11 printed
// for random.seed(1234) and random.seed(2**40 + 5). test/chat/ppo_check.py
// compares the whole step with transformers + PyTorch.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>

#include "lib/chat/ppo_math.h"
#include "lib/chat/py_random.h"

using namespace ds::chat;

namespace {

// Two sequences of L = 8 with P = 3: row 0 answers 2 tokens then pads, row 1
// fills the answer (no pad at all).
Experience sample_experience() {
  Experience e;
  e.B = 2;
  e.L = 8;
  e.P = 3;
  const int32_t pad = 0;
  e.seq = {pad, 5, 6, 7, 8, pad, pad, pad,   // prompt [1, 3), answer 7 8
           4, 5, 6, 9, 9, 9, 9, 9};          // full
  for (int32_t t : e.seq) e.mask.push_back(t != pad);
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int i = 0; i < e.B * (e.L - 1); ++i) {
    e.logprobs.push_back(-1.f + 0.3f * n(g));
    e.ref_logprobs.push_back(-1.f + 0.3f * n(g));
    e.values.push_back(n(g));
  }
  e.rewards = {7.5f, -0.75f};  // the first is clipped to 5
  return e;
}

}  // namespace

TEST_CASE("compute_rewards and GAE match their closed forms", "[ppo]") {
  const Experience e = sample_experience();
  const PpoConstants k;
  const PpoTargets t = ppo_targets(e, k);
  const int64_t L1 = e.L - 1, start = e.start(), W = e.W();
  REQUIRE(t.W == W);
  REQUIRE(W == 5);
  // Row 0: the action mask counts tokens 3 and 4 (answer 7 8): ends = 2 + 2 + 1 = 5, reward at entry 4, values
  // and rewards zero from entry 5. Row 1: 5 real answer tokens, ends = 8 > L - 1 = 7: reward at entry 6.
  const int64_t reward_at[2] = {4, 6}, ends[2] = {5, 8};
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<double> r(static_cast<size_t>(L1)), v(static_cast<size_t>(L1));
    for (int64_t i = 0; i < L1; ++i) {
      const size_t o = static_cast<size_t>(b * L1 + i);
      r[static_cast<size_t>(i)] = -0.1 * (double(e.logprobs[o]) - double(e.ref_logprobs[o]));
      v[static_cast<size_t>(i)] = e.values[o];
      if (i >= ends[b]) r[static_cast<size_t>(i)] = v[static_cast<size_t>(i)] = 0;
    }
    r[static_cast<size_t>(reward_at[b])] += std::clamp(double(e.rewards[static_cast<size_t>(b)]), -5.0, 5.0);
    for (int64_t i = start; i < L1; ++i) {
      // A_i = sum_l (gamma lambda)^l delta_{i+l}, delta_j = r_j + V_{j+1} - V_j (V_{L-1} = 0)
      double adv = 0, w = 1;
      for (int64_t j = i; j < L1; ++j, w *= 0.95) {
        const double next = j + 1 < L1 ? v[static_cast<size_t>(j + 1)] : 0.0;
        adv += w * (r[static_cast<size_t>(j)] + next - v[static_cast<size_t>(j)]);
      }
      const size_t o = static_cast<size_t>(b * W + i - start);
      CHECK(t.advantages[o] == Approx(adv).margin(1e-5));
      CHECK(t.returns[o] == Approx(adv + v[static_cast<size_t>(i)]).margin(1e-5));
      CHECK(t.old_values[o] == Approx(v[static_cast<size_t>(i)]).margin(0));
      CHECK(t.action_mask[o] == float(e.mask[static_cast<size_t>(b * e.L + i + 1)]));
    }
  }
}

namespace {

// Central differences of f at x (double), against the analytic gradient.
template <class F>
void check_gradient(const std::vector<float>& x, const std::vector<float>& grad, F f) {
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<float> hi = x, lo = x;
    const float h = 1e-3f;
    hi[i] += h;
    lo[i] -= h;
    const double fd = (double(f(hi)) - double(f(lo))) / (double(hi[i]) - double(lo[i]));
    INFO("entry " << i);
    CHECK(grad[i] == Approx(fd).margin(2e-3).epsilon(2e-2));
  }
}

}  // namespace

TEST_CASE("the clipped losses' gradients agree with finite differences", "[ppo]") {
  const Experience e = sample_experience();
  PpoConstants k;
  const PpoTargets t = ppo_targets(e, k);
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.f, 1.f);
  // New log-probabilities near the old ones (both sides of the clip range) and values near the old values.
  std::vector<float> lp(t.old_logprobs.size()), v(t.old_values.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    lp[i] = t.old_logprobs[i] + 0.4f * n(g);
    v[i] = t.old_values[i] + 0.5f * n(g);
  }
  const LossGrad a = actor_loss(lp, t, k);
  check_gradient(lp, a.grad, [&](const std::vector<float>& x) { return actor_loss(x, t, k).loss; });
  const LossGrad c = critic_loss(v, t, k);
  check_gradient(v, c.grad, [&](const std::vector<float>& x) { return critic_loss(x, t, k).loss; });
  // Masked entries carry no gradient; at the old policy the ratio is 1 and the loss is -mean(advantage).
  for (size_t i = 0; i < lp.size(); ++i)
    if (t.action_mask[i] == 0.f) CHECK((a.grad[i] == 0.f && c.grad[i] == 0.f));
  double sum = 0, count = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    sum += -double(t.advantages[i]) * t.action_mask[i];
    count += t.action_mask[i];
  }
  CHECK(actor_loss(t.old_logprobs, t, k).loss == Approx(sum / count).epsilon(1e-5));
}

TEST_CASE("PythonRandom shuffles as CPython's random.shuffle", "[ppo]") {
  PythonRandom r(1234);
  std::vector<int> x(10);
  std::iota(x.begin(), x.end(), 0);
  r.shuffle(x);
  CHECK(x == std::vector<int>{2, 8, 3, 5, 6, 4, 9, 0, 1, 7});
  r.shuffle(x);
  CHECK(x == std::vector<int>{4, 8, 6, 7, 3, 0, 9, 1, 2, 5});
  PythonRandom big((uint64_t(1) << 40) + 5);  // a seed of two 32-bit words
  std::vector<int> y(7);
  std::iota(y.begin(), y.end(), 0);
  big.shuffle(y);
  CHECK(y == std::vector<int>{1, 3, 5, 0, 2, 6, 4});
}
