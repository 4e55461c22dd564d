// Parameter layout of a GPT model: every weight is a named range of one flat
// buffer. Params, grads and optimizer states share this layout, so ZeRO
// partitions, checkpoints and HF export are all expressed as ranges and names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/model/model_config.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

// How a weight is initialised.
enum class InitKind { Normal, ScaledNormal, Zeros, Ones };

// How a weight is split over the tensor-parallel ranks (Megatron style).
//   Replicated: every rank holds the whole weight (norms, row-parallel biases, wpe).
//   Rows: dim 0 split; with split_groups = g the full dim 0 is g blocks (qkv:
//         [q|k|v], SwiGLU fc: [gate|up]) and each block is split, so the local
//         weight is [block0_r | block1_r | ...]. Column-parallel linears, their
//         biases, and the vocab-parallel wte / head.
//   Cols: dim 1 split (row-parallel linears: attention and MLP proj).
enum class TpSplit { Replicated, Rows, Cols };

struct ParamSpec {
  std::string name;   // e.g. "layers.3.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0; // elements from the start of the flat buffer
  int64_t numel = 0;
  int layer = -1;     // transformer layer index; -1 embeddings, num_layers for the final norm / head
  bool decay = true;  // weight decay applies (matrices yes; biases, norms no)
  InitKind init = InitKind::Normal;
  TpSplit split = TpSplit::Replicated;
  int split_groups = 1;
  Shape full_shape;   // shape of the whole (unsplit) weight; == shape when tp = 1
};

struct ModelLayout {
  std::vector<ParamSpec> params;
  int64_t total = 0;
  // The shard this layout describes (tp, pp, vp sizes and ranks). The
  // pipeline stage holds layers [first_layer, end_layer);
  // embeddings (wte, wpe) on the first stage, final norm (+ untied head) on the
  // last; with tied embeddings the last stage also holds wte (layer -1, first
  // in the layout) for the logits. pp = 1: the whole model. With vp virtual
  // stages (interleaved 1F1B) the stage holds vp chunks: chunk c is virtual
  // stage c * pp + pp_rank with layers chunks[c]; first_layer / end_layer
  // then span them all (not every layer between is held).
  ShardCoords shard;
  int first_layer = 0, end_layer = 0;
  struct LayerSpan {
    int begin = 0, end = 0;
  };
  std::vector<LayerSpan> chunks;  // vp entries
  bool holds_layer(int layer) const;
  bool first_stage() const { return shard.first_stage(); }
  bool last_stage() const { return shard.last_stage(); }
  const ParamSpec& find(const std::string& name) const;  // throws if absent
  const ParamSpec* try_find(const std::string& name) const;
};

// Resolved dimensions of a model (derived once from ModelConfig).
struct ModelDims {
  int L = 0, C = 0, NH = 0, HS = 0, F = 0;  // F: FFN hidden size
  int V = 0, Vp = 0, maxT = 0;              // real vocab, padded vocab, max positions
  bool gpt2 = true;                         // LayerNorm/GELU/learned pos/bias family
  bool bias = true, untied = false, rope = false, rmsnorm = false, swiglu = false;
};
ModelDims model_dims(const ModelConfig& m);

// The layout of shard s: with s.tp > 1 the LOCAL shards (tensor-parallel rank
// s.tp_rank) of every weight, same names and order as the full layout (tp = 1);
// heads, hidden and FFN size and the padded vocab must divide tp (UserError
// naming the numbers). With s.pp > 1: only pipeline stage s.pp_rank's weights
// (balanced layers per stage in s.vp chunks; num_layers must divide, UserError
// otherwise), keeping the single-process names and layer numbers. The default
// shard is the whole model.
ModelLayout build_layout(const ModelConfig& m, const ShardCoords& s = {});
int64_t count_parameters(const ModelConfig& m);

}  // namespace ds
