// DeepSpeed-Chat's step-2 (reward model) loss, on the per-token rewards the
// value head gives a batch of chosen and rejected sequences, as its
// RewardModel.forward computes it:
//   - a sequence ends at its (num_padding_at_beginning + 1)-th pad id (OPT's
//     bos is its pad id, so its scripts pass 1), else at T; with pad = eos
//     that is the eos the step appends;
//   - the pair's span runs from the first position where the two sequences
//     differ to the later of the two ends (identical pairs: the last
//     position alone, both ending at the chosen end);
//   - loss = mean over pairs of mean over the span of -logsigmoid(chosen -
//     rejected); an empty span gives NaN, as torch's mean of nothing;
//   - each sequence's score is its reward at the position before its end.
// The gradient with respect to every reward is returned alongside, for the
// value head's backward.
#pragma once
#include <cstdint>
#include <vector>

namespace ds::chat {

struct RewardPairs {
  const int32_t* chosen_ids = nullptr;    // (bs, T)
  const int32_t* rejected_ids = nullptr;  // (bs, T)
  const float* chosen_rewards = nullptr;  // (bs, T)
  const float* rejected_rewards = nullptr;
  int64_t bs = 0, T = 0;
  int32_t pad_id = 0;
  int num_padding_at_beginning = 0;
};

struct RewardLoss {
  double loss = 0;
  std::vector<float> chosen_scores, rejected_scores;   // (bs): the reward before each end
  std::vector<float> dchosen, drejected;               // (bs, T): d loss / d reward
};

// UserError when a pair differs at its first token (DeepSpeed-Chat asserts
// that it does not: its span must start after position 0).
RewardLoss reward_pair_loss(const RewardPairs& p);

}  // namespace ds::chat
