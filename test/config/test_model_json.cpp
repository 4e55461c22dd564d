// The saved "model" section (config.json in every checkpoint) is a format:
// these are its exact bytes today for a GPT-2, a LLaMA and an MoE config, so
// that a change to how the section is read or written cannot change them.
// DS_PRINT_MODEL_JSON=1 prints what the code writes now.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "test/config/temp_dir.h"

using namespace ds;
using nlohmann::json;

namespace {

std::string model_section(const json& model, std::vector<std::string> flags = {}) {
  test::TempDir d;
  const std::string path = d.path + "/ds_config.json";
  json j = {{"train_micro_batch_size_per_gpu", 2}, {"training", {{"train_iters", 10}}}, {"model", model}};
  std::ofstream(path) << j.dump(2);
  std::vector<std::string> args = {"dstrain", "--config", path};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string out = parse_train_config(static_cast<int>(args.size()), argv.data(), 1).resolved["model"].dump();
  if (std::getenv("DS_PRINT_MODEL_JSON")) std::cout << out << "\n";
  return out;
}

}  // namespace

TEST_CASE("the saved model section keeps its bytes", "[config][resolved]") {
  CHECK(model_section({{"vocab_size", 50257}}) == R"({"activation":"gelu","attention_dropout":0.1,"bias":true,"family":"gpt2","ffn_hidden_size":3072,"hidden_dropout":0.1,"hidden_size":768,"init_method_std":0.02,"make_vocab_size_divisible_by":128,"max_position_embeddings":1024,"moe":{"drop_tokens":true,"eval_capacity_factor":1.0,"expert_interval":2,"expert_parallel_size":1,"expert_tensor_parallelism":false,"loss_coeff":0.1,"min_capacity":4,"mlp_type":"standard","noisy_gate_policy":"none","num_experts":[1],"top2_2nd_expert_sampling":true,"topk":1,"train_capacity_factor":1.0,"use_rts":true},"norm":"layernorm","norm_eps":1e-05,"num_heads":12,"num_key_value_heads":12,"num_layers":12,"position":"learned","rope_theta":10000.0,"rotary_percent":1.0,"seq_length":1024,"untie_embeddings":false,"vocab_size":50257})");
  CHECK(model_section({{"family", "llama"}, {"num_layers", 4}, {"hidden_size", 256}, {"num_heads", 8},
                       {"num_key_value_heads", 2}, {"vocab_size", 32000}, {"rope_theta", 500000.0}}) ==
        R"({"activation":"swiglu","attention_dropout":0.1,"bias":false,"family":"llama","ffn_hidden_size":640,"hidden_dropout":0.1,"hidden_size":256,"init_method_std":0.02,"make_vocab_size_divisible_by":128,"max_position_embeddings":1024,"moe":{"drop_tokens":true,"eval_capacity_factor":1.0,"expert_interval":2,"expert_parallel_size":1,"expert_tensor_parallelism":false,"loss_coeff":0.1,"min_capacity":4,"mlp_type":"standard","noisy_gate_policy":"none","num_experts":[1],"top2_2nd_expert_sampling":true,"topk":1,"train_capacity_factor":1.0,"use_rts":true},"norm":"rmsnorm","norm_eps":1e-05,"num_heads":8,"num_key_value_heads":2,"num_layers":4,"position":"rope","rope_theta":500000.0,"rotary_percent":1.0,"seq_length":1024,"untie_embeddings":true,"vocab_size":32000})");
  CHECK(model_section({{"num_layers", 4}, {"hidden_size", 128}, {"num_heads", 4}, {"vocab_size", 1000}},
                      {"--num-experts", "4", "--topk", "2", "--moe-train-capacity-factor", "1.25",
                       "--moe-loss-coeff", "0.01", "--hidden-dropout", "0"}) ==
        R"({"activation":"gelu","attention_dropout":0.1,"bias":true,"family":"gpt2","ffn_hidden_size":512,"hidden_dropout":0.0,"hidden_size":128,"init_method_std":0.02,"make_vocab_size_divisible_by":128,"max_position_embeddings":1024,"moe":{"drop_tokens":true,"eval_capacity_factor":1.0,"expert_interval":2,"expert_parallel_size":1,"expert_tensor_parallelism":false,"loss_coeff":0.01,"min_capacity":4,"mlp_type":"standard","noisy_gate_policy":"none","num_experts":[4],"top2_2nd_expert_sampling":true,"topk":2,"train_capacity_factor":1.25,"use_rts":true},"norm":"layernorm","norm_eps":1e-05,"num_heads":4,"num_key_value_heads":4,"num_layers":4,"position":"learned","rope_theta":10000.0,"rotary_percent":1.0,"seq_length":1024,"untie_embeddings":false,"vocab_size":1000})");
}

TEST_CASE("OPT's model keys: relu and the embedding dropout, written only when set", "[config][resolved]") {
  const std::string opt = model_section({{"vocab_size", 1000}, {"activation", "relu"}, {"embedding_dropout", 0.0}});
  CHECK(opt.find(R"("activation":"relu")") != std::string::npos);
  CHECK(opt.find(R"("embedding_dropout":0.0)") != std::string::npos);
  CHECK(model_section({{"vocab_size", 1000}}).find("embedding_dropout") == std::string::npos);
  CHECK(model_section({{"vocab_size", 1000}}).find("decay_block_norms") == std::string::npos);
  CHECK(model_section({{"vocab_size", 1000}, {"decay_block_norms", true}}).find(R"("decay_block_norms":true)") !=
        std::string::npos);
  CHECK_THROWS_WITH(model_section({{"vocab_size", 1000}, {"embedding_dropout", 1.5}}),
                    Catch::Matchers::Contains("model.embedding_dropout must be in [0, 1)"));
  CHECK_THROWS_WITH(model_section({{"vocab_size", 1000}, {"activation", "relu"}}, {"--num-experts", "4"}),
                    Catch::Matchers::Contains("relu (OPT's MLP) with Mixture-of-Experts"));
}

// MoE flags on a model without MoE layers change nothing, as upstream (the
// dense MoE scripts pass them with --num-experts 1): one warning names them.
TEST_CASE("MoE flags on a dense model are one warning naming them", "[config]") {
  auto warnings = [](const json& model, std::vector<std::string> flags) {
    test::TempDir d;
    const std::string path = d.path + "/ds_config.json";
    std::ofstream(path) << json{{"train_micro_batch_size_per_gpu", 2}, {"model", model}}.dump();
    std::vector<std::string> args = {"dstrain", "--config", path};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::string all;
    for (const auto& w : parse_train_config(static_cast<int>(args.size()), argv.data(), 1).warnings) all += w + "\n";
    return all;
  };
  const json small = {{"num_layers", 4}, {"hidden_size", 128}, {"num_heads", 4}, {"vocab_size", 1000}};
  CHECK_THAT(warnings(small, {"--num-experts", "1", "--moe-expert-parallel-size", "2", "--topk", "2"}),
             Catch::Matchers::Contains("--topk, --moe-expert-parallel-size: the model has no Mixture-of-Experts "
                                       "layers (--num-experts 1), so these change nothing"));
  CHECK_THAT(warnings(small, {"--disable-moe-token-dropping"}),
             Catch::Matchers::Contains("--disable-moe-token-dropping: the model has no Mixture-of-Experts layers "
                                       "(--num-experts 1), so this changes nothing"));
  CHECK(warnings(small, {"--num-experts", "4", "--topk", "2"}).find("no Mixture-of-Experts") == std::string::npos);
  json moe = small;
  moe["moe"] = {{"num_experts", {4}}};
  CHECK(warnings(moe, {"--topk", "2"}).find("no Mixture-of-Experts") == std::string::npos);
  CHECK(warnings(small, {"--num-experts", "1"}).find("no Mixture-of-Experts") == std::string::npos);
}
