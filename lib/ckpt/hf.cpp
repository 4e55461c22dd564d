// Name and orientation mapping between our layout and Hugging Face models.
// GPT-2 uses Conv1D (weights stored (in, out)), so every matrix is transposed;
// its fused c_attn keeps our [q|k|v] row order. LLaMA uses nn.Linear (out, in),
// so q/k/v and gate/up are row slices of our fused qkv and fc weights (with
// grouped-query attention k and v have NKV*HS rows). Our RoPE uses the
// rotate-half convention, as transformers' LLaMA does, so no permutation of
// q/k rows is needed (GPT-NeoX rotates the same way, on its first rotary_pct
// dims, but its fused qkv groups rows per head). The architecture follows the
// blocks, not the family flag: a model built from Megatron's block flags
// exports as what it is.
#include "lib/ckpt/hf.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "lib/ckpt/file_io.h"
#include "lib/ckpt/safetensors.h"
#include "lib/ckpt/torch_save.h"
#include "lib/core/error.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

// The (first row, row count) runs of our weight (R rows) that make the HF
// tensor, in its row order.
std::vector<std::pair<int64_t, int64_t>> row_runs(const HfPiece& p, int64_t R) {
  if (p.head_interleave == 0) return {{p.row0, p.rows < 0 ? R : p.rows}};
  const int64_t HS = p.head_interleave, C = R / 3;
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t h = 0; h < C / HS; ++h)
    for (int64_t part = 0; part < 3; ++part) runs.push_back({part * C + h * HS, HS});
  return runs;
}

std::vector<HfPiece> gpt2_map(const ModelDims& d) {
  std::vector<HfPiece> m = {{"transformer.wte.weight", "embed.wte", 0, d.V, false},
                            {"transformer.wpe.weight", "embed.wpe", 0, -1, false}};
  for (int l = 0; l < d.L; ++l) {
    std::string h = "transformer.h." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    m.push_back({h + "ln_1.weight", o + "norm1.weight"});
    m.push_back({h + "ln_1.bias", o + "norm1.bias"});
    m.push_back({h + "attn.c_attn.weight", o + "attn.qkv.weight", 0, -1, true});
    m.push_back({h + "attn.c_attn.bias", o + "attn.qkv.bias"});
    m.push_back({h + "attn.c_proj.weight", o + "attn.proj.weight", 0, -1, true});
    m.push_back({h + "attn.c_proj.bias", o + "attn.proj.bias"});
    m.push_back({h + "ln_2.weight", o + "norm2.weight"});
    m.push_back({h + "ln_2.bias", o + "norm2.bias"});
    m.push_back({h + "mlp.c_fc.weight", o + "mlp.fc.weight", 0, -1, true});
    m.push_back({h + "mlp.c_fc.bias", o + "mlp.fc.bias"});
    m.push_back({h + "mlp.c_proj.weight", o + "mlp.proj.weight", 0, -1, true});
    m.push_back({h + "mlp.c_proj.bias", o + "mlp.proj.bias"});
  }
  m.push_back({"transformer.ln_f.weight", "final_norm.weight"});
  m.push_back({"transformer.ln_f.bias", "final_norm.bias"});
  if (d.untied) m.push_back({"lm_head.weight", "head.weight", 0, d.V, false});
  return m;
}

// OPT (OPTForCausalLM): LayerNorm, ReLU, biases, separate q/k/v
// projections (our qkv rows [q|k|v]), learned positions offset by 2: an
// imported OPT keeps the whole table (model.position_offset 2, row 1 is the
// padding tokens' position); a ReLU model without the offset writes 2 zero
// rows first. OPT-350m: post-norm blocks (do_layer_norm_before false, no
// final norm) and project_in / project_out around a narrower token embedding
// (word_embed_proj_dim).
std::vector<HfPiece> opt_map(const ModelDims& d) {
  const std::string dec = "model.decoder.";
  std::vector<HfPiece> m = {{dec + "embed_tokens.weight", "embed.wte", 0, d.V, false},
                            {dec + "embed_positions.weight", "embed.wpe", 0, -1, false, 0, 2 - d.pos_offset}};
  if (d.projects()) m.push_back({dec + "project_in.weight", "embed.project_in"});
  const int64_t C = d.C;
  for (int l = 0; l < d.L; ++l) {
    std::string h = dec + "layers." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    m.push_back({h + "self_attn_layer_norm.weight", o + "norm1.weight"});
    m.push_back({h + "self_attn_layer_norm.bias", o + "norm1.bias"});
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; ++k) {
      m.push_back({h + "self_attn." + qkv[k] + ".weight", o + "attn.qkv.weight", k * C, C});
      m.push_back({h + "self_attn." + qkv[k] + ".bias", o + "attn.qkv.bias", k * C, C});
    }
    m.push_back({h + "self_attn.out_proj.weight", o + "attn.proj.weight"});
    m.push_back({h + "self_attn.out_proj.bias", o + "attn.proj.bias"});
    m.push_back({h + "final_layer_norm.weight", o + "norm2.weight"});
    m.push_back({h + "final_layer_norm.bias", o + "norm2.bias"});
    m.push_back({h + "fc1.weight", o + "mlp.fc.weight"});
    m.push_back({h + "fc1.bias", o + "mlp.fc.bias"});
    m.push_back({h + "fc2.weight", o + "mlp.proj.weight"});
    m.push_back({h + "fc2.bias", o + "mlp.proj.bias"});
  }
  if (d.final_norm()) {
    m.push_back({dec + "final_layer_norm.weight", "final_norm.weight"});
    m.push_back({dec + "final_layer_norm.bias", "final_norm.bias"});
  }
  if (d.projects()) m.push_back({dec + "project_out.weight", "head.project_out"});
  if (d.untied) m.push_back({"lm_head.weight", "head.weight", 0, d.V, false});
  return m;
}

// A LLaMA layer's norms and attention (LLaMA and Mixtral): HF prefix h, ours o.
void push_llama_attention(std::vector<HfPiece>& m, const std::string& h, const std::string& o, const ModelDims& d) {
  const int64_t C = d.C, KV = int64_t{d.NKV} * d.HS;
  m.push_back({h + "input_layernorm.weight", o + "norm1.weight"});
  m.push_back({h + "self_attn.q_proj.weight", o + "attn.qkv.weight", 0, C});
  m.push_back({h + "self_attn.k_proj.weight", o + "attn.qkv.weight", C, KV});
  m.push_back({h + "self_attn.v_proj.weight", o + "attn.qkv.weight", C + KV, KV});
  m.push_back({h + "self_attn.o_proj.weight", o + "attn.proj.weight"});
  m.push_back({h + "post_attention_layernorm.weight", o + "norm2.weight"});
}

std::vector<HfPiece> llama_map(const ModelDims& d) {
  std::vector<HfPiece> m = {{"model.embed_tokens.weight", "embed.wte", 0, d.V, false}};
  const int64_t F = d.F;
  for (int l = 0; l < d.L; ++l) {
    std::string h = "model.layers." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    push_llama_attention(m, h, o, d);
    m.push_back({h + "mlp.gate_proj.weight", o + "mlp.fc.weight", 0, F});
    m.push_back({h + "mlp.up_proj.weight", o + "mlp.fc.weight", F, F});
    m.push_back({h + "mlp.down_proj.weight", o + "mlp.proj.weight"});
  }
  m.push_back({"model.norm.weight", "final_norm.weight"});
  if (d.untied) m.push_back({"lm_head.weight", "head.weight", 0, d.V, false});
  return m;
}

// Mixtral: LLaMA blocks whose MLP is a router and SwiGLU experts. Our
// stacked expert weights are read as matrices (matrix_shape): expert e's w1
// and w3 are the gate and up rows of fc (E * 2F rows), its w2 the rows
// [e * C, (e + 1) * C) of proj (E * C rows).
std::vector<HfPiece> mixtral_map(const ModelDims& d) {
  std::vector<HfPiece> m = {{"model.embed_tokens.weight", "embed.wte", 0, d.V, false}};
  const int64_t C = d.C, F = d.F;
  for (int l = 0; l < d.L; ++l) {
    std::string h = "model.layers." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    push_llama_attention(m, h, o, d);
    m.push_back({h + "block_sparse_moe.gate.weight", o + "mlp.gate.weight"});
    for (int64_t e = 0; e < d.layer_experts(l); ++e) {
      const std::string x = h + "block_sparse_moe.experts." + std::to_string(e) + ".";
      m.push_back({x + "w1.weight", o + "mlp.experts.fc.weight", e * 2 * F, F});
      m.push_back({x + "w3.weight", o + "mlp.experts.fc.weight", e * 2 * F + F, F});
      m.push_back({x + "w2.weight", o + "mlp.experts.proj.weight", e * C, C});
    }
  }
  m.push_back({"model.norm.weight", "final_norm.weight"});
  if (d.untied) m.push_back({"lm_head.weight", "head.weight", 0, d.V, false});
  return m;
}

// A weight as the matrix the pieces cut rows from: stacked expert weights
// (E, R, K) are (E * R, K); others as they are.
Shape matrix_shape(const Shape& s) { return s.size() == 3 ? Shape{s[0] * s[1], s[2]} : s; }

// GPT-NeoX (LayerNorm, GELU, biases, RoPE on rotary_pct of each head; the
// sequential residual of use_parallel_residual = false). Its fused qkv holds
// each head's q, k, v rows together; the output layer is always embed_out.
std::vector<HfPiece> neox_map(const ModelDims& d) {
  std::vector<HfPiece> m = {{"gpt_neox.embed_in.weight", "embed.wte", 0, d.V, false}};
  for (int l = 0; l < d.L; ++l) {
    std::string h = "gpt_neox.layers." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    m.push_back({h + "input_layernorm.weight", o + "norm1.weight"});
    m.push_back({h + "input_layernorm.bias", o + "norm1.bias"});
    m.push_back({h + "attention.query_key_value.weight", o + "attn.qkv.weight", 0, -1, false, d.HS});
    m.push_back({h + "attention.query_key_value.bias", o + "attn.qkv.bias", 0, -1, false, d.HS});
    m.push_back({h + "attention.dense.weight", o + "attn.proj.weight"});
    m.push_back({h + "attention.dense.bias", o + "attn.proj.bias"});
    m.push_back({h + "post_attention_layernorm.weight", o + "norm2.weight"});
    m.push_back({h + "post_attention_layernorm.bias", o + "norm2.bias"});
    m.push_back({h + "mlp.dense_h_to_4h.weight", o + "mlp.fc.weight"});
    m.push_back({h + "mlp.dense_h_to_4h.bias", o + "mlp.fc.bias"});
    m.push_back({h + "mlp.dense_4h_to_h.weight", o + "mlp.proj.weight"});
    m.push_back({h + "mlp.dense_4h_to_h.bias", o + "mlp.proj.bias"});
  }
  m.push_back({"gpt_neox.final_layer_norm.weight", "final_norm.weight"});
  m.push_back({"gpt_neox.final_layer_norm.bias", "final_norm.bias"});
  m.push_back({"embed_out.weight", d.untied ? "head.weight" : "embed.wte", 0, d.V, false});
  return m;
}

enum class HfArch { GPT2, LLaMA, GPTNeoX, Mixtral, OPT };

// The Hugging Face architecture the model's blocks make, whatever flags built
// it: learned positions -> GPT2LMHeadModel; RoPE with RMSNorm and SwiGLU ->
// LlamaForCausalLM; RoPE with LayerNorm and GELU (partial rotation allowed)
// -> GPTNeoXForCausalLM. A block the architecture cannot hold is one
// UserError naming it.
HfArch hf_arch(const ModelDims& d, const char* what) {
  auto refuse = [&](const std::string& block, const char* arch, const char* needs) {
    DS_USER_ERROR("{}: the model's {} does not map onto Hugging Face {} ({}); no supported Hugging Face "
                  "architecture holds this combination",
                  what, block, arch, needs);
  };
  int moe_layers = 0;
  for (int e : d.experts) moe_layers += e > 1 ? 1 : 0;
  if (moe_layers > 0) {  // Mixtral: LLaMA blocks, an MoE MLP in every layer, top-k >= 2 renormalised
    const char* arch = "MixtralForCausalLM",
                *needs = "LLaMA blocks (RoPE, RMSNorm, SwiGLU experts, no biases), experts in every layer "
                         "(--expert-interval 1) and --topk of at least 2 (Mixtral renormalises the top-k gates)";
    if (moe_layers != d.L) refuse(fmt::format("dense layers between MoE layers ({} of {} are MoE)", moe_layers, d.L),
                                  arch, needs);
    if (!d.rope || !d.rmsnorm || !d.swiglu || d.bias || d.rot != d.HS)
      refuse("Mixture of Experts on blocks other than LLaMA's", arch, needs);
    if (d.topk < 2) refuse("top-1 routing (its weight is the gate itself, not renormalised)", arch, needs);
    if (d.moe_residual) refuse("PR-MoE's dense MLP beside the experts (--mlp-type residual)", arch, needs);
    return HfArch::Mixtral;
  }
  if ((d.post_norm || d.projects()) && !d.relu)
    refuse(d.post_norm ? "post-norm blocks" : "projected token embedding", "OPTForCausalLM",
           "OPT-350m's post-norm blocks and project_in / project_out come with OPT's ReLU blocks");
  if (d.relu) {  // OPT: learned positions, LayerNorm, ReLU, biases, multi-head attention
    const char* arch = "OPTForCausalLM", *needs = "ReLU needs learned positions, LayerNorm, biases and NKV = NH";
    if (d.rope) refuse("ReLU with RoPE", arch, needs);
    if (d.rmsnorm) refuse("RMSNorm with ReLU", arch, needs);
    if (!d.bias) refuse("linear layers without biases with ReLU", arch, needs);
    if (d.NKV != d.NH) refuse("grouped-query attention with ReLU", arch, needs);
    if (d.pos_offset == 1) refuse("model.position_offset 1", arch, "OPT's positions start at row 2 (or 0)");
    return HfArch::OPT;
  }
  if (!d.rope) {  // GPT-2: LayerNorm, GELU, biases, multi-head attention
    const char* arch = "GPT2LMHeadModel", *needs = "learned positions need LayerNorm, GELU, biases and NKV = NH";
    if (d.rmsnorm) refuse("RMSNorm with learned positions", arch, needs);
    if (d.swiglu) refuse("SwiGLU MLP with learned positions", arch, needs);
    if (!d.bias) refuse("linear layers without biases (--disable-bias-linear) with learned positions", arch, needs);
    if (d.NKV != d.NH) refuse("grouped-query attention with learned positions", arch, needs);
    if (d.pos_offset != 0) refuse("model.position_offset " + std::to_string(d.pos_offset), arch,
                                  "GPT-2's positions start at row 0");
    return HfArch::GPT2;
  }
  if (!d.rmsnorm && !d.swiglu) {  // GPT-NeoX
    const char* arch = "GPTNeoXForCausalLM", *needs = "RoPE with LayerNorm and GELU needs biases and NKV = NH";
    if (!d.bias) refuse("LayerNorm and GELU with RoPE but no linear-layer biases", arch, needs);
    if (d.NKV != d.NH) refuse("grouped-query attention with LayerNorm and GELU", arch, needs);
    return HfArch::GPTNeoX;
  }
  const char* arch = "LlamaForCausalLM",
              *needs = "RoPE with RMSNorm or SwiGLU needs both, no biases and whole-head rotation; GPT-NeoX "
                       "holds RoPE with LayerNorm, GELU and biases";
  if (!d.rmsnorm) refuse("LayerNorm with RoPE", arch, needs);
  if (!d.swiglu) refuse("GELU MLP with RoPE", arch, needs);
  if (d.bias) refuse("linear-layer biases with RoPE (add --disable-bias-linear)", arch, needs);
  if (d.rot != d.HS)
    refuse(fmt::format("partial RoPE (rotary_percent: {} of {} head dims rotated)", d.rot, d.HS), arch, needs);
  return HfArch::LLaMA;
}

// The prefix of the causal-LM class's backbone (its base model, what
// AutoModel loads: GPT2Model, OPTModel, LlamaModel, ...) in its names.
const char* backbone_prefix(HfArch a) {
  switch (a) {
    case HfArch::GPT2: return "transformer.";
    case HfArch::GPTNeoX: return "gpt_neox.";
    case HfArch::LLaMA:
    case HfArch::Mixtral:
    case HfArch::OPT: break;
  }
  return "model.";
}

std::vector<HfPiece> causal_lm_map(const ModelDims& d, HfArch a) {
  switch (a) {
    case HfArch::GPT2: return gpt2_map(d);
    case HfArch::LLaMA: return llama_map(d);
    case HfArch::Mixtral: return mixtral_map(d);
    case HfArch::OPT: return opt_map(d);
    case HfArch::GPTNeoX: break;
  }
  return neox_map(d);
}

// A value-head model in DeepSpeed-Chat's RewardModel naming: the backbone's
// tensors under "rwtransformer." (the base model's names) and "v_head.weight".
// `backbone`: the prefix the backbone's names get instead ("" for a base
// model's own file, the causal-LM prefix for a causal LM's).
std::vector<HfPiece> value_head_map(const ModelDims& d, HfArch a, const std::string& backbone = "rwtransformer.") {
  const std::string base = backbone_prefix(a);
  std::vector<HfPiece> out;
  for (HfPiece p : causal_lm_map(d, a)) {
    if (p.our_name == "head.weight") continue;  // the causal LM's output layer
    DS_CHECK(p.hf_name.starts_with(base), "value head: '{}' is not under '{}'", p.hf_name, base);
    p.hf_name = backbone + p.hf_name.substr(base.size());
    out.push_back(std::move(p));
  }
  out.push_back({"v_head.weight", "head.weight", 0, 1, false});
  return out;
}

std::vector<HfPiece> hf_map(const ModelDims& d, const char* what) {
  const HfArch a = hf_arch(d, what);
  return d.value_head ? value_head_map(d, a) : causal_lm_map(d, a);
}

// The Hugging Face nn.Linear of each LoRA target: the map's piece of that
// row block, its name without ".weight".
std::vector<std::string> lora_modules(const ModelConfig& cfg, const std::vector<HfPiece>& map) {
  std::vector<std::string> out;
  for (const LoraTarget& t : cfg.lora.targets) {
    const std::string ours = "layers." + std::to_string(t.layer) + "." + t.weight;
    const auto it = std::find_if(map.begin(), map.end(), [&](const HfPiece& p) {
      return p.our_name == ours && p.row0 == t.row0 && (p.rows == t.rows || (p.rows < 0 && t.row0 == 0)) &&
             !p.transpose && p.head_interleave == 0 && p.hf_name.ends_with(".weight");
    });
    DS_USER_CHECK(it != map.end(), "LoRA: rows [{}, {}) of {} are not one Hugging Face linear layer", t.row0,
                  t.row0 + t.rows, ours);
    out.push_back(it->hf_name.substr(0, it->hf_name.size() - 7));
  }
  return out;
}

// The shape of piece p's HF tensor, from the shape of our weight alone.
Shape hf_shape(const HfPiece& p, const Shape& ours) {
  int64_t rows = p.hf_pad_rows;
  for (const auto& [r0, n] : row_runs(p, ours[0])) rows += n;
  if (ours.size() != 2) return {rows};
  return p.transpose ? Shape{ours[1], rows} : Shape{rows, ours[1]};
}

// The weights file of an HF path: the file itself, or DIR/model.safetensors,
// else DIR/pytorch_model.bin.
std::string hf_weights_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  const fs::path st = fs::path(path) / "model.safetensors", pt = fs::path(path) / "pytorch_model.bin";
  if (fs::exists(st, ec) || !fs::exists(pt, ec)) return st.string();
  return pt.string();
}

// Rows [row0, row0+rows) of a (R, K) matrix (or a vector), optionally transposed.
Tensor extract(const Tensor& w, const HfPiece& p) {
  const int64_t K = w.dim() == 2 ? w.size(1) : 1;
  int64_t rows = p.hf_pad_rows;
  for (const auto& [r0, n] : row_runs(p, w.size(0))) rows += n;
  Tensor part = w.dim() == 2 ? Tensor::zeros({rows, K}, DType::F32) : Tensor::zeros({rows}, DType::F32);
  int64_t at = p.hf_pad_rows;
  for (const auto& [r0, n] : row_runs(p, w.size(0))) {
    part.view(at * K, {n * K}).copy_from(w.view(r0 * K, {n * K}));
    at += n;
  }
  if (!p.transpose) return part;
  Tensor t = Tensor::empty({K, rows}, DType::F32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) t.data<float>()[k * rows + r] = part.data<float>()[r * K + k];
  return t;
}

nlohmann::json hf_config(const ModelConfig& c, const ModelDims& d, const HfTokenIds& tokens) {
  const int bos = tokens.bos >= 0 ? tokens.bos : d.V - 1, eos = tokens.eos >= 0 ? tokens.eos : d.V - 1;
  DS_USER_CHECK(bos < d.V && eos < d.V, "HF export: bos id {} / eos id {} outside the vocabulary of {}", bos, eos,
                d.V);
  const HfArch arch = hf_arch(d, "HF export");
  if (arch == HfArch::GPTNeoX) {
    // transformers rotates int(HS * rotary_pct) dims: the smallest double that gives exactly d.rot.
    double pct = static_cast<double>(d.rot) / d.HS;
    while (static_cast<int>(d.HS * pct) < d.rot) pct = std::nextafter(pct, 2.0);
    return {{"architectures", {"GPTNeoXForCausalLM"}}, {"model_type", "gpt_neox"}, {"hidden_size", d.C},
            {"num_attention_heads", d.NH}, {"num_hidden_layers", d.L}, {"intermediate_size", d.F},
            {"hidden_act", "gelu_new"}, {"rotary_pct", pct},
            {"rotary_emb_base", c.rope_theta}, {"max_position_embeddings", d.maxT}, {"layer_norm_eps", c.norm_eps},
            {"use_parallel_residual", false}, {"tie_word_embeddings", !d.untied}, {"vocab_size", d.V},
            {"attention_dropout", 0.0}, {"hidden_dropout", 0.0}, {"bos_token_id", bos}, {"eos_token_id", eos},
            {"torch_dtype", "float32"}};
  }
  if (arch == HfArch::OPT) {
    return {{"architectures", {"OPTForCausalLM"}}, {"model_type", "opt"}, {"hidden_size", d.C},
            {"word_embed_proj_dim", d.P}, {"num_attention_heads", d.NH}, {"num_hidden_layers", d.L},
            {"ffn_dim", d.F}, {"max_position_embeddings", d.maxT}, {"vocab_size", d.V},
            {"activation_function", "relu"}, {"do_layer_norm_before", !d.post_norm}, {"enable_bias", true},
            {"layer_norm_elementwise_affine", true}, {"tie_word_embeddings", !d.untied}, {"dropout", 0.0},
            {"attention_dropout", 0.0}, {"activation_dropout", 0.0}, {"layerdrop", 0.0},
            {"bos_token_id", bos}, {"eos_token_id", eos}, {"torch_dtype", "float32"}};
  }
  if (arch == HfArch::GPT2) {
    return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_embd", d.C}, {"n_head", d.NH},
            {"n_layer", d.L}, {"n_positions", d.maxT}, {"n_ctx", d.maxT}, {"n_inner", d.F}, {"vocab_size", d.V},
            {"layer_norm_epsilon", c.norm_eps}, {"activation_function", "gelu_new"},
            {"tie_word_embeddings", !d.untied}, {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0},
            {"bos_token_id", bos}, {"eos_token_id", eos}, {"torch_dtype", "float32"}};
  }
  if (arch == HfArch::Mixtral) {
    return {{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"}, {"hidden_size", d.C},
            {"intermediate_size", d.F}, {"num_attention_heads", d.NH}, {"num_key_value_heads", d.NKV},
            {"num_hidden_layers", d.L}, {"max_position_embeddings", d.maxT}, {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta}, {"vocab_size", d.V}, {"hidden_act", "silu"},
            {"tie_word_embeddings", !d.untied}, {"num_local_experts", d.layer_experts(0)},
            {"num_experts_per_tok", d.topk}, {"router_aux_loss_coef", c.moe.loss_coeff},
            {"output_router_logits", false}, {"sliding_window", nullptr}, {"attention_dropout", 0.0},
            {"bos_token_id", bos}, {"eos_token_id", eos}, {"torch_dtype", "float32"}};
  }
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", d.C},
          {"intermediate_size", d.F}, {"num_attention_heads", d.NH}, {"num_key_value_heads", d.NKV},
          {"num_hidden_layers", d.L}, {"max_position_embeddings", d.maxT}, {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta}, {"vocab_size", d.V}, {"hidden_act", "silu"},
          {"tie_word_embeddings", !d.untied}, {"attention_bias", false}, {"mlp_bias", false},
          {"head_dim", d.HS}, {"bos_token_id", bos}, {"eos_token_id", eos}, {"torch_dtype", "float32"}};
}

}  // namespace

ModelConfig model_config_from_hf(const nlohmann::json& j, const std::string& file, int tp, const char* what) {
  DS_USER_CHECK(j.is_object(), "{}: '{}' is not a JSON object", what, file);
  auto num = [&](const char* key, double dflt, bool required) -> double {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      DS_USER_CHECK(!required, "{}: '{}' has no '{}'", what, file, key);
      return dflt;
    }
    DS_USER_CHECK(it->is_number(), "{}: '{}' field '{}' must be a number", what, file, key);
    return it->get<double>();
  };
  auto integer = [&](const char* key, int dflt, bool required) {
    const double v = num(key, dflt, required);
    DS_USER_CHECK(v >= 1 && v <= (1 << 30) && v == static_cast<int>(v), "{}: '{}' field '{}' must be a "
                  "positive integer, got {}", what, file, key, v);
    return static_cast<int>(v);
  };
  auto flag = [&](const char* key, bool dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    DS_USER_CHECK(it->is_boolean(), "{}: '{}' field '{}' must be true or false", what, file, key);
    return it->get<bool>();
  };
  auto text = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string type = text("model_type");
  ModelConfig m;
  if (type == "gpt2") {
    m.num_layers = integer("n_layer", 0, true);
    m.hidden_size = integer("n_embd", 0, true);
    m.num_heads = integer("n_head", 0, true);
    m.max_position_embeddings = integer("n_positions", 1024, false);
    // 4 * n_embd, held to the int range: check_model_limits refuses such a model below.
    m.ffn_hidden_size = integer("n_inner", static_cast<int>(std::min<int64_t>(4 * int64_t{m.hidden_size}, 1 << 30)),
                                false);
    m.norm_eps = static_cast<float>(num("layer_norm_epsilon", 1e-5, false));
    const std::string act = text("activation_function");
    DS_USER_CHECK(act.empty() || act == "gelu_new" || act == "gelu_pytorch_tanh", "{}: '{}' activation_function "
                  "'{}' is not supported (the GELU here is the tanh approximation: gelu_new)", what, file, act);
    m.untie_embeddings = !flag("tie_word_embeddings", true);
  } else if (type == "llama" || type == "mixtral") {
    set_model_family(m, ModelFamily::LLaMA);
    m.num_layers = integer("num_hidden_layers", 0, true);
    m.hidden_size = integer("hidden_size", 0, true);
    m.num_heads = integer("num_attention_heads", 0, true);
    m.num_kv_heads = integer("num_key_value_heads", m.num_heads, false);
    m.ffn_hidden_size = integer("intermediate_size", 0, true);
    m.max_position_embeddings = integer("max_position_embeddings", 2048, false);
    m.norm_eps = static_cast<float>(num("rms_norm_eps", 1e-6, false));
    m.rope_theta = static_cast<float>(num("rope_theta", 10000, false));
    m.untie_embeddings = !flag("tie_word_embeddings", false);
    DS_USER_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), "{}: '{}' uses rope_scaling, "
                  "which is not implemented", what, file);
    DS_USER_CHECK(!flag("attention_bias", false) && !flag("mlp_bias", false), "{}: '{}': attention_bias / "
                  "mlp_bias are not supported for LLaMA models", what, file);
    DS_USER_CHECK(int64_t{integer("head_dim", m.hidden_size / m.num_heads, false)} * m.num_heads == m.hidden_size,
                  "{}: '{}': head_dim * num_attention_heads must equal hidden_size", what, file);
    if (type == "mixtral") {  // every layer MoE, top-k renormalised, no capacity limit (docs/moe.md)
      const int E = integer("num_local_experts", 8, false), k = integer("num_experts_per_tok", 2, false);
      DS_USER_CHECK(E >= 2 && E <= kMaxExperts && k >= 2 && k <= E, "{}: '{}': num_local_experts {} and "
                    "num_experts_per_tok {} must satisfy 2 <= num_experts_per_tok <= num_local_experts <= {}", what,
                    file, E, k, kMaxExperts);
      DS_USER_CHECK(!j.contains("sliding_window") || j["sliding_window"].is_null() ||
                        (j["sliding_window"].is_number() &&
                         j["sliding_window"].get<double>() >= num("max_position_embeddings", 2048, false)),
                    "{}: '{}' uses a sliding attention window, which is not implemented", what, file);
      m.moe.num_experts = {E};
      m.moe.expert_interval = 1;
      m.moe.topk = k;
      m.moe.drop_tokens = false;
      m.moe.top2_2nd_expert_sampling = false;
      m.moe.loss_coeff = static_cast<float>(num("router_aux_loss_coef", 0.001, false));
    }
  } else if (type == "opt") {
    m.num_layers = integer("num_hidden_layers", 0, true);
    m.hidden_size = integer("hidden_size", 0, true);
    m.num_heads = integer("num_attention_heads", 0, true);
    m.ffn_hidden_size = integer("ffn_dim", 0, true);
    m.max_position_embeddings = integer("max_position_embeddings", 2048, false);
    m.position_offset = 2;  // embed_positions has 2 more rows; row 1 is padding's mask-derived position
    m.activation = Activation::ReLU;
    m.untie_embeddings = !flag("tie_word_embeddings", true);
    const std::string act = text("activation_function");
    DS_USER_CHECK(act.empty() || act == "relu", "{}: '{}': OPT with activation_function '{}' is not supported "
                  "(relu is)", what, file, act);
    // OPT-350m: post-norm blocks without a final norm, and its token
    // embedding word_embed_proj_dim wide between project_in and project_out.
    m.post_norm = !flag("do_layer_norm_before", true);
    const int proj = integer("word_embed_proj_dim", m.hidden_size, false);
    m.embed_proj_dim = proj == m.hidden_size ? 0 : proj;
    DS_USER_CHECK(flag("enable_bias", true) && flag("layer_norm_elementwise_affine", true) &&
                      (m.post_norm || !flag("_remove_final_layer_norm", false)),
                  "{}: '{}': OPT without biases, without LayerNorm weights or without the final LayerNorm is not "
                  "supported", what, file);
  } else if (type == "gpt_neox") {
    m.position = PositionKind::Rope;
    m.num_layers = integer("num_hidden_layers", 0, true);
    m.hidden_size = integer("hidden_size", 0, true);
    m.num_heads = integer("num_attention_heads", 0, true);
    m.ffn_hidden_size = integer("intermediate_size", 0, true);
    m.max_position_embeddings = integer("max_position_embeddings", 2048, false);
    m.norm_eps = static_cast<float>(num("layer_norm_eps", 1e-5, false));
    m.rope_theta = static_cast<float>(num("rotary_emb_base", 10000, false));
    m.rotary_percent = static_cast<float>(num("rotary_pct", 1.0, false));
    m.untie_embeddings = !flag("tie_word_embeddings", false);
    DS_USER_CHECK(!flag("use_parallel_residual", true), "{}: '{}': use_parallel_residual true is not "
                  "supported (GPT-NeoX blocks here are sequential)", what, file);
  } else {
    DS_USER_ERROR("{}: '{}' has model_type '{}'; gpt2, llama, mixtral, gpt_neox and opt are read", what, file,
                  type);
  }
  m.seq_length = m.max_position_embeddings;
  m.vocab_size = integer("vocab_size", 0, true);
  m.make_vocab_size_divisible_by = 1;
  m.padded_vocab_size = padded_vocab(m.vocab_size, 1, tp);
  m.hidden_dropout = m.attention_dropout = 0.f;
  const bool gpt2 = type == "gpt2";
  check_model_limits(m, fmt::format("{} '{}'", what, file),
                     {.layers = gpt2 ? "n_layer" : "num_hidden_layers", .hidden = gpt2 ? "n_embd" : "hidden_size",
                      .ffn = gpt2 ? "n_inner" : "intermediate_size"});
  return m;
}

void check_hf_exportable(const ModelConfig& cfg, const char* what) { hf_arch(model_dims(cfg), what); }

void check_export_dir(const std::string& outdir, const char* what) {
  check_output_dir(outdir, what);
  const fs::path out = output_dir_path(outdir);
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    DS_USER_CHECK(name == "config.json" || name == "model.safetensors" || name == "pytorch_model.bin" ||
                      is_step_tokenizer_name(name),
                  "{} '{}' already holds '{}', so it is not a previous export to replace; give a new or empty "
                  "directory", what, outdir, name);
  }
  DS_USER_CHECK(!ec, "{} '{}' cannot be listed: {}", what, outdir, ec.message());
}

void export_hf(const ModelConfig& cfg, const ModelLayout& layout, const Tensor& params, const std::string& outdir,
               const HfTokenIds& tokens, const StepTokenizer* tokenizer) {
  Tensor host;
  auto weight = [&](const std::string& name) {
    if (!host.defined()) host = params.device().is_cpu() ? params : params.to(Device::cpu());
    const ParamSpec& s = layout.find(name);
    return host.view(s.offset, s.shape);
  };
  export_hf_streamed(cfg, layout, weight, outdir, tokens, tokenizer);
}

namespace {

// The export's model.safetensors declared (names and shapes, no data) and the
// piece of our weight each HF tensor is cut from.
// A value-head model is written as DeepSpeed-Chat's steps write theirs:
// pytorch_model.bin (torch.save's format, torch_save.h).
struct HfExportPlan {
  SafetensorsWriter writer;
  TorchSaveWriter torch;  // value-head models
  bool torch_format = false;
  std::map<std::string, HfPiece> pieces;
  std::vector<std::string> order() const { return torch_format ? torch.streamed_order() : writer.streamed_order(); }
  const char* file() const { return torch_format ? "pytorch_model.bin" : "model.safetensors"; }
};

HfExportPlan hf_export_plan(const ModelDims& d, const ModelLayout& layout) {
  HfExportPlan plan;
  plan.torch_format = d.value_head;
  for (const HfPiece& p : hf_map(d, "HF export")) {
    const Shape m = matrix_shape(layout.find(p.our_name).shape);
    int64_t rows = p.hf_pad_rows;
    for (const auto& [r0, n] : row_runs(p, m[0])) rows += n;
    const int64_t K = m.size() == 2 ? m[1] : 1;
    const Shape shape = m.size() != 2 ? Shape{rows} : p.transpose ? Shape{K, rows} : Shape{rows, K};
    if (plan.torch_format)
      plan.torch.declare_f32(p.hf_name, shape);
    else
      plan.writer.declare_f32(p.hf_name, shape);
    plan.pieces.emplace(p.hf_name, p);
  }
  plan.writer.set_metadata("format", "pt");
  return plan;
}

// Our weights in the order the streamed export asks for them: each HF tensor
// in file order, one of ours fetched when it is not the one held.
}  // namespace

std::vector<std::pair<size_t, const LoraTarget*>> lora_targets_of(const ModelConfig& cfg, const std::string& name) {
  std::vector<std::pair<size_t, const LoraTarget*>> out;
  if (!cfg.lora.enabled()) return out;
  for (size_t k = 0; k < cfg.lora.targets.size(); ++k) {
    const LoraTarget& t = cfg.lora.targets[k];
    if (name == "layers." + std::to_string(t.layer) + "." + t.weight) out.emplace_back(k, &t);
  }
  return out;
}

std::string lora_name(const LoraTarget& t, size_t k, const char* part) {
  return "layers." + std::to_string(t.layer) + ".lora." + std::to_string(k) + "." + part;
}

namespace {

std::vector<std::string> hf_requests(const HfExportPlan& plan, const ModelConfig& cfg) {
  std::vector<std::string> out;
  std::string last;
  for (const std::string& hf_name : plan.order()) {
    const std::string& ours = plan.pieces.at(hf_name).our_name;
    if (ours == last) continue;
    last = ours;
    out.push_back(ours);
    for (const auto& [k, t] : lora_targets_of(cfg, ours)) {  // what fused_weight asks for next
      out.push_back(lora_name(*t, k, "left"));
      out.push_back(lora_name(*t, k, "right"));
    }
  }
  return out;
}

}  // namespace

std::vector<LoraTarget> lora_targets_for(const ModelConfig& cfg, const std::string& module_substring,
                                         const std::string& flag) {
  const ModelDims d = model_dims(cfg);
  const std::vector<HfPiece> map = hf_map(d, "LoRA");
  const ModelLayout layout = build_layout(cfg);
  std::vector<LoraTarget> out;
  // The causal LM's output layer is an nn.Linear (tied or not), and so is a value head.
  for (const char* head : {"lm_head", "v_head"}) {
    const bool present = std::string(head) == (d.value_head ? "v_head" : "lm_head");
    DS_USER_CHECK(!present || std::string(head).find(module_substring) == std::string::npos,
                  "{} '{}' selects {}, which dschat does not adapt (its weight is {}); name the "
                  "transformer blocks' linears", flag, module_substring, head,
                  d.value_head ? "the value head" : "the embedding's, when tied");
  }
  for (const HfPiece& p : map) {
    if (!p.hf_name.ends_with(".weight") || p.transpose || p.head_interleave != 0) continue;  // not an nn.Linear
    const std::string module = p.hf_name.substr(0, p.hf_name.size() - 7);
    if (module.find(module_substring) == std::string::npos || !p.our_name.starts_with("layers.")) continue;
    const size_t dot = p.our_name.find('.', 7);
    const std::string weight = p.our_name.substr(dot + 1);
    const ParamSpec& spec = layout.find(p.our_name);
    if (spec.full_shape.size() != 2 || weight.find("norm") != std::string::npos) continue;
    DS_USER_CHECK(weight == "attn.qkv.weight" || weight == "attn.proj.weight" || weight == "mlp.fc.weight" ||
                      weight == "mlp.proj.weight",
                  "{} '{}' selects {}, which dschat does not adapt (attention and MLP projections "
                  "of dense layers only)", flag, module_substring, module);
    out.push_back({std::stoi(p.our_name.substr(7, dot - 7)), weight, p.row0,
                   p.rows < 0 ? spec.full_shape[0] - p.row0 : p.rows});
  }
  return out;
}

std::vector<std::string> hf_export_requests(const ModelConfig& cfg, const ModelLayout& layout) {
  return hf_requests(hf_export_plan(model_dims(cfg), layout), cfg);
}

void export_hf_streamed(const ModelConfig& cfg, const ModelLayout& layout, const HfWeightSource& weight,
                        const std::string& outdir, const HfTokenIds& tokens, const StepTokenizer* tokenizer) {
  ModelDims d = model_dims(cfg);
  const nlohmann::json config = hf_config(cfg, d, tokens);  // refuses a model no architecture holds, first
  check_export_dir(outdir, "--export-hf");
  const fs::path out = output_dir_path(outdir);  // "out/" is "out"; the temporary is its sibling
  fs::path tmp = out;
  tmp += ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  remove_stale_temporaries(out.parent_path(), out.filename());  // what killed exports left beside it
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw_write_error(tmp.string(), ec.value());
  try {  // a failed write (a full disk) leaves no temporary directory behind
    // Each HF tensor is cut from our weight as the file asks for it: one of
    // our weights (the last one asked for, hf_requests) and one HF tensor in
    // memory at a time.
    const HfExportPlan plan = hf_export_plan(d, layout);
    std::string held_name;
    Tensor held;
    auto next = [&](const std::string& hf_name) {
      const HfPiece& p = plan.pieces.at(hf_name);
      if (held_name != p.our_name) {
        held = Tensor();
        held = weight(p.our_name);
        held_name = p.our_name;
      }
      return extract(held.reshape(matrix_shape(held.shape())), p);
    };
    if (plan.torch_format)
      plan.torch.write_streamed((tmp / plan.file()).string(), next);
    else
      plan.writer.write_streamed((tmp / plan.file()).string(), next);
    write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
    if (tokenizer) write_step_tokenizer(*tokenizer, tmp);  // transformers' names, beside the model
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (fs::exists(out, ec)) fs::remove_all(out, ec);  // a previous export (check_export_dir)
  if (!ec) fs::rename(tmp, out, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw_write_error(out.string(), ec.value());
  }
}

HfWeightsFile HfWeightsFile::open(const std::string& path) {
  HfWeightsFile f;
  f.path_ = hf_weights_file(path);
  char magic[4] = {0, 0, 0, 0};
  std::ifstream in(f.path_, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0)  // a zip: torch.save's format
    f.pt_ = std::make_shared<TorchFile>(TorchFile::open(f.path_));
  else
    f.st_ = std::make_shared<SafetensorsFile>(SafetensorsFile::open(f.path_));
  return f;
}

bool HfWeightsFile::has(const std::string& name) const { return st_ ? st_->has(name) : pt_->has(name); }

Shape HfWeightsFile::shape(const std::string& name) const {
  if (st_) return st_->shape(name);
  DS_USER_CHECK(pt_->has(name), "PyTorch file '{}' has no tensor '{}'", path_, name);
  return pt_->tensors().at(name).shape;
}

std::string HfWeightsFile::dtype_string(const std::string& name) const {
  if (st_) return st_->dtype_string(name);
  DS_USER_CHECK(pt_->has(name), "PyTorch file '{}' has no tensor '{}'", path_, name);
  static const std::map<std::string, std::string> kNames = {
      {"Float", "F32"}, {"BFloat16", "BF16"}, {"Half", "F16"}, {"Double", "F64"}, {"Long", "I64"},
      {"Int", "I32"},   {"Short", "I16"},     {"Char", "I8"},  {"Byte", "U8"},    {"Bool", "BOOL"}};
  const std::string& t = pt_->tensors().at(name).dtype_name;
  const auto it = kNames.find(t);
  return it == kNames.end() ? t : it->second;
}

Tensor HfWeightsFile::get(const std::string& name) const { return st_ ? st_->get(name) : pt_->get(name); }

namespace {

// The pieces of the model's map; with file_vocab > 0, the vocabulary pieces
// (the embedding, an untied output layer) cover the file's rows only.
// A value-head model reads its backbone from a reward / critic model's file
// (DeepSpeed-Chat's RewardModel names), a causal LM's or a base model's,
// whichever spelling of the embedding the file holds; v_head.weight where the
// file has it (fresh_head false), else nothing (fresh_head true: the caller
// initialises it).
std::vector<HfPiece> import_map(const ModelDims& d, const HfWeightsFile& sf, bool* fresh_head) {
  const char* what = "--init-from (Hugging Face weights)";
  *fresh_head = false;
  if (!d.value_head) return hf_map(d, what);
  const HfArch a = hf_arch(d, what);
  std::vector<HfPiece> pieces = value_head_map(d, a);
  for (const std::string& prefix : {std::string("rwtransformer."), std::string(backbone_prefix(a)), std::string()}) {
    pieces = value_head_map(d, a, prefix);
    if (sf.has(pieces.front().hf_name)) break;
  }
  if (!sf.has("v_head.weight")) {
    pieces.pop_back();
    *fresh_head = true;
  }
  return pieces;
}

// LoRA tensors a file may hold beside its linears (MODULE.lora_left_weight
// (dim, out) and MODULE.lora_right_weight (in, dim), DeepSpeed-Chat's names
// before it fuses them): read where present, else initialised.
void add_lora_pieces(const ModelConfig& cfg, const HfWeightsFile& sf, std::vector<HfPiece>& pieces) {
  if (!cfg.lora.enabled()) return;
  const std::vector<std::string> modules = lora_modules(cfg, pieces);
  for (size_t k = 0; k < modules.size(); ++k) {
    const std::string left = modules[k] + ".lora_left_weight", right = modules[k] + ".lora_right_weight";
    if (!sf.has(left) || !sf.has(right)) continue;
    const std::string ours = "layers." + std::to_string(cfg.lora.targets[k].layer) + ".lora." + std::to_string(k);
    pieces.push_back({left, ours + ".left"});
    pieces.push_back({right, ours + ".right", 0, -1, true});
  }
}

std::vector<HfPiece> import_pieces(const ModelConfig& cfg, const HfWeightsFile& sf, int64_t file_vocab,
                                   bool* fresh_head) {
  const ModelDims d = model_dims(cfg);
  std::vector<HfPiece> pieces = import_map(d, sf, fresh_head);
  add_lora_pieces(cfg, sf, pieces);
  DS_CHECK(file_vocab <= d.V, "import: file vocabulary {} > the model's {}", file_vocab, d.V);
  if (file_vocab > 0)
    for (HfPiece& p : pieces)
      if ((p.our_name == "embed.wte" || p.our_name == "head.weight") && p.row0 == 0 && p.rows == d.V)
        p.rows = file_vocab;
  return pieces;
}

void check_hf_tensors(const ModelConfig& cfg, const ModelLayout& layout, const HfWeightsFile& sf,
                      const std::string& config_from, int64_t file_vocab) {
  const std::string& file = sf.path();
  bool fresh_head = false;
  for (const HfPiece& p : import_pieces(cfg, sf, file_vocab, &fresh_head)) {
    const Shape want = hf_shape(p, matrix_shape(layout.find(p.our_name).shape));
    DS_USER_CHECK(sf.has(p.hf_name), "--init-from '{}': tensor '{}' is missing, but {} needs it as {}; the weights "
                  "are not of this model", file, p.hf_name, config_from, shape_str(want));
    DS_USER_CHECK(sf.shape(p.hf_name) == want, "--init-from '{}': tensor '{}' is {}, but {} makes it {}; the "
                  "weights are not of this model", file, p.hf_name, shape_str(sf.shape(p.hf_name)), config_from,
                  shape_str(want));
    const std::string dt = sf.dtype_string(p.hf_name);
    DS_USER_CHECK(dt == "F32" || dt == "BF16" || dt == "F16", "--init-from '{}': tensor '{}' has dtype {}, "
                  "expected F32, BF16 or F16", file, p.hf_name, dt);
  }
}

}  // namespace

void check_hf_weights(const ModelConfig& cfg, const ModelLayout& layout, const std::string& path,
                      const std::string& config_from, int64_t file_vocab) {
  check_hf_tensors(cfg, layout, HfWeightsFile::open(path), config_from, file_vocab);
}

HfShardReader::HfShardReader(const ModelConfig& cfg, const ModelLayout& full, const std::string& path,
                             int64_t file_vocab, ParamInit init)
    : sf_(HfWeightsFile::open(path)), pieces_(import_pieces(cfg, sf_, file_vocab, &fresh_head_)),
      init_(std::move(init)), file_vocab_(file_vocab), vocab_(model_dims(cfg).V) {
  // every name, shape and dtype, before any allocation
  check_hf_tensors(cfg, full, sf_, "the model config", file_vocab);
}

void HfShardReader::read(const ModelLayout& local, int64_t begin, int64_t end, float* out) const {
  DS_CHECK(begin >= 0 && begin <= end && end <= local.total, "HfShardReader: [{}, {}) outside {} elements", begin,
           end, local.total);
  std::fill(out, out + (end - begin), 0.0f);  // padded vocabulary rows stay zero
  for (const ParamSpec& p : local.params) {
    if (p.offset + p.numel <= begin || p.offset >= end) continue;
    const bool mapped = std::any_of(pieces_.begin(), pieces_.end(), [&](const HfPiece& q) { return q.our_name == p.name; });
    if (!mapped) {  // what the file does not hold (a fresh value head, LoRA tensors): initialised
      DS_CHECK(init_, "import: '{}' is not in the file and no initialiser was given", p.name);
      const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
      init_(local, lo, hi, out + (lo - begin));
      continue;
    }
    // The elements of our full weight this range holds: runs of the full
    // weight (row-major over its matrix shape), sorted, each with its place in out.
    struct Need {
      int64_t lo, hi, dst;
    };
    std::vector<Need> need;
    for_each_shard_run(p, local.shard, [&](int64_t fo, int64_t lo, int64_t n) {
      const int64_t a = std::max(begin, p.offset + lo), b = std::min(end, p.offset + lo + n);
      if (a < b) need.push_back({fo + (a - p.offset - lo), fo + (b - p.offset - lo), a - begin});
    });
    std::sort(need.begin(), need.end(), [](const Need& x, const Need& y) { return x.lo < y.lo; });
    const Shape m = matrix_shape(p.full_shape);
    const int64_t R = m[0], K = m.size() == 2 ? m[1] : 1;
    for (const HfPiece& piece : pieces_) {
      if (piece.our_name != p.name) continue;
      const auto runs = row_runs(piece, R);
      auto overlaps = [&](int64_t lo, int64_t hi) {  // any needed element in our full elements [lo, hi)
        auto k = std::upper_bound(need.begin(), need.end(), lo, [](int64_t x, const Need& y) { return x < y.lo; });
        if (k != need.begin() && std::prev(k)->hi > lo) return true;
        return k != need.end() && k->lo < hi;
      };
      // A resized vocabulary piece: rows [file_vocab_, vocab_) are the mean of the file's.
      const bool resized = file_vocab_ > 0 && piece.row0 == 0 && piece.rows == file_vocab_ && !piece.transpose &&
                           (p.name == "embed.wte" || p.name == "head.weight") &&
                           overlaps(file_vocab_ * K, vocab_ * K);
      bool used = resized;
      for (const auto& [r0, n] : runs) used = used || overlaps(r0 * K, (r0 + n) * K);
      if (!used) continue;  // none of this HF tensor's rows lives in the range: not read
      // One HF tensor at a time, in f32.
      Tensor src = sf_.get(piece.hf_name);
      if (src.dtype() != DType::F32) {
        Tensor f = Tensor::empty(src.shape(), DType::F32);
        for (int64_t i = 0; i < src.numel(); ++i) {
          const uint16_t h = src.data<uint16_t>()[i];
          f.data<float>()[i] = src.dtype() == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        src = f;
      }
      const float* sv = src.data<float>();
      const int64_t rows = src.numel() / K;
      // Our row r's needed elements, column c's value from value(c).
      auto fill_row = [&](int64_t r, const auto& value) {
        const int64_t lo = r * K, hi = lo + K;
        auto k = std::upper_bound(need.begin(), need.end(), lo, [](int64_t x, const Need& y) { return x < y.lo; });
        if (k != need.begin()) --k;
        for (; k != need.end() && k->lo < hi; ++k) {
          const int64_t a = std::max(lo, k->lo), b = std::min(hi, k->hi);
          for (int64_t j = a; j < b; ++j) out[k->dst + (j - k->lo)] = value(j - lo);
        }
      };
      int64_t at = piece.hf_pad_rows;  // the HF tensor's row (or column, transposed) of our row r
      for (const auto& [r0, n] : runs) {
        for (int64_t r = r0; r < r0 + n; ++r, ++at)
          fill_row(r, [&](int64_t c) { return piece.transpose ? sv[c * rows + at] : sv[at * K + c]; });
      }
      if (resized) {
        std::vector<double> sum(static_cast<size_t>(K), 0.0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < K; ++c) sum[static_cast<size_t>(c)] += sv[r * K + c];
        std::vector<float> mean(static_cast<size_t>(K));
        for (int64_t c = 0; c < K; ++c)
          mean[static_cast<size_t>(c)] = static_cast<float>(sum[static_cast<size_t>(c)] / static_cast<double>(rows));
        for (int64_t r = file_vocab_; r < vocab_; ++r)
          fill_row(r, [&](int64_t c) { return mean[static_cast<size_t>(c)]; });
      }
    }
  }
}

void import_hf(const ModelConfig& cfg, const ModelLayout& layout, Tensor& params, const std::string& path) {
  const HfShardReader reader(cfg, layout, path);
  Tensor host = Tensor::empty({layout.total}, DType::F32);
  reader.read(layout, 0, layout.total, host.data<float>());
  params.copy_from(host);
}

}  // namespace ds
