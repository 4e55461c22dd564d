// Parameter declarations of the GPT blocks (see blocks.h). The order of the
// add() calls is the flat layout's order: a layer's weights are contiguous,
// so a layer is one range (ZeRO-3 gathers and pipeline stages cut on layer
// boundaries).
#include "lib/model/blocks.h"

#include "lib/core/error.h"

namespace ds {

LayerSpec layer_spec(const ModelDims& d, int tp) {
  LayerSpec s;
  s.norm = d.rmsnorm ? NormKind::RMSNorm : NormKind::LayerNorm;
  s.mlp = d.swiglu ? MlpKind::SwiGLU : MlpKind::Gelu;
  s.bias = d.bias;
  s.rope = d.rope;
  s.C = d.C;
  s.Q = int64_t{d.NH} * d.HS;
  s.KV = int64_t{d.NKV} * d.HS;
  s.F = d.F;
  s.kv_parts = kv_parts(d, tp);
  return s;
}

int ParamDeclarer::begin_group(ParamGroupSpec g) {
  out_.groups.push_back(std::move(g));
  group_ = static_cast<int>(out_.groups.size()) - 1;
  return group_;
}

int ParamDeclarer::use_group(const ParamGroupSpec& g) {
  for (size_t i = 0; i < out_.groups.size(); ++i)
    if (out_.groups[i].name == g.name) return group_ = static_cast<int>(i);
  return begin_group(g);
}

ParamRef ParamDeclarer::add(const std::string& name, Shape shape, int layer, InitKind init, TpSplit split,
                            std::vector<RowBlock> blocks) {
  DS_CHECK(group_ >= 0, "parameter '{}' declared outside a parameter group", name);
  const int tp = out_.shard.tp;
  ParamSpec p;
  p.name = name;
  p.full_shape = shape;
  p.split = split;
  p.group = group_;
  p.decay = out_.groups[group_].decays(name, shape);
  p.ep_split = out_.groups[group_].splits_over(ParallelAxis::Expert);
  if (p.ep_split) {
    const int ep = out_.shard.ep;
    DS_USER_CHECK(!shape.empty() && shape[0] % ep == 0,
                  "{}: {} experts do not split over --moe-expert-parallel-size {}", name,
                  shape.empty() ? 0 : shape[0], ep);
    shape[0] /= ep;
  }
  const size_t rows = p.ep_split ? 1 : 0;  // the split matrix's first dim
  DS_CHECK(split == TpSplit::Replicated || shape.size() >= rows + (split == TpSplit::Cols ? 2 : 1),
           "parameter '{}': shape {} cannot split over tp", name, shape_str(shape));
  if (split == TpSplit::Rows) {
    if (blocks.empty()) blocks.push_back({shape[rows], tp});
    shape[rows] = 0;
    for (const RowBlock& b : blocks) shape[rows] += b.rows / b.parts;
    p.row_blocks = std::move(blocks);
  }
  if (split == TpSplit::Cols) shape.back() /= tp;
  p.shape = std::move(shape);
  p.numel = shape_numel(p.shape);
  p.offset = out_.total;
  p.layer = layer;
  p.init = init;
  out_.total += p.numel;
  out_.params.push_back(std::move(p));
  return ParamRef{static_cast<int32_t>(out_.params.size() - 1)};
}

NormParams declare_norm(ParamDeclarer& p, const std::string& name, const LayerSpec& s, int layer) {
  NormParams n;
  n.weight = p.add(name + ".weight", {s.C}, layer, InitKind::Ones);
  if (s.norm == NormKind::LayerNorm) n.bias = p.add(name + ".bias", {s.C}, layer, InitKind::Zeros);
  return n;
}

// qkv is column-parallel with its rows in blocks [q | k | v]; k and v split
// into kv_parts (replicated over tp / kv_parts ranks with fewer kv heads than
// tp ranks). proj is row-parallel; its bias is replicated.
AttentionParams declare_attention(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer) {
  const std::vector<RowBlock> blocks{{s.Q, p.tp()}, {s.KV, s.kv_parts}, {s.KV, s.kv_parts}};
  const int64_t rows = s.Q + 2 * s.KV;
  AttentionParams a;
  a.qkv.weight = p.add(prefix + "attn.qkv.weight", {rows, s.C}, layer, InitKind::Normal, TpSplit::Rows, blocks);
  if (s.bias) a.qkv.bias = p.add(prefix + "attn.qkv.bias", {rows}, layer, InitKind::Zeros, TpSplit::Rows, blocks);
  a.proj.weight = p.add(prefix + "attn.proj.weight", {s.C, s.C}, layer, InitKind::ScaledNormal, TpSplit::Cols);
  if (s.bias) a.proj.bias = p.add(prefix + "attn.proj.bias", {s.C}, layer, InitKind::Zeros);
  return a;
}

// fc is column-parallel (SwiGLU: blocks [gate | up], each split), proj
// row-parallel with a replicated bias.
MlpParams declare_mlp(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer) {
  const std::vector<RowBlock> blocks(s.fc_blocks(), RowBlock{s.F, p.tp()});
  const int64_t rows = s.fc_blocks() * s.F;
  MlpParams m;
  m.fc.weight = p.add(prefix + "mlp.fc.weight", {rows, s.C}, layer, InitKind::Normal, TpSplit::Rows, blocks);
  if (s.bias) m.fc.bias = p.add(prefix + "mlp.fc.bias", {rows}, layer, InitKind::Zeros, TpSplit::Rows, blocks);
  m.proj.weight = p.add(prefix + "mlp.proj.weight", {s.C, s.F}, layer, InitKind::ScaledNormal, TpSplit::Cols);
  if (s.bias) m.proj.bias = p.add(prefix + "mlp.proj.bias", {s.C}, layer, InitKind::Zeros);
  return m;
}

MoeParams declare_moe(ParamDeclarer& p, const std::string& prefix, const LayerSpec& s, int layer) {
  const int64_t E = s.experts, rows = s.fc_blocks() * s.F;
  MoeParams m;
  m.gate = p.add(prefix + "mlp.gate.weight", {E, s.C}, layer, InitKind::Normal);
  if (s.moe_residual) {
    m.coef.weight = p.add(prefix + "mlp.coefficient.weight", {2, s.C}, layer, InitKind::Normal);
    m.coef.bias = p.add(prefix + "mlp.coefficient.bias", {2}, layer, InitKind::Zeros);  // always (nn.Linear)
    m.res_fc.weight = p.add(prefix + "mlp.residual.fc.weight", {rows, s.C}, layer, InitKind::Normal);
    if (s.bias) m.res_fc.bias = p.add(prefix + "mlp.residual.fc.bias", {rows}, layer, InitKind::Zeros);
    m.res_proj = p.add(prefix + "mlp.residual.proj.weight", {s.C, s.F}, layer, InitKind::ScaledNormal);
  }
  const int was = p.group();
  p.use_group(expert_param_group(s.expert_tp));
  // Expert tensor parallelism: each expert's fc column-parallel (SwiGLU:
  // [gate | up], each split) and proj row-parallel, as the dense MLP;
  // otherwise every tp rank holds whole experts.
  const TpSplit col = s.expert_tp ? TpSplit::Rows : TpSplit::Replicated;
  const TpSplit row = s.expert_tp ? TpSplit::Cols : TpSplit::Replicated;
  std::vector<RowBlock> blocks;
  if (s.expert_tp) blocks.assign(static_cast<size_t>(s.fc_blocks()), RowBlock{s.F, p.tp()});
  m.fc.weight = p.add(prefix + "mlp.experts.fc.weight", {E, rows, s.C}, layer, InitKind::Normal, col, blocks);
  if (s.bias) m.fc.bias = p.add(prefix + "mlp.experts.fc.bias", {E, rows}, layer, InitKind::Zeros, col, blocks);
  m.proj = p.add(prefix + "mlp.experts.proj.weight", {E, s.C, s.F}, layer, InitKind::ScaledNormal, row);
  p.set_group(was);
  return m;
}

LayerParams declare_layer(ParamDeclarer& p, const LayerSpec& s, int layer) {
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  LayerParams l;
  l.norm1 = declare_norm(p, prefix + "norm1", s, layer);
  l.attn = declare_attention(p, prefix, s, layer);
  l.norm2 = declare_norm(p, prefix + "norm2", s, layer);
  if (s.experts > 1)
    l.moe = declare_moe(p, prefix, s, layer);
  else
    l.mlp = declare_mlp(p, prefix, s, layer);
  return l;
}

}  // namespace ds
