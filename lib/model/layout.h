// Parameter layout of a GPT model: every weight is a named range of one flat
// buffer. Params, grads and optimizer states share this layout, so ZeRO
// partitions, checkpoints and HF export are all expressed as ranges and names.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/model/model_config.h"
#include "lib/model/param_group.h"
#include "lib/model/param_ref.h"
#include "lib/parallel/group_space.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

// How a weight is initialised.
// LinearUniform: U(-1/sqrt(in), 1/sqrt(in)) for an (out, in) weight,
// PyTorch's nn.Linear default (DeepSpeed-Chat's v_head).
// LoraRight: U(-1/sqrt(dim), 1/sqrt(dim)) for a (dim, in) tensor: PyTorch's
// kaiming_uniform(a=sqrt(5)) of DeepSpeed-Chat's (in, dim) lora_right_weight.
enum class InitKind { Normal, ScaledNormal, Zeros, Ones, LinearUniform, LoraRight };

// How a weight is split over the tensor-parallel ranks (Megatron style).
//   Replicated: every rank holds the whole weight (norms, row-parallel biases, wpe).
//   Rows: dim 0 split; with row_blocks the full dim 0 is a list of blocks (qkv:
//         [q|k|v], SwiGLU fc: [gate|up]) and each block is split, so the local
//         weight is [block0_r | block1_r | ...]. Column-parallel linears, their
//         biases, and the vocab-parallel wte / head. A block cut into fewer
//         parts than tp (grouped-query k and v with fewer kv heads than tp
//         ranks) is replicated: rank r holds part r / (tp / parts).
//   Cols: dim 1 split (row-parallel linears: attention and MLP proj).
enum class TpSplit { Replicated, Rows, Cols };

// One block of dim 0 of a Rows weight: its rows in the full weight, and how
// many distinct parts the tp ranks hold (tp, or a divisor of tp: replicated).
struct RowBlock {
  int64_t rows = 0;
  int parts = 1;
};

struct ParamSpec {
  std::string name;   // e.g. "layers.3.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0; // elements from the start of the flat buffer
  int64_t numel = 0;
  int layer = -1;     // transformer layer index; -1 embeddings, num_layers for the final norm / head
  int group = 0;      // index into ModelLayout::groups
  bool decay = true;  // weight decay applies: the group's rule (param_group.h)
  // Multiplies the step's learning rate for this tensor (LoRA's
  // --lora_learning_rate); 0: frozen (its gradient is zero and the update
  // leaves it as it is: LoRA's base weights).
  float lr_scale = 1.f;
  InitKind init = InitKind::Normal;
  TpSplit split = TpSplit::Replicated;
  std::vector<RowBlock> row_blocks;  // Rows: the blocks of dim 0 (one block: all rows, parts tp)
  Shape full_shape;   // shape of the whole (unsplit) weight; == shape when tp = 1 and ep = 1
  // Its group splits over the expert-parallel ranks: dim 0 (the expert) is
  // cut into shard.ep contiguous blocks, block ep_rank held. `split` then
  // applies to each expert's matrix (dims 1 on; row_blocks: one expert's
  // rows): expert tensor parallelism, else the experts are replicated over
  // the tensor-parallel ranks.
  bool ep_split = false;
};

struct ModelLayout {
  std::vector<ParamSpec> params;
  int64_t total = 0;
  std::vector<ParamGroupSpec> groups;  // every ParamSpec::group indexes one
  // The blocks' typed handles (blocks.h): layers[l] for every layer this
  // shard holds (undefined refs elsewhere), the embeddings on the first stage
  // and with tied embeddings on the last (wte), the final norm and untied
  // head on the last stage.
  std::vector<LayerParams> layers;
  EmbeddingParams embed;
  HeadParams head;
  const ParamSpec& operator[](ParamRef r) const { return params[static_cast<size_t>(r.index)]; }
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
  int NKV = 0;                              // kv heads (grouped-query attention; NH: multi-head)
  int rot = 0;                              // rotary dims per head (rope models; HS: full rotary)
  int qkv_rows() const { return (NH + 2 * NKV) * HS; }  // rows of the fused qkv weight
  int V = 0, Vp = 0, maxT = 0;              // real vocab, padded vocab, max positions
  bool gpt2 = true;                         // LayerNorm/GELU/learned pos/bias family
  bool bias = true, untied = false, rope = false, rmsnorm = false, swiglu = false, relu = false;
  bool value_head = false;                  // head.weight is (1, C) and untied (ModelConfig::value_head)
  int pos_offset = 0;                       // ModelConfig::position_offset (wpe has maxT + pos_offset rows)
  bool post_norm = false;                   // ModelConfig::post_norm: post-LayerNorm blocks, no final norm
  int P = 0;                                // token embedding width: C, or ModelConfig::embed_proj_dim
  bool projects() const { return P != C; }  // project_in / project_out around the layers
  bool final_norm() const { return !post_norm; }
  int head_rows() const { return value_head ? 1 : Vp; }  // rows of head.weight (untied heads)
  std::vector<int> experts;                 // per layer: > 1 a Mixture-of-Experts layer, else 1
  int topk = 1;                             // experts per token (MoE layers)
  bool moe_residual = false;                // PR-MoE: a dense MLP beside each MoE layer's experts
  bool expert_tp = false;                   // experts split over the tp ranks (--enable-expert-tensor-parallelism)
  int layer_experts(int l) const { return experts.empty() ? 1 : experts[static_cast<size_t>(l)]; }
};
ModelDims model_dims(const ModelConfig& m);
// ZB-H1: bytes one micro-batch's deferred weight gradients keep on a rank
// holding `layers` (GptModel::stage_backward with defer_weights: copies of
// the dense linear layers' inputs and output gradients, the attention's only
// in an MoE layer). `rows`: micro-batch x the sequence positions the rank's
// linear layers see (the whole sequence under tensor-model sequence
// parallelism, the rank's share under Ulysses).
int64_t deferred_weight_grad_bytes(const ModelDims& d, int tp, int64_t rows, int64_t elem_bytes,
                                   const std::vector<int>& layers);

// The layout of shard s: with s.tp > 1 the LOCAL shards (tensor-parallel rank
// s.tp_rank) of every weight, same names and order as the full layout (tp = 1);
// heads, hidden and FFN size and the padded vocab must divide tp (UserError
// naming the numbers). With s.pp > 1: only pipeline stage s.pp_rank's weights
// (balanced layers per stage in s.vp chunks; num_layers must divide, UserError
// otherwise), keeping the single-process names and layer numbers. The default
// shard is the whole model.
ModelLayout build_layout(const ModelConfig& m, const ShardCoords& s = {});
int64_t count_parameters(const ModelConfig& m);
// Parameters of the experts a token does not run through: for each MoE
// layer, (experts - topk) / experts of its expert weights (the router and
// the dense layers all run). 0 without MoE layers.
int64_t inactive_expert_params(const ModelLayout& layout, int topk);

// The flat extents of the layout's tensors whose group satisfies `in`,
// adjacent ones merged (a group space's ranges, group_space.h).
std::vector<Range> group_ranges(const ModelLayout& l, const std::function<bool(const ParamGroupSpec&)>& in);
// The tensors of group space s (each wholly inside or outside it) packed at
// their positions in s: the layout an optimizer of that group's owned range
// works on (names, shapes and decay flags kept; total = s.total()).
ModelLayout packed_layout(const ModelLayout& l, const GroupSpace& s);

// Distinct kv-head parts of the fused qkv weight over tp ranks: tp when the
// kv heads split (NKV % tp == 0), NKV when each rank holds one replicated kv
// head (tp % NKV == 0).
inline int kv_parts(const ModelDims& d, int tp) { return d.NKV >= tp ? tp : d.NKV; }

// Calls fn(full_off, local_off, count) (element offsets within the weight)
// for each contiguous run of local weight p of tp rank r: how a rank's shard
// sits in the full weight (slicing, gathering, checkpoint reshape). An expert
// weight (ep_split: dim 0 the expert) splits each expert's matrix, dim 1 on:
// `experts` is how many experts the full buffer holds (-1: all of them).
template <class Fn>
void for_each_tp_run(const ParamSpec& p, int tp, int r, Fn fn, int64_t experts = -1) {
  const int64_t n_exp = experts >= 0 ? experts : (p.ep_split ? p.full_shape[0] : 1);
  const int64_t full_per = shape_numel(p.full_shape) / (p.ep_split ? p.full_shape[0] : 1);
  if (p.split == TpSplit::Replicated || tp == 1) return fn(int64_t{0}, int64_t{0}, n_exp * full_per);
  const int64_t local_per = p.numel / (p.ep_split ? p.shape[0] : 1);
  for (int64_t e = 0; e < n_exp; ++e) {
    const int64_t fb = e * full_per, lb = e * local_per;
    if (p.split == TpSplit::Rows) {
      int64_t rows = 0;
      for (const RowBlock& b : p.row_blocks) rows += b.rows;
      const int64_t inner = full_per / rows;
      int64_t full_at = 0, local_at = 0;  // rows
      for (const RowBlock& b : p.row_blocks) {
        const int64_t local = b.rows / b.parts, part = r / (tp / b.parts);
        fn(fb + (full_at + part * local) * inner, lb + local_at * inner, local * inner);
        full_at += b.rows;
        local_at += local;
      }
      continue;
    }
    const int64_t cols = p.full_shape.back(), lc = cols / tp;  // Cols: (rows, cols) -> (rows, lc)
    for (int64_t i = 0; i < full_per / cols; ++i) fn(fb + i * cols + r * lc, lb + i * lc, lc);
  }
}

// The same for the local weight p of a layout's shard `s`, every parallel
// axis included: an expert weight's runs lie in its block of experts.
template <class Fn>
void for_each_shard_run(const ParamSpec& p, const ShardCoords& s, Fn fn) {
  if (!(p.ep_split && s.ep > 1)) return for_each_tp_run(p, s.tp, s.tp_rank, fn);
  const int64_t local_experts = p.shape[0];
  const int64_t base = int64_t{s.ep_rank} * local_experts * (shape_numel(p.full_shape) / p.full_shape[0]);
  for_each_tp_run(
      p, s.tp, s.tp_rank, [&](int64_t fo, int64_t lo, int64_t n) { fn(base + fo, lo, n); }, local_experts);
}

}  // namespace ds
