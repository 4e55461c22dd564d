// Builds the flat parameter layout for GPT-2 and LLaMA style models from the
// blocks (blocks.h). Order: embeddings, then each layer's weights contiguous
// (so a layer is one range: ZeRO-3 gathers and pipeline stages cut on layer
// boundaries), then the final norm and (if untied) the output head.
#include "lib/model/layout.h"

#include <algorithm>
#include <map>

#include "lib/core/error.h"
#include "lib/model/blocks.h"

namespace ds {

ModelDims model_dims(const ModelConfig& m) {
  ModelDims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.NH = m.num_heads;
  DS_USER_CHECK(d.NH > 0 && d.C % d.NH == 0, "model: hidden_size {} must be divisible by num_heads {}",
                d.C, d.NH);
  d.HS = d.C / d.NH;
  d.NKV = m.num_kv_heads > 0 ? m.num_kv_heads : d.NH;
  DS_USER_CHECK(d.NH % d.NKV == 0, "model: num_attention_heads {} must be divisible by num_key_value_heads {}",
                d.NH, d.NKV);
  d.swiglu = m.activation == Activation::SwiGLU;
  d.relu = m.activation == Activation::ReLU;
  d.F = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : (d.swiglu ? (4 * d.C * 2 / 3) / 64 * 64 : 4 * d.C);
  d.V = m.vocab_size;
  d.Vp = m.padded_vocab_size > 0 ? m.padded_vocab_size : m.vocab_size;
  d.maxT = m.max_position_embeddings;
  d.bias = m.bias;
  d.value_head = m.value_head;
  d.pos_offset = m.position_offset;
  DS_USER_CHECK(d.pos_offset >= 0 && d.pos_offset <= 2, "model.position_offset {} must be 0, 1 or 2", d.pos_offset);
  d.untied = m.untie_embeddings || m.value_head;  // a value head is never the embedding
  d.post_norm = m.post_norm;
  d.P = m.embed_proj_dim > 0 ? m.embed_proj_dim : d.C;
  d.rope = m.position == PositionKind::Rope;
  DS_USER_CHECK(m.embed_proj_dim >= 0, "model.embed_proj_dim {} must be >= 0", m.embed_proj_dim);
  d.rmsnorm = m.norm == NormKind::RMSNorm;
  d.gpt2 = m.family == ModelFamily::GPT2;
  d.experts.resize(static_cast<size_t>(std::max(d.L, 0)), 1);
  for (int l = 0; l < d.L; ++l) d.experts[static_cast<size_t>(l)] = m.moe.experts(l, d.L);
  d.topk = m.moe.topk;
  d.moe_residual = m.moe.residual;
  d.expert_tp = m.moe.expert_tensor_parallelism;
  DS_USER_CHECK(!d.post_norm || !m.moe.enabled(d.L), "model: post-norm blocks (model.post_norm) with Mixture-of-"
                "Experts layers are not supported");
  DS_USER_CHECK(d.V > 0 && d.Vp >= d.V, "model: vocab size {} / padded {} invalid", d.V, d.Vp);
  DS_USER_CHECK(!d.rope || d.HS % 2 == 0, "model: rope needs an even head size, got {}", d.HS);
  DS_USER_CHECK(m.rotary_percent > 0.f && m.rotary_percent <= 1.f, "model: rotary_percent {} must be in (0, 1]",
                m.rotary_percent);
  d.rot = static_cast<int>(d.HS * static_cast<double>(m.rotary_percent));  // Megatron: int(kv_channels * p)
  DS_USER_CHECK(!d.rope || (d.rot >= 2 && d.rot % 2 == 0),
                "model: rotary_percent {} of head size {} gives {} rotary dims; it must be an even number >= 2",
                m.rotary_percent, d.HS, d.rot);
  return d;
}

namespace {

// Tensor-parallel divisibility, one clear error naming the numbers.
void check_tp(const ModelDims& d, int tp) {
  DS_USER_CHECK(tp >= 1, "tensor_model_parallel_size {} must be >= 1", tp);
  if (tp == 1) return;
  DS_USER_CHECK(!d.value_head, "tensor parallelism: a value-head model (reward / critic) runs on one "
                "tensor-parallel rank; tensor_model_parallel_size is {}", tp);
  DS_USER_CHECK(d.NH % tp == 0 && d.C % tp == 0 && d.F % tp == 0 && d.Vp % tp == 0,
                "tensor parallelism: num_heads {}, hidden_size {}, ffn_hidden_size {} and padded vocab {} must "
                "all be divisible by tensor_model_parallel_size {}",
                d.NH, d.C, d.F, d.Vp, tp);
  DS_USER_CHECK(d.NKV % tp == 0 || tp % d.NKV == 0,
                "tensor parallelism: num_key_value_heads {} (--num-key-value-heads / --num-query-groups) must "
                "divide or be a multiple of tensor_model_parallel_size {}",
                d.NKV, tp);
}

}  // namespace

namespace {

// LoRA (ModelConfig::lora): layer l's targets' left and right tensors, right
// after its own weights (so in its unit); the weights they adapt frozen.
void declare_lora(ParamDeclarer& b, ModelLayout& out, const LoraConfig& lora, int l) {
  if (!lora.enabled()) return;
  std::map<std::string, int64_t> covered;  // rows of each adapted weight
  for (size_t k = 0; k < lora.targets.size(); ++k) {
    const LoraTarget& t = lora.targets[k];
    if (t.layer != l) continue;
    const std::string name = "layers." + std::to_string(l) + "." + t.weight;
    const ParamSpec* base = out.try_find(name);
    DS_USER_CHECK(base && base->full_shape.size() == 2, "LoRA: layer {} has no weight '{}' to adapt (a dense "
                  "layer's attn.qkv, attn.proj, mlp.fc or mlp.proj)", l, t.weight);
    DS_USER_CHECK(t.rows > 0 && t.row0 >= 0 && t.row0 + t.rows <= base->full_shape[0], "LoRA: rows [{}, {}) of {} "
                  "outside its {}", t.row0, t.row0 + t.rows, name, shape_str(base->full_shape));
    covered[name] += t.rows;
    const int64_t in = base->full_shape[1];
    const std::string p = "layers." + std::to_string(l) + ".lora." + std::to_string(k) + ".";
    b.add(p + "left", {lora.dim, t.rows}, l, InitKind::Zeros);
    out.params.back().lr_scale = lora.lr_scale;
    b.add(p + "right", {lora.dim, in}, l, InitKind::LoraRight);
    out.params.back().lr_scale = lora.lr_scale;
  }
  for (const auto& [name, rows] : covered) {
    ParamSpec& base = out.params[static_cast<size_t>(&out.find(name) - out.params.data())];
    DS_USER_CHECK(rows == base.full_shape[0], "LoRA: the targets of {} cover {} of its {} rows; its Hugging Face "
                  "linears (q/k/v, gate/up) are fused here, so adapt all of them or none", name, rows,
                  base.full_shape[0]);
    base.lr_scale = 0.f;  // frozen
  }
}

// --only_optimize_lora: everything but the LoRA tensors and a value head frozen.
void freeze_for_lora(ModelLayout& out, const ModelConfig& m) {
  if (!m.lora.enabled() || !m.lora.only_lora) return;
  for (ParamSpec& p : out.params)
    if (p.name.find(".lora.") == std::string::npos && !(m.value_head && p.name == "head.weight")) p.lr_scale = 0.f;
}

}  // namespace

ModelLayout build_layout(const ModelConfig& m, const ShardCoords& s) {
  const int tp = s.tp, tp_rank = s.tp_rank, pp = s.pp, pp_rank = s.pp_rank, vp = s.vp;
  ModelDims d = model_dims(m);
  check_tp(d, tp);
  DS_USER_CHECK((!d.post_norm && !d.projects()) || (tp == 1 && pp == 1), "model: post-norm blocks "
                "(model.post_norm) and a projected embedding (model.embed_proj_dim, OPT-350m's) run without tensor "
                "or pipeline parallelism; tensor_model_parallel_size is {}, pipeline_model_parallel_size {}", tp, pp);
  DS_USER_CHECK(!m.lora.enabled() || tp == 1, "LoRA runs on one tensor-parallel rank; tensor_model_parallel_size "
                "is {}", tp);
  DS_CHECK(tp_rank >= 0 && tp_rank < tp, "tp_rank {} outside [0, {})", tp_rank, tp);
  DS_CHECK(s.ep >= 1 && s.ep_rank >= 0 && s.ep_rank < s.ep, "ep_rank {} outside [0, {})", s.ep_rank, s.ep);
  DS_USER_CHECK(pp >= 1 && d.L % pp == 0,
                "model.num_layers {} is not divisible by pipeline_model_parallel_size {}", d.L, pp);
  DS_USER_CHECK(vp >= 1 && (d.L / pp) % vp == 0,
                "layers per pipeline stage {} are not divisible into {} virtual stages", d.L / pp, vp);
  DS_CHECK(pp_rank >= 0 && pp_rank < pp, "pp_rank {} outside [0, {})", pp_rank, pp);
  ModelLayout out;
  out.shard = s;
  const int per_chunk = d.L / (pp * vp);
  for (int c = 0; c < vp; ++c) {
    const int v = c * pp + pp_rank;  // virtual stage of chunk c
    out.chunks.push_back({v * per_chunk, (v + 1) * per_chunk});
  }
  out.first_layer = out.chunks.front().begin;
  out.end_layer = out.chunks.back().end;
  out.layers.resize(static_cast<size_t>(d.L));
  const bool first = pp_rank == 0, last = pp_rank == pp - 1;
  LayerSpec spec = layer_spec(d, tp);
  ParamDeclarer b(out);
  ParamGroupSpec dense = dense_param_group();
  if (m.decay_block_norms) dense.decay = DecayRule::MegatronBlockNorms;
  b.begin_group(dense);
  if (first || (last && !d.untied))
    out.embed.wte = b.add("embed.wte", {d.Vp, d.P}, -1, InitKind::Normal, TpSplit::Rows);
  if (first && !d.rope) out.embed.wpe = b.add("embed.wpe", {d.maxT + d.pos_offset, d.C}, -1, InitKind::Normal);
  if (first && d.projects()) out.embed.project_in = b.add("embed.project_in", {d.C, d.P}, -1, InitKind::Normal);
  for (int l = out.first_layer; l < out.end_layer; ++l)
    if (out.holds_layer(l)) {
      spec.experts = d.layer_experts(l);
      spec.moe_residual = d.moe_residual;
      spec.expert_tp = d.expert_tp;
      out.layers[static_cast<size_t>(l)] = declare_layer(b, spec, l);
      declare_lora(b, out, m.lora, l);
    }
  if (!last) return freeze_for_lora(out, m), out;
  if (d.final_norm()) out.head.final_norm = declare_norm(b, "final_norm", spec, d.L);
  if (d.projects()) out.head.project_out = b.add("head.project_out", {d.P, d.C}, d.L, InitKind::Normal);
  if (d.untied)
    out.head.head = b.add("head.weight", {d.head_rows(), d.P}, d.L,
                          d.value_head ? InitKind::LinearUniform : InitKind::Normal, TpSplit::Rows);
  freeze_for_lora(out, m);
  return out;
}

bool ModelLayout::holds_layer(int layer) const {
  for (const auto& c : chunks)
    if (layer >= c.begin && layer < c.end) return true;
  return false;
}

int64_t count_parameters(const ModelConfig& m) { return build_layout(m).total; }

int64_t inactive_expert_params(const ModelLayout& layout, int topk) {
  int64_t n = 0;
  for (const ParamSpec& p : layout.params) {
    if (p.group < 0 || layout.groups[static_cast<size_t>(p.group)].name != "experts") continue;
    const int64_t E = p.full_shape[0];
    n += p.numel / E * std::max<int64_t>(E - topk, 0);
  }
  return n;
}

const ParamSpec* ModelLayout::try_find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamSpec& ModelLayout::find(const std::string& name) const {
  const ParamSpec* p = try_find(name);
  DS_CHECK(p != nullptr, "no parameter named '{}' in the model layout", name);
  return *p;
}

std::vector<Range> group_ranges(const ModelLayout& l, const std::function<bool(const ParamGroupSpec&)>& in) {
  std::vector<Range> r;
  for (const ParamSpec& p : l.params)
    if (in(l.groups[static_cast<size_t>(p.group)])) r.push_back({p.offset, p.offset + p.numel});
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return merge_adjacent(std::move(r));
}

ModelLayout packed_layout(const ModelLayout& l, const GroupSpace& s) {
  ModelLayout out;
  out.groups = l.groups;
  out.shard = l.shard;
  out.first_layer = l.first_layer;
  out.end_layer = l.end_layer;
  out.chunks = l.chunks;
  out.total = s.total();
  for (const ParamSpec& p : l.params) {
    const std::vector<GroupSpace::Piece> in = s.within({p.offset, p.offset + p.numel});
    if (in.empty()) continue;
    DS_CHECK(in.size() == 1 && in[0].flat.size() == p.numel, "tensor '{}' is split by a group space", p.name);
    ParamSpec q = p;
    q.offset = in[0].at;
    out.params.push_back(std::move(q));
  }
  std::sort(out.params.begin(), out.params.end(),
            [](const ParamSpec& a, const ParamSpec& b) { return a.offset < b.offset; });
  return out;
}

int64_t deferred_weight_grad_bytes(const ModelDims& d, int tp, int64_t rows, int64_t elem_bytes,
                                   const std::vector<int>& layers) {
  const int64_t C = d.C, qkv = d.qkv_rows() / tp, attn = C / tp, F = d.F / tp, fc = d.swiglu ? 2 * F : F;
  const int64_t attention = qkv + C + C + attn;  // qkv: dout, input; proj: dout, input
  const int64_t mlp = fc + C + C + F;            // fc, proj
  int64_t elems = 0;
  for (int l : layers) elems += d.layer_experts(l) > 1 ? attention : attention + mlp;
  return elems * rows * elem_bytes;
}

}  // namespace ds
