// The layer spec and the blocks that declare a GPT model's parameters.
// LayerSpec says, once from the model config, what a transformer layer is
// made of (which norm, attention with which heads and positions, which MLP);
// each block declares its tensors into a parameter group of the layout
// (ParamDeclarer) and hands back typed handles (param_ref.h) that the model
// uses on the hot path instead of names. The names, shapes, order and tensor-
// parallel splits declared here are the checkpoint and Hugging Face contract
// (docs/checkpoint.md); build_layout (layout.cpp) composes the blocks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/model/layout.h"
#include "lib/model/param_group.h"

namespace ds {

// The MLP of a layer: a dense GELU MLP, or LLaMA's SwiGLU (fc = [gate | up]).
// (Mixture of Experts comes here as a third kind.)
enum class MlpKind : uint8_t { Gelu, SwiGLU };

struct LayerSpec {
  NormKind norm = NormKind::LayerNorm;  // LayerNorm: weight and bias; RMSNorm: weight
  MlpKind mlp = MlpKind::Gelu;
  bool bias = true;   // linear biases
  bool rope = false;  // rotary positions (no learned position table)
  int64_t C = 0;      // hidden size
  int64_t Q = 0, KV = 0;  // q rows (NH*HS), k and v rows each (NKV*HS)
  int64_t F = 0;      // FFN hidden size (per fc block)
  int kv_parts = 1;   // distinct kv parts over the tp ranks (kv_parts())
  int experts = 1;    // > 1: a Mixture-of-Experts layer of that many `mlp` experts
  bool moe_residual = false;  // PR-MoE: the MoE layer has a dense MLP beside its experts
  bool expert_tp = false;     // each expert's fc column-parallel and proj row-parallel over tp
  int fc_blocks() const { return mlp == MlpKind::SwiGLU ? 2 : 1; }
};
LayerSpec layer_spec(const ModelDims& d, int tp);

// Appends parameters to a layout, each into a group, at the next flat offset.
class ParamDeclarer {
 public:
  explicit ParamDeclarer(ModelLayout& out) : out_(out) {}
  int tp() const { return out_.shard.tp; }
  // Adds a group; later add() calls declare into it. Returns its index.
  int begin_group(ParamGroupSpec g);
  // Declares into the group named g.name from now on, adding it if new.
  int use_group(const ParamGroupSpec& g);
  int group() const { return group_; }
  void set_group(int g) { group_ = g; }
  // shape: the FULL shape; the local one divides the split dim by the
  // layout's tp (Rows: each of `blocks` by its parts; none: one block). Weight
  // decay follows the current group's rule. In a group split over the
  // expert-parallel ranks dim 0 is the expert, divided by the ep size, and
  // the tp split applies to each expert's matrix (blocks: one expert's rows).
  ParamRef add(const std::string& name, Shape shape, int layer, InitKind init, TpSplit split = TpSplit::Replicated,
               std::vector<RowBlock> blocks = {});

 private:
  ModelLayout& out_;
  int group_ = -1;
};

// The blocks. prefix: the block's name prefix ("layers.3."); layer: the
// transformer layer (-1 embeddings, L the final norm and head).
NormParams declare_norm(ParamDeclarer& p, const std::string& name, const LayerSpec& s, int layer);
AttentionParams declare_attention(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer);
MlpParams declare_mlp(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer);
// The router (dense group) and the stacked experts (experts group), replicated
// over tensor-parallel ranks.
MoeParams declare_moe(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer);
LayerParams declare_layer(ParamDeclarer& p, const LayerSpec& s, int layer);

}  // namespace ds
