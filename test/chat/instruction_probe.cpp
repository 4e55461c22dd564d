// Probe of finetune_llama.py's instruction dataset (lib/chat/instruction_data.h):
//   instruction_probe DATA.json TOKENIZER_DIR SEQ_LENGTH MICRO DP GROUPS
// prints one JSON line per (group, data-parallel rank) for the first GROUPS
// groups of MICRO x DP samples: that rank's micro-batch as the trainer gets
// it (tokens, targets, loss weight scale), for instruction_check.py.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/chat/instruction_data.h"
#include "lib/core/run_main.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: instruction_probe DATA.json TOKENIZER_DIR SEQ_LENGTH MICRO DP GROUPS\n");
    return 2;
  }
  return ds::run_main("instruction_probe", [&] {
    const std::string T = argv[3], B = argv[4];
    const int dp = std::stoi(argv[5]), groups = std::stoi(argv[6]);
    std::vector<std::string> args = {"dstrain", "--data-path", argv[1], "--tokenizer-type", "HFTokenizer",
                                     "--tokenizer-model", argv[2], "--seq-length", T, "--max-position-embeddings", T,
                                     "--micro-batch-size", B, "--global-batch-size",
                                     std::to_string(std::stoi(B) * dp), "--num-layers", "1", "--hidden-size", "8",
                                     "--num-attention-heads", "1", "--train-iters", "1"};
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    const ds::TrainConfig cfg = ds::parse_train_config(static_cast<int>(av.size()), av.data(), dp);
    if (!ds::chat::is_instruction_data(cfg)) return 1;
    auto src = ds::chat::make_instruction_source(cfg, ds::Device::cpu());
    const int64_t mb = std::stoll(B);
    for (int g = 0; g < groups; ++g)
      for (int r = 0; r < dp; ++r) {
        // Group g as micro-batch 0 of the step that starts at sample g x micro x dp.
        ds::MicroBatch m = src->train_batch(int64_t{g} * mb * dp, 0, r, dp);
        auto rows = [](const ds::Tensor& t) {
          return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
        };
        nlohmann::json j = {{"group", g}, {"rank", r}, {"tokens", rows(m.tokens)}, {"targets", rows(m.targets)},
                            {"scale", m.loss_weight_scale}};
        std::printf("%s\n", j.dump().c_str());
      }
    return 0;
  });
}
