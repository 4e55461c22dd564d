// Interop probe: builds a small random GPT-2 or LLaMA model, exports it in
// Hugging Face format to DIR, and prints the model's mean next-token loss on a
// fixed token sequence, for hf_check.py to compare with transformers.
//   hf_probe gpt2|llama|gqa|mqa|neox|mixtral|opt|opt350m DIR
//   hf_probe import DIR     (reads DIR's config.json and weights instead)
// gqa / mqa: a LLaMA-shaped model assembled block by block as Megatron's flags
// build it (no family set), with 2 / 1 key-value heads for 4 query heads.
// neox: GPT-2 blocks with RoPE on a quarter of each head (exports as GPT-NeoX).
// mixtral: LLaMA blocks with 4 SwiGLU experts per layer, top-2, no capacity
// limit (exports as Mixtral). opt350m: OPT-350m's post-norm blocks and a
// 32-wide token embedding between project_in and project_out.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/ckpt/hf.h"
#include "lib/model/gpt.h"
#include "test/interop/probe_util.h"

using namespace ds;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hf_probe gpt2|llama|gqa|mqa|neox|mixtral|opt|opt350m|import DIR\n");
    return 2;
  }
  const std::string kind = argv[1];
  auto probe_loss = [](GptModel& model, int vocab) {
    const int64_t T = 32;
    Tensor tok = Tensor::empty({1, T}, DType::I32), tgt = Tensor::empty({1, T}, DType::I32);
    for (int64_t t = 0; t < T; ++t) tok.data<int32_t>()[t] = static_cast<int32_t>((t * 7919 + 13) % vocab);
    for (int64_t t = 0; t < T; ++t) tgt.data<int32_t>()[t] = t + 1 < T ? tok.data<int32_t>()[t + 1] : -1;
    std::printf("%.9g\n", model.forward_loss(tok, tgt));
  };
  if (kind == "import") {  // a model transformers wrote: config.json and model.safetensors
    const std::string dir = argv[2], file = dir + "/config.json";
    std::ifstream f(file);
    const ModelConfig m = model_config_from_hf(nlohmann::json::parse(f), file, 1, "hf_probe");
    GptModel model(m, Device::cpu());
    import_hf(m, model.layout(), model.params(), dir);
    probe_loss(model, m.vocab_size);
    return 0;
  }
  const bool llama = kind == "llama" || kind == "mixtral", flag_built = kind == "gqa" || kind == "mqa";
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_heads = 4;
  m.seq_length = 32;
  m.max_position_embeddings = 64;
  m.vocab_size = 300;
  m.padded_vocab_size = 384;
  if (llama) {
    set_model_family(m, ModelFamily::LLaMA);
    m.ffn_hidden_size = 96;
    m.norm_eps = 1e-6f;
    m.rope_theta = 500000.f;
  }
  if (flag_built) {  // --position-embedding-type rope --normalization rmsnorm --swiglu ... (family stays gpt2)
    m.norm = NormKind::RMSNorm;
    m.activation = Activation::SwiGLU;
    m.position = PositionKind::Rope;
    m.bias = false;
    m.untie_embeddings = true;
    m.ffn_hidden_size = 96;
    m.num_kv_heads = kind == "gqa" ? 2 : 1;
    m.rope_theta = 10000.f;
  }
  if (kind == "mixtral") {
    m.moe.num_experts = {4};
    m.moe.expert_interval = 1;
    m.moe.topk = 2;
    m.moe.drop_tokens = false;
    m.moe.top2_2nd_expert_sampling = false;
  }
  if (kind == "opt" || kind == "opt350m") m.activation = Activation::ReLU;  // GPT-2 blocks with ReLU: OPT
  if (kind == "opt350m") {
    m.post_norm = true;
    m.embed_proj_dim = 32;
  }
  if (kind == "neox") {  // --position-embedding-type rope --rotary-percent 0.25 on GPT-2 blocks
    m.position = PositionKind::Rope;
    m.rotary_percent = 0.25f;
    m.rope_theta = 20000.f;
  }
  GptModel model(m, Device::cpu());
  model.init_weights(17, 0.15f);
  test::vary_norms_and_biases(model);  // so their mapping is exercised too
  export_hf(m, model.layout(), model.params(), argv[2]);
  probe_loss(model, m.vocab_size);
  return 0;
}
