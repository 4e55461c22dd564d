// dschat ppo: DeepSpeed-Chat's step 3 (RLHF with PPO), with the flags,
// defaults and meaning of its training/step3_rlhf_finetuning/main.py and
// dschat/rlhf/{rlhf_engine,ppo_trainer}.py. Four models in one job: the
// actor (the step-1 model, trained) and its frozen reference copy, the critic
// (the step-2 reward model, trained) and its frozen reward copy. Each
// generation batch of phase-3 prompts (left-padded to --max_prompt_seq_len)
// is answered greedily by the actor's training weights with a KV cache
// (lib/gen/generator.h: DeepSpeed's hybrid engine), scored (log-probabilities
// of actor and reference, the critic's values, the reward model's end
// score), and trained on with ppo_math.h's formulas: the actor's clipped
// policy loss, then the critic's clipped value loss, each model its own
// AdamW, schedule, ZeRO stage and LoRA; with --enable_ema an exponential
// moving average of the actor. The actor, the critic (and actor_ema) are
// written to --output_dir as step 3 writes them. docs/dschat.md lists what
// is implemented and what is refused.
#pragma once
#include <string>
#include <vector>

namespace ds::chat {

// argv: the flags after "dschat ppo". Joins the launcher's job (RANK,
// WORLD_SIZE, ...; one process without them). Returns the exit code.
int run_ppo(const std::vector<std::string>& argv);

}  // namespace ds::chat
