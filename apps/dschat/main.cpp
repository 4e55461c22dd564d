// dschat: DeepSpeed-Chat's three steps with the flags of their main.py
// scripts. A script's `deepspeed main.py FLAGS` becomes
// `dsrun dschat sft FLAGS` (step 1), `dsrun dschat reward FLAGS` (step 2) or
// `dsrun dschat ppo FLAGS` (step 3).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/chat/ppo.h"
#include "lib/chat/reward.h"
#include "lib/chat/sft.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"

namespace {

constexpr const char* kUsage =
    "usage: dschat sft|reward|ppo [DeepSpeed-Chat step-1, step-2 or step-3 flags]\n"
    "  sft     supervised fine-tuning (training/step1_supervised_finetuning/main.py)\n"
    "  reward  reward model (training/step2_reward_model_finetuning/main.py)\n"
    "  ppo     RLHF with PPO (training/step3_rlhf_finetuning/main.py)\n"
    "docs/dschat.md lists the flags and what each does.";

}  // namespace

int main(int argc, char** argv) {
  return ds::run_main("dschat", [&] {
    // The launcher's --local_rank=N (DeepSpeed's runner puts it right after
    // the program) goes to the step with the other flags.
    std::vector<std::string> rest;
    std::string step;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (step.empty() && a.rfind("--local_rank", 0) != 0) step = a;
      else rest.push_back(a);
    }
    if (step.empty() || step == "--help" || step == "-h") {
      std::printf("%s\n", kUsage);
      return step.empty() ? 1 : 0;
    }
    if (step == "sft") return ds::chat::run_sft(rest);
    if (step == "reward") return ds::chat::run_reward(rest);
    if (step == "ppo") return ds::chat::run_ppo(rest);
    throw ds::UserError("unknown step '" + step + "': expected sft, reward or ppo");
  });
}
