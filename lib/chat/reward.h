// dschat reward: DeepSpeed-Chat's step 2 (reward model fine-tuning), with
// the flags, defaults and meaning of its training/step2_reward_model_
// finetuning/main.py: the model's backbone with a bias-free value head
// (ModelConfig::value_head; v_head read from a reward model's file, else
// nn.Linear's default init), the phase-2 pairs (prompt + chosen and prompt +
// rejected, each with "<|endoftext|>", padded to --max_seq_len with their
// attention masks), batches of [chosen; rejected] in PyTorch's
// DistributedSampler order, the pairwise loss of reward_loss.h, AdamW with
// betas (0.9, 0.95), clipping 1.0, transformers' schedule, evaluation_reward's
// scores and accuracy before training, every --eval_interval steps and after
// each epoch, and the model written to --output_dir in RewardModel's names.
// docs/dschat.md lists what is implemented and what is refused.
#pragma once
#include <string>
#include <vector>

namespace ds::chat {

// argv: the flags after "dschat reward". Joins the launcher's job (RANK,
// WORLD_SIZE, ...; one process without them). Returns the exit code.
int run_reward(const std::vector<std::string>& argv);

}  // namespace ds::chat
