// Small random models for the generation tests: GPT-2 blocks with learned
// positions, LLaMA blocks with grouped-query attention (RoPE, RMSNorm,
// SwiGLU, untied head), Mixtral's, and OPT-350m's (post-norm, projected
// embedding). Weights drawn with a large std so that the logits
// are far from uniform and greedy tokens are well separated.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "lib/model/gpt.h"

namespace ds::test {

inline ModelConfig gen_model_config(const std::string& kind) {
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_heads = 4;
  m.seq_length = 64;
  m.max_position_embeddings = 64;
  m.vocab_size = 300;
  m.padded_vocab_size = 384;
  m.hidden_dropout = m.attention_dropout = 0.f;
  if (kind == "llama" || kind == "mixtral") {
    set_model_family(m, ModelFamily::LLaMA);
    m.ffn_hidden_size = 96;
    m.num_kv_heads = 2;
    m.rope_theta = 10000.f;
  }
  if (kind == "opt350m") {  // OPT-350m's blocks: post-norm, ReLU, a 32-wide token embedding
    m.activation = Activation::ReLU;
    m.position_offset = 2;
    m.post_norm = true;
    m.embed_proj_dim = 32;
  }
  if (kind == "mixtral") {  // LLaMA blocks with 4 SwiGLU experts, top-2, no capacity limit
    m.moe.num_experts = {4};
    m.moe.expert_interval = 1;
    m.moe.topk = 2;
    m.moe.drop_tokens = false;
    m.moe.top2_2nd_expert_sampling = false;
  }
  return m;
}

inline std::unique_ptr<GptModel> gen_model(const std::string& kind, Device dev = Device::cpu(),
                                           DType compute = DType::F32) {
  auto model = std::make_unique<GptModel>(gen_model_config(kind), dev, 0, TpComm{}, PipeStage{}, compute);
  GptModel cpu(gen_model_config(kind), Device::cpu());
  cpu.init_weights(7, 0.2f);
  model->store().set_full_params(cpu.params().view(0, {cpu.layout().total}));
  return model;
}

inline std::vector<std::vector<int32_t>> gen_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int n : {3, 11, 1, 7}) {
    std::vector<int32_t> ids;
    for (int t = 0; t < n; ++t) ids.push_back(static_cast<int32_t>((t * 7919 + n * 31 + 5) % 300));
    p.push_back(ids);
  }
  return p;
}

}  // namespace ds::test
