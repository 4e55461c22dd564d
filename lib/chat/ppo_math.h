// DeepSpeed-Chat's PPO formulas (dschat/rlhf/ppo_trainer.py) on one batch of
// experience in its padded layout: B sequences of L tokens, the first P the
// left-padded prompt, the rest the generated answer right-padded; per-token
// arrays have L - 1 entries per row (entry i belongs to the prediction of
// token i + 1). Everything upstream computes is computed here in the same
// order, in f32 (compute_fp32_loss's precision):
// - compute_rewards: -kl_ctl (log p - log p_ref) per token, the reward
//   model's score clamped to [-5, 5] added at entry min(ends, L - 1) - 1,
//   ends = start + the answer's attention-mask count + 1, start = P - 1;
// - rewards and values zeroed from `ends` on (in place: the critic loss's old
//   values are the zeroed ones);
// - GAE from the last entry back to `start` (gamma 1, lambda 0.95),
//   returns = advantages + values;
// - the clipped policy loss (cliprange 0.2) and the clipped value loss
//   (cliprange_value 0.2), each the sum over the batch's action-mask entries
//   divided by their count, with gradients as torch's autograd gives them
//   (torch.max's tie splits the gradient in halves, clamp passes it at its
//   bounds).
#pragma once
#include <cstdint>
#include <vector>

namespace ds::chat {

struct PpoConstants {  // DeepSpeedPPOTrainer's
  float kl_ctl = 0.1f, clip_reward_value = 5.f, cliprange = 0.2f, cliprange_value = 0.2f;
  float gamma = 1.f, lam = 0.95f;
};

// One generated batch as generate_experience returns it.
struct Experience {
  int64_t B = 0, L = 0, P = 0;
  std::vector<int32_t> seq;   // B x L
  std::vector<uint8_t> mask;  // B x L: seq != pad
  std::vector<float> logprobs, ref_logprobs, values;  // B x (L - 1); values are the critic's
  std::vector<float> rewards;                         // B: the reward model's end scores
  int64_t start() const { return P - 1; }
  int64_t W() const { return L - 1 - start(); }  // entries from start on
  // The rows [first, first + n) (MiniDataset's slicing).
  Experience rows(int64_t first, int64_t n) const;
};

// What train_rlhf derives from the experience before the forward passes:
// advantages and returns (B x W), the old log-probabilities and values from
// start on (the values zeroed from ends), and the action mask from start on.
struct PpoTargets {
  int64_t B = 0, W = 0;
  std::vector<float> advantages, returns, old_logprobs, old_values, action_mask;
};
PpoTargets ppo_targets(const Experience& e, const PpoConstants& k);

// A loss and its gradient with respect to its per-entry input (B x W).
struct LossGrad {
  float loss = 0;
  std::vector<float> grad;
};
// actor_loss_fn(logprobs, old_logprobs, advantages, mask).
LossGrad actor_loss(const std::vector<float>& logprobs, const PpoTargets& t, const PpoConstants& k);
// critic_loss_fn(values, old_values, returns, mask).
LossGrad critic_loss(const std::vector<float>& values, const PpoTargets& t, const PpoConstants& k);

}  // namespace ds::chat
