// What a GPT model is: the architecture settings the model, its layout, the
// checkpoint and Hugging Face code read. Plain values only; lib/train parses
// them from JSON and flags and derives the resolved fields (ffn size, padded
// vocabulary) before anything below it sees them.
#pragma once
#include <string>
#include <vector>

#include "lib/core/padded_vocab.h"  // padded_vocab(), used with padded_vocab_size

namespace ds {

enum class ModelFamily { GPT2, LLaMA };
enum class NormKind { LayerNorm, RMSNorm };
enum class Activation { GELU, SwiGLU, ReLU };  // ReLU: OPT
enum class PositionKind { Learned, Rope };

// DeepSpeed-MoE noisy gate policies (deepspeed/moe/sharded_moe.py).
enum class NoisyGatePolicy { None, Jitter, RSample };

// Mixture of Experts, as Megatron-DeepSpeed builds DeepSpeed-MoE layers
// (docs/moe.md). Layer l (0-based) is an MoE layer when (l + 1) %
// expert_interval == 0 and its expert count (num_experts: one value for
// every MoE layer, or one per MoE layer) is > 1; other layers are dense.
struct MoeConfig {
  std::vector<int> num_experts{1};  // --num-experts
  int expert_interval = 2;          // --expert-interval (Megatron-DeepSpeed's default)
  int topk = 1;                     // --topk
  bool residual = false;            // --mlp-type residual (PR-MoE)
  int expert_parallel_size = 1;     // --moe-expert-parallel-size
  float train_capacity_factor = 1.f, eval_capacity_factor = 1.f;  // --moe-{train,eval}-capacity-factor
  int min_capacity = 4;             // --moe-min-capacity
  float loss_coeff = 0.1f;          // --moe-loss-coeff
  bool drop_tokens = true;          // --disable-moe-token-dropping: false
  bool top2_2nd_expert_sampling = true;  // --disable-moe-top2-2nd-expert-sampling: false
  bool use_rts = true;              // DeepSpeed MoE(use_rts=True): random token selection (top-1)
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::None;
  bool expert_tensor_parallelism = false;  // --enable-expert-tensor-parallelism

  // Experts of layer l of a num_layers-layer model (1: a dense layer).
  int experts(int layer, int num_layers) const;
  bool enabled(int num_layers) const;  // any MoE layer
};

// LoRA (DeepSpeed-Chat's LinearLayer_LoRA; set by dschat's --lora_dim, not
// a config key). Each target is a row block [row0, row0 + rows) of a layer's
// weight, one Hugging Face nn.Linear (OPT's q_proj: rows [0, C) of
// attn.qkv.weight), and gets layers.L.lora.K.left (dim, rows), zeros, and
// layers.L.lora.K.right (dim, in), U(-1/sqrt(dim), 1/sqrt(dim)) (HF's
// lora_right_weight, transposed). The block computes with W + scaling / dim *
// left^T right, and W itself is frozen: the targets of a weight must cover
// all its rows.
struct LoraTarget {
  int layer = 0;
  std::string weight;  // within the layer: "attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"
  int64_t row0 = 0, rows = 0;
};
struct LoraConfig {
  int dim = 0;             // 0: none
  float scaling = 1.f;     // DeepSpeed-Chat's lora_scaling (the delta is scaled by scaling / dim)
  float lr_scale = 1.f;    // the LoRA tensors' learning rate / the base one (--lora_learning_rate)
  bool only_lora = false;  // --only_optimize_lora: every other tensor frozen too, but a value head
  std::vector<LoraTarget> targets;
  bool enabled() const { return dim > 0 && !targets.empty(); }
};

struct ModelConfig {
  ModelFamily family = ModelFamily::GPT2;
  int num_layers = 12, hidden_size = 768, num_heads = 12;
  int ffn_hidden_size = 0;  // resolved: 4*C for GELU, int(4*C*2/3/64)*64 for SwiGLU
  int num_kv_heads = 0;  // grouped-query attention: kv heads dividing num_heads; 0: num_heads
  int seq_length = 1024, max_position_embeddings = 1024;  // max_pos defaults to seq_length
  int vocab_size = 0;  // real vocab (from vocab file / tokenizer); resolved later if 0
  int make_vocab_size_divisible_by = 128;
  int padded_vocab_size = 0;  // padded_vocab(vocab_size, ...) when vocab_size > 0
  bool untie_embeddings = false;
  // The blocks' norm weights take weight decay (DecayRule::MegatronBlockNorms:
  // DeepSpeed-Chat's rule on GPT-2); off: Megatron's rule.
  bool decay_block_norms = false;
  NormKind norm = NormKind::LayerNorm;
  Activation activation = Activation::GELU;
  PositionKind position = PositionKind::Learned;
  bool bias = true;
  float rope_theta = 10000.f, norm_eps = 1e-5f, init_method_std = 0.02f;
  float rotary_percent = 1.f;  // rope: fraction of each head's dims rotated (GPT-NeoX rotary_pct)
  // Dropout probabilities in training (Megatron-DeepSpeed's defaults): hidden on
  // the embedding and on each attention / MLP output before its residual add,
  // attention on the softmax probabilities. Evaluation never drops.
  float hidden_dropout = 0.1f, attention_dropout = 0.1f;
  // The embedding output's dropout; < 0: hidden_dropout (Megatron's). OPT
  // has none there (0) while its residual branches use `dropout`.
  float embedding_dropout = -1.f;
  // The last stage's output: the vocabulary's logits (false), or one value
  // per position from a bias-free (1, hidden_size) head on the final norm's
  // output and no language-model head (DeepSpeed-Chat's reward and critic
  // models: its v_head on the backbone). Its loss is the caller's
  // (GptModel::HeadLoss); one tensor-parallel rank only.
  bool value_head = false;
  // Learned positions: position t reads row t + position_offset of a table
  // of max_position_embeddings + position_offset rows (OPT: 2, the rows
  // before belong to padding: with right-padding lengths a padding token
  // reads row position_offset - 1, as OPT's mask-derived position -1 does).
  int position_offset = 0;
  // OPT's do_layer_norm_before false (OPT-350m): post-LayerNorm blocks,
  // x1 = norm1(x + attn(x)), y = norm2(x1 + mlp(x1)), and no final norm.
  bool post_norm = false;
  // OPT's word_embed_proj_dim (OPT-350m: 512 beside hidden 1024): the token
  // embedding (and so a tied output layer and a value head) is this wide, a
  // bias-free project_in (hidden, dim) widens it before the positions are
  // added and a bias-free project_out (dim, hidden) narrows the last layer's
  // output. 0 or hidden_size: none.
  int embed_proj_dim = 0;
  MoeConfig moe;
  LoraConfig lora;
};

// Sets the family and its standard blocks. GPT-2: LayerNorm, GELU, learned
// positions, biases, tied embeddings. LLaMA: RMSNorm, SwiGLU, RoPE, no
// biases, untied embeddings.
inline void set_model_family(ModelConfig& m, ModelFamily f) {
  const bool llama = f == ModelFamily::LLaMA;
  m.family = f;
  m.norm = llama ? NormKind::RMSNorm : NormKind::LayerNorm;
  m.activation = llama ? Activation::SwiGLU : Activation::GELU;
  m.position = llama ? PositionKind::Rope : PositionKind::Learned;
  m.bias = !llama;
  m.untie_embeddings = llama;
}

// Activation recomputation (Megatron's --recompute-granularity): none, the
// whole layer ("full") or the attention core only ("selective").
enum class RecomputeKind { None, Full, Selective };

const char* family_name(ModelFamily f);  // "gpt2" | "llama"

// The sizes dstrain and dsgen build a model up to, checked before any layout
// or tensor is sized: at most kMaxModelLayers layers, and at most
// kMaxModelParams parameters by a lower bound computed in double (so that no
// size overflows): the q and output projections and the MLP of every layer,
// the embedding and, with learned positions, the position table.
inline constexpr int kMaxModelLayers = 1 << 16;
inline constexpr double kMaxModelParams = 1e13;
inline constexpr int kMaxExperts = 1 << 16;  // experts per MoE layer

// How the input spells the size fields, for check_model_limits' errors
// (dstrain: config keys and flags; a config.json: its own keys).
struct ModelSizeNames {
  std::string layers = "model.num_layers (--num-layers)";
  std::string hidden = "model.hidden_size (--hidden-size)";
  std::string ffn = "model.ffn_hidden_size (--ffn-hidden-size)";
};

// UserError, prefixed with `where` when it is not empty ("--init-from
// 'dir/config.json'"), when m has no layer, more than kMaxModelLayers, or
// more than kMaxModelParams parameters. Call it before build_layout.
void check_model_limits(const ModelConfig& m, const std::string& where, const ModelSizeNames& names = {});

}  // namespace ds
