// DeepSpeed-Chat's PPO formulas (ppo_math.h).
#include "lib/chat/ppo_math.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace ds::chat {

namespace {

template <class T>
std::vector<T> slice_rows(const std::vector<T>& v, int64_t width, int64_t first, int64_t n) {
  return std::vector<T>(v.begin() + first * width, v.begin() + (first + n) * width);
}

// The entries of the batch's action mask (a float sum, as torch's mask.sum()).
float mask_count(const std::vector<float>& mask) {
  double n = 0;
  for (float m : mask) n += m;
  return static_cast<float>(n);
}

}  // namespace

Experience Experience::rows(int64_t first, int64_t n) const {
  DS_CHECK(first >= 0 && n >= 1 && first + n <= B, "experience rows [{}, {}) of {}", first, first + n, B);
  Experience e;
  e.B = n;
  e.L = L;
  e.P = P;
  e.seq = slice_rows(seq, L, first, n);
  e.mask = slice_rows(mask, L, first, n);
  e.logprobs = slice_rows(logprobs, L - 1, first, n);
  e.ref_logprobs = slice_rows(ref_logprobs, L - 1, first, n);
  e.values = slice_rows(values, L - 1, first, n);
  e.rewards = slice_rows(rewards, 1, first, n);
  return e;
}

PpoTargets ppo_targets(const Experience& e, const PpoConstants& k) {
  const int64_t B = e.B, L1 = e.L - 1, start = e.start(), W = e.W();
  DS_CHECK(start >= 0 && W >= 1, "ppo_targets: prompt {} of sequences of {}", e.P, e.L);
  PpoTargets t;
  t.B = B;
  t.W = W;
  t.advantages.resize(static_cast<size_t>(B * W));
  t.returns.resize(static_cast<size_t>(B * W));
  t.old_logprobs.resize(static_cast<size_t>(B * W));
  t.old_values.resize(static_cast<size_t>(B * W));
  t.action_mask.resize(static_cast<size_t>(B * W));
  std::vector<float> rewards(static_cast<size_t>(L1)), values(static_cast<size_t>(L1));
  for (int64_t b = 0; b < B; ++b) {
    const float* lp = e.logprobs.data() + b * L1;
    const float* ref = e.ref_logprobs.data() + b * L1;
    int64_t count = 0;  // action_mask[:, start:].sum(1): the attention mask of tokens start + 1 ...
    for (int64_t i = start; i < L1; ++i) count += e.mask[static_cast<size_t>(b * e.L + i + 1)];
    const int64_t ends = start + count + 1;
    for (int64_t i = 0; i < L1; ++i) {
      rewards[static_cast<size_t>(i)] = -k.kl_ctl * (lp[i] - ref[i]);
      values[static_cast<size_t>(i)] = e.values[static_cast<size_t>(b * L1 + i)];
    }
    const float clipped = std::clamp(e.rewards[static_cast<size_t>(b)], -k.clip_reward_value, k.clip_reward_value);
    rewards[static_cast<size_t>(std::min(ends, L1) - 1)] += clipped;  // rewards[j, start:ends[j]][-1]
    for (int64_t i = ends; i < L1; ++i) rewards[static_cast<size_t>(i)] = values[static_cast<size_t>(i)] = 0.f;
    // get_advantages_and_returns
    float lastgaelam = 0.f;
    for (int64_t i = L1 - 1; i >= start; --i) {
      const float next = i < L1 - 1 ? values[static_cast<size_t>(i + 1)] : 0.f;
      const float delta = rewards[static_cast<size_t>(i)] + k.gamma * next - values[static_cast<size_t>(i)];
      lastgaelam = delta + k.gamma * k.lam * lastgaelam;
      const size_t o = static_cast<size_t>(b * W + (i - start));
      t.advantages[o] = lastgaelam;
      t.returns[o] = lastgaelam + values[static_cast<size_t>(i)];
      t.old_values[o] = values[static_cast<size_t>(i)];
      t.old_logprobs[o] = lp[i];
      t.action_mask[o] = e.mask[static_cast<size_t>(b * e.L + i + 1)];
    }
  }
  return t;
}

LossGrad actor_loss(const std::vector<float>& logprobs, const PpoTargets& t, const PpoConstants& k) {
  const size_t n = static_cast<size_t>(t.B * t.W);
  DS_CHECK(logprobs.size() == n, "actor_loss: {} log-probabilities for {} entries", logprobs.size(), n);
  const float count = mask_count(t.action_mask);
  LossGrad r;
  r.grad.assign(n, 0.f);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float m = t.action_mask[i], a = t.advantages[i];
    const float ratio = std::exp((logprobs[i] - t.old_logprobs[i]) * m);
    const float clipped = std::clamp(ratio, 1.f - k.cliprange, 1.f + k.cliprange);
    const float pg1 = -a * ratio, pg2 = -a * clipped;
    sum += static_cast<double>(std::max(pg1, pg2) * m);
    // d/d ratio of max(pg1, pg2): pg1's -a, pg2's -a where the clamp passes it; a tie splits it.
    const bool passes = ratio >= 1.f - k.cliprange && ratio <= 1.f + k.cliprange;
    const float d1 = -a, d2 = passes ? -a : 0.f;
    const float dratio = pg1 > pg2 ? d1 : pg1 < pg2 ? d2 : 0.5f * (d1 + d2);
    r.grad[i] = m / count * dratio * ratio * m;
  }
  r.loss = static_cast<float>(sum) / count;
  return r;
}

LossGrad critic_loss(const std::vector<float>& values, const PpoTargets& t, const PpoConstants& k) {
  const size_t n = static_cast<size_t>(t.B * t.W);
  DS_CHECK(values.size() == n, "critic_loss: {} values for {} entries", values.size(), n);
  const float count = mask_count(t.action_mask);
  LossGrad r;
  r.grad.assign(n, 0.f);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float m = t.action_mask[i], v = values[i], ret = t.returns[i], old = t.old_values[i];
    const float lo = old - k.cliprange_value, hi = old + k.cliprange_value;
    const float vc = std::min(std::max(v, lo), hi);  // torch.clamp(values, lo, hi)
    const float l1 = (v - ret) * (v - ret), l2 = (vc - ret) * (vc - ret);
    sum += static_cast<double>(std::max(l1, l2) * m);
    const float d1 = 2.f * (v - ret), d2 = v >= lo && v <= hi ? 2.f * (vc - ret) : 0.f;
    const float dv = l1 > l2 ? d1 : l1 < l2 ? d2 : 0.5f * (d1 + d2);
    r.grad[i] = 0.5f * m / count * dv;
  }
  r.loss = 0.5f * static_cast<float>(sum) / count;
  return r;
}

}  // namespace ds::chat
