// Typed handles to a layout's parameters: what a model block keeps instead of
// looking its weights up by name. A ParamRef is the parameter's index in
// ModelLayout::params; the structs group a block's handles (the layer spec's
// blocks, lib/model/blocks.h, fill them when they declare their weights).
// Header-only, no deps.
#pragma once
#include <cstdint>

namespace ds {

struct ParamRef {
  int32_t index = -1;  // into ModelLayout::params; -1: the block has no such tensor
  bool defined() const { return index >= 0; }
};

struct NormParams {
  ParamRef weight, bias;  // RMSNorm: no bias
};
struct LinearParams {
  ParamRef weight, bias;  // bias-free models: no bias
};
struct AttentionParams {
  LinearParams qkv, proj;
};
struct MlpParams {
  LinearParams fc, proj;  // SwiGLU: fc holds [gate | up]
};
// A Mixture-of-Experts MLP: the router (gate, in the dense group) and the
// experts' MLPs stacked along a leading expert dimension (the experts group):
// fc (E, Fin, C) with bias (E, Fin), proj (E, C, F) without a bias
// (DeepSpeed's experts drop their output bias; docs/moe.md).
struct MoeParams {
  ParamRef gate;  // (E, C)
  LinearParams fc;
  ParamRef proj;
  // PR-MoE (--mlp-type residual): a dense MLP beside the experts (fc (Fin, C)
  // with bias, proj (C, F) without, like an expert) and the coefficient
  // linear (2, C) + bias that mixes the two per token. Dense group.
  LinearParams res_fc;
  ParamRef res_proj;
  LinearParams coef;
};
struct LayerParams {
  NormParams norm1;
  AttentionParams attn;
  NormParams norm2;
  MlpParams mlp;  // dense layers
  MoeParams moe;  // MoE layers (LayerSpec::experts > 1)
  bool is_moe() const { return moe.gate.defined(); }
};
struct EmbeddingParams {
  ParamRef wte, wpe;  // rope models: no wpe
  ParamRef project_in;  // (C, P) when the token embedding is P wide (OPT-350m), else none
};
struct HeadParams {
  NormParams final_norm;  // none in post-norm models
  ParamRef project_out;   // (P, C) when the token embedding is P wide, else none
  ParamRef head;  // untied embeddings only; tied models multiply by wte
};

}  // namespace ds
