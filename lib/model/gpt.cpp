// GPT forward and backward, one transformer layer at a time, on the op API.
//   x_{l+1} = r + drop(MLP(norm2(r))),  r = x_l + drop(Attn(norm1(x_l)))
// (drop: hidden dropout in training; attention dropout inside Attn; the
// embedding output is dropped too, as in Megatron).
// Backward walks the same steps in reverse with one residual-gradient buffer
// that each branch adds into (norm backward uses Accum::Add).
#include "lib/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/model/param_init.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

Tensor rows(const Tensor& t) { return t.reshape({t.numel() / t.size(-1), t.size(-1)}); }

ShardCoords shard_of(const TpComm& tp, const PipeStage& s) {
  return {tp.size, tp.rank, s.pp, s.rank, s.vp, s.ep.size, s.ep.rank};
}

}  // namespace

GptModel::GptModel(const ModelConfig& cfg, Device dev, int64_t alloc_elems, TpComm tp, PipeStage stage,
                   DType compute, FlatStoreOptions flat)
    : cfg_(cfg), compute_(compute), d_(model_dims(cfg)), tp_(tp), stage_(stage),
      layout_(build_layout(cfg, shard_of(tp, stage))), dev_(dev) {
  flat_ = std::make_unique<FlatParamStore>(layout_, d_.L, dev_, alloc_elems, compute_, flat);
  store_ = flat_.get();
  init_local();
}

GptModel::GptModel(const ModelConfig& cfg, Device dev, ParamStore& store, TpComm tp, PipeStage stage,
                   DType compute)
    : cfg_(cfg), compute_(compute), d_(model_dims(cfg)), tp_(tp), stage_(stage),
      layout_(build_layout(cfg, shard_of(tp, stage))), dev_(dev), store_(&store) {
  init_local();
}

void GptModel::init_local() {
  DS_CHECK(!tp_.active() || (tp_.comm && tp_.comm->size() == tp_.size && tp_.comm->rank() == tp_.rank),
           "GptModel: tp {} rank {} without a matching tp communicator", tp_.size, tp_.rank);
  const EpComm& ep = stage_.ep;
  DS_CHECK(!ep.active() || (ep.comm && ep.comm->size() == ep.size && ep.comm->rank() == ep.rank),
           "GptModel: ep {} rank {} without a matching expert-parallel communicator", ep.size, ep.rank);
  Cl_ = d_.C / tp_.size;
  NHl_ = d_.NH / tp_.size;
  NKVl_ = d_.NKV / kv_parts(d_, tp_.size);
  QKVl_ = (NHl_ + 2 * NKVl_) * d_.HS;
  Fl_ = d_.F / tp_.size;
  Vl_ = d_.value_head ? 1 : d_.Vp / tp_.size;  // a value head: one output per row
  vocab_start_ = tp_.rank * Vl_;
  NHa_ = NHl_;
  NKVa_ = NKVl_;
  QKVa_ = QKVl_;
  Ca_ = Cl_;
  units_ = unit_ranges(layout_, d_.L);
  unit_params_.resize(units_.size());
  unit_grads_.resize(units_.size());
  init_lora();
}

void GptModel::set_ulysses(SpComm sp) {
  DS_CHECK(!sp.active() || (sp.comm && sp.comm->size() == sp.size && sp.comm->rank() == sp.rank),
           "GptModel: sp {} rank {} without a matching sp communicator", sp.size, sp.rank);
  DS_USER_CHECK(!sp.active() || (!d_.post_norm && !d_.projects()), "ds_sequence_parallel_size {}: post-norm "
                "blocks and a projected embedding (OPT-350m's) run without sequence parallelism", sp.size);
  sp_ = sp;
  qkv_split_ = HeadSplit{.U = sp.size, .HS = d_.HS, .heads = {NHl_, NKVl_, NKVl_}};
  out_split_ = HeadSplit{.U = sp.size, .HS = d_.HS, .heads = {NHl_}};
  DS_USER_CHECK(NHl_ % sp.size == 0,
                "ds_sequence_parallel_size {}: the {} attention heads{} are not divisible by it", sp.size, NHl_,
                tp_.active() ? fmt::format(" of a tensor-parallel rank ({} / {})", d_.NH, tp_.size) : std::string());
  qkv_split_.check("ds_sequence_parallel_size: key-value heads");
  NHa_ = NHl_ / sp.size;
  NKVa_ = qkv_split_.part(NKVl_);
  QKVa_ = (NHa_ + 2 * NKVa_) * d_.HS;
  Ca_ = NHa_ * d_.HS;
  B_ = T_ = 0;  // reallocate on next use
}

FlatParamStore& GptModel::flat_store() {
  DS_CHECK(flat_, "GptModel::flat_store(): the parameters are held by a sharded store");
  return *flat_;
}

Tensor& GptModel::params() {
  DS_CHECK(flat_, "GptModel::params(): the parameters are held by a sharded store");
  return flat_->params();
}

Tensor& GptModel::compute_params() {
  DS_CHECK(flat_, "GptModel::compute_params(): the parameters are held by a sharded store");
  return flat_->compute_params();
}

Tensor& GptModel::grads() {
  DS_CHECK(flat_, "GptModel::grads(): the gradients are held by a sharded store");
  return flat_->grads();
}

Tensor GptModel::param(const std::string& name) const {
  DS_CHECK(flat_, "GptModel::param('{}'): the parameters are held by a sharded store", name);
  const ParamSpec& p = layout_.find(name);
  return flat_->params().view(p.offset, p.shape);
}

Tensor GptModel::grad(const std::string& name) const {
  DS_CHECK(flat_, "GptModel::grad('{}'): the gradients are held by a sharded store", name);
  const ParamSpec& p = layout_.find(name);
  return flat_->grads().view(p.offset, p.shape);
}

Tensor GptModel::unit_view(ParamRef r, const std::vector<Tensor>& acquired, const char* what) const {
  DS_CHECK(r.defined(), "a {} the model does not hold was used", what);
  const ParamSpec& p = layout_[r];
  const Tensor& u = acquired[static_cast<size_t>(unit_of(p))];
  DS_CHECK(u.defined(), "{} '{}' used while its unit {} is not acquired", what, p.name, unit_of(p));
  return u.view(p.offset - units_[static_cast<size_t>(unit_of(p))].begin, p.shape);
}

Tensor GptModel::w(ParamRef r) const {
  if (!lora_w_.empty())
    if (auto it = lora_w_.find(r.index); it != lora_w_.end()) return it->second;
  return unit_view(r, unit_params_, "parameter");
}

Tensor GptModel::dw(ParamRef r) const {
  if (!lora_dw_.empty())
    if (auto it = lora_dw_.find(r.index); it != lora_dw_.end()) return it->second;
  return unit_view(r, unit_grads_, "gradient");
}

Tensor GptModel::opt(ParamRef r, bool grad) const {
  if (!r.defined()) return Tensor();
  return grad ? dw(r) : w(r);
}

void GptModel::use_params(int unit) {
  if (unit_params_[unit].defined()) return;
  unit_params_[unit] = store_->acquire_params(unit);
  if (!lora_slots_.empty() && !lora_slots_[unit].empty()) lora_acquire(unit);
}

void GptModel::hold_params(bool hold) {
  if (hold_ == hold) return;
  hold_ = hold;
  if (hold) return;
  for (size_t u = 0; u < unit_params_.size(); ++u)
    if (unit_params_[u].defined()) drop_params(static_cast<int>(u));
}

void GptModel::drop_params(int unit) {
  if (hold_) {
    DS_CHECK(lora_dw_.empty(), "a backward ran while the model's weights were held (GptModel::hold_params)");
    return;
  }
  if (!lora_dw_.empty()) lora_fold_grads(unit);  // a backward: the LoRA gradients need the unit's weights
  store_->release_params(unit);
  unit_params_[unit] = Tensor();
  if (!lora_slots_.empty())
    for (const LoraSlot& s : lora_slots_[unit]) lora_w_.erase(s.base);
}

void GptModel::use_grads(int unit) {
  DS_CHECK(!hold_, "a backward ran while the model's weights were held (GptModel::hold_params)");
  if (unit_grads_[unit].defined()) return;
  unit_grads_[unit] = store_->acquire_grads(unit);
  if (!lora_slots_.empty() && !lora_slots_[unit].empty()) lora_grads_begin(unit);
}

void GptModel::grads_done(int unit) {
  if (!frozen_.empty()) {
    if (!lora_dw_.empty()) lora_fold_grads(unit);
    zero_frozen_grads(unit);
  }
  store_->grads_ready(unit);
  unit_grads_[unit] = Tensor();
}

// Units in the order forward() acquires them: embeddings, layers, final norm
// (+ untied head), and the embeddings again for tied logits; a pipeline stage
// only its own.
std::vector<int> GptModel::forward_order(int chunk) const {
  std::vector<int> o;
  if (embeds(chunk)) o.push_back(0);
  for (int l = layout_.chunks[chunk].begin; l < layout_.chunks[chunk].end; ++l) o.push_back(l + 1);
  if (!has_head(chunk)) return o;
  o.push_back(d_.L + 1);
  if (!d_.untied) o.push_back(0);
  return o;
}

// backward(): tied logits (embeddings), final norm (+ head), layers in reverse.
// The embedding backward needs no parameters, but for project_in's.
std::vector<int> GptModel::backward_order(int chunk) const {
  std::vector<int> o;
  if (has_head(chunk)) {
    if (!d_.untied) o.push_back(0);
    o.push_back(d_.L + 1);
  }
  for (int l = layout_.chunks[chunk].end - 1; l >= layout_.chunks[chunk].begin; --l) o.push_back(l + 1);
  if (embeds(chunk) && d_.projects()) o.push_back(0);
  return o;
}

void GptModel::init_weights(uint64_t seed, float std) {
  // Only this rank's slices and stage (param_init.h), and of those only what
  // the store keeps (a ZeRO-3 partition).
  store_->init_params(layout_.total, [&](int64_t begin, int64_t end, float* out) {
    init_params(cfg_, layout_, seed, std, out, begin, end);
  });
}

// One activation set: this stage's residual streams and layers (and the
// final norm / logits on the last stage).
void GptModel::alloc_act_set(ActSet& s, int64_t B, int64_t T) {
  const int64_t C = d_.C, Tl = local_seq(T), N = B * T, Nl = B * Tl;
  auto f32 = [&](Shape sh) { return Tensor::empty(sh, DType::F32, dev_); };
  auto act = [&](Shape sh) { return Tensor::empty(sh, compute_, dev_); };
  s.resid.assign(d_.L + 1, Tensor());
  s.acts.assign(d_.L, LayerActs{});
  for (const auto& c : layout_.chunks)
    for (int l = c.begin; l <= c.end; ++l) s.resid[l] = act({B, Tl, C});
  for (int l = layout_.first_layer; l < layout_.end_layer; ++l) {
    if (!layout_.holds_layer(l)) continue;
    if (full_recompute(l)) {
      s.acts[l] = scratch_;  // views of the shared scratch: nothing saved
      continue;
    }
    alloc_layer_acts(s.acts[l], B, T, !lp(l).is_moe());
    if (recompute_.kind == RecomputeConfig::Kind::Selective) s.acts[l].attn_out = scratch_.attn_out;
    if (!sp_.active()) s.acts[l].attn_seq = s.acts[l].attn_out;
  }
  if (layout_.first_stage() && d_.projects()) s.emb_in = act({B, T, d_.P});
  if (!layout_.last_stage()) return;
  if (d_.final_norm()) {
    s.final_out = act({Nl, C});
    s.final_mean = f32({Nl});
    s.final_rstd = f32({Nl});
  }
  if (d_.projects()) s.head_in = act({N, d_.P});
  s.logits = act({N, Vl_});
}

void GptModel::alloc_layer_acts(LayerActs& a, int64_t B, int64_t T, bool dense_mlp) {
  // Sequence parallel: the norms and the residual hold this rank's Nl rows.
  const int64_t C = d_.C, Cl = Cl_, Fl = Fl_, N = B * T, Nl = B * local_seq(T), F_in = d_.swiglu ? 2 * Fl : Fl;
  auto f32 = [&](Shape sh) { return Tensor::empty(sh, DType::F32, dev_); };
  auto act = [&](Shape sh) { return Tensor::empty(sh, compute_, dev_); };
  a.norm1_out = act({Nl, C});
  a.norm1_mean = f32({Nl});
  a.norm1_rstd = f32({Nl});
  const int64_t Ta = T * sp_.size;  // attention sees the whole sequence (Ulysses)
  a.qkv = act({B, Ta, QKVa_});
  if (d_.rope) a.qkv_pre = act({B, Ta, QKVa_});
  if (recompute_.kind != RecomputeConfig::Kind::Selective) a.attn_out = act({B, Ta, Ca_});
  a.attn_seq = sp_.active() ? act({B, T, Cl}) : a.attn_out;
  a.lse = f32({B, NHa_, Ta});
  a.resid_mid = act({Nl, C});
  (d_.post_norm ? a.resid_out : a.norm2_out) = act({Nl, C});
  a.norm2_mean = f32({Nl});
  a.norm2_rstd = f32({Nl});
  if (!dense_mlp) return;  // an MoE layer sizes its own (MoeActs) in each forward
  a.fc_out = act({N, F_in});
  a.act_out = act({N, Fl});
  if (!act_quant_.bits.empty()) a.attn_q = act({B, T, Cl});
}

void GptModel::ensure_acts(int64_t B, int64_t T) {
  if (B == B_ && T == T_ && static_cast<int>(sets_.size()) == n_slots_) return;
  DS_USER_CHECK(T * sp_.size <= d_.maxT || d_.rope, "sequence length {} exceeds max_position_embeddings {}",
                T * sp_.size, d_.maxT);
  DS_USER_CHECK(!tp_.sp() || T % tp_.size == 0,
                "sequence parallelism: sequence length {} is not divisible by tensor_model_parallel_size {}", T,
                tp_.size);
  B_ = B;
  T_ = T;
  // Replicated widths C; this rank's slices Cl (heads), Fl (FFN), Vl (vocab).
  const int64_t C = d_.C, Cl = Cl_, Fl = Fl_, N = B * T, F_in = d_.swiglu ? 2 * Fl : Fl;
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
  sets_.assign(n_slots_, ActSet{});
  alloc_recompute_scratch(B, T);
  for (ActSet& s : sets_) alloc_act_set(s, B, T);
  losses_ = f32({N});
  if (tp_.active()) {
    ce_max_ = f32({N});
    ce_stats_ = f32({2, N});
  }
  dresid_ = act({B * local_seq(T), C});
  dnorm_ = act({N, C});
  alloc_sp_buffers(B, T);
  dqkv_ = act({B, T, QKVl_});
  alloc_kv_grad_buffers();
  dattn_ = act({B, T, Cl});
  dattn_a_ = dattn_;
  dqkv_a_ = dqkv_;
  if (sp_.active()) {  // Ulysses: local qkv, attention-side gradients, exchange buffers
    const int64_t Ta = T * sp_.size;
    uly_qkv_ = act({B, T, QKVl_});
    dattn_a_ = act({B, Ta, Ca_});
    dqkv_a_ = act({B, Ta, QKVa_});
    uly_.send = act({B * Ta * std::max(QKVa_, Ca_)});
    uly_.recv = act({B * Ta * std::max(QKVa_, Ca_)});
    uly_.acc = act({N, d_.HS});
    uly_.tmp = act({N, d_.HS});
  }
  dfc_ = act({N, F_in});
  dact_ = fused_gelu_mlp() ? Tensor() : act({N, Fl});  // the fused backward writes dfc_ directly
  dpost_ = d_.post_norm ? act({N, C}) : Tensor();
  if (d_.projects()) {
    no_rows_ = Tensor::empty({0, C}, compute_, dev_);
    emb_pos_ = act({B, T, C});
    demb_in_ = act({B, T, d_.P});
    dhead_in_ = act({N, d_.P});
  }
  ltd_x_ = ltd_.layers.empty() ? Tensor() : act({N * C});
  ltd_y_ = ltd_.layers.empty() ? Tensor() : act({N * C});
}

void GptModel::norm_forward(const NormParams& norm, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, const Tensor& inp) {
  if (d_.rmsnorm) {
    ops::rmsnorm_forward(
        {.out = out, .rstd = rstd, .inp = rows(inp), .weight = w(norm.weight), .eps = cfg_.norm_eps}, stream_);
  } else {
    ops::layernorm_forward({.out = out,
                            .mean = mean,
                            .rstd = rstd,
                            .inp = rows(inp),
                            .weight = w(norm.weight),
                            .bias = w(norm.bias),
                            .eps = cfg_.norm_eps},
                           stream_);
  }
}

void GptModel::dropout_add_norm(const NormParams& norm, const Tensor& sum, const Tensor& inp,
                                const Tensor& residual, const DropoutSpec& d, const Tensor& out,
                                const Tensor& mean, const Tensor& rstd) {
  if (d.p != 0.f) {
    dropout_add(sum, inp, residual, d);
    norm_forward(norm, out, mean, rstd, sum);
    return;
  }
  // Same bits as add + norm on the CPU (the op's CPU version is that sequence).
  const Tensor s = rows(sum);
  ops::add_norm_forward({.sum = s,
                         .out = out,
                         .mean = d_.rmsnorm ? Tensor() : mean,
                         .rstd = rstd,
                         .a = rows(inp),
                         .b = rows(residual),
                         .weight = w(norm.weight),
                         .bias = d_.rmsnorm ? Tensor() : w(norm.bias),
                         .norm = d_.rmsnorm ? NormType::RMSNorm : NormType::LayerNorm,
                         .eps = cfg_.norm_eps},
                        stream_);
}

void GptModel::norm_backward(const NormParams& norm, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp, const Tensor& mean, const Tensor& rstd, Accum accum) {
  DS_CHECK(!tp_.sp() || accum == Accum::Add, "norm_backward: sequence parallelism accumulates");
  if (tp_.sp())
    sp_norm_backward(norm, dinp, dout, inp, mean, rstd);
  else
    norm_backward_op(norm, dinp, dout, inp, mean, rstd, dw(norm.weight), d_.rmsnorm ? Tensor() : dw(norm.bias),
                     accum);
}

void GptModel::norm_backward_op(const NormParams& norm, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                                const Tensor& mean, const Tensor& rstd, const Tensor& dweight, const Tensor& dbias,
                                Accum accum) {
  if (d_.rmsnorm) {
    ops::rmsnorm_backward({.dinp = dinp,
                           .dweight = dweight,
                           .dout = dout,
                           .inp = rows(inp),
                           .weight = w(norm.weight),
                           .rstd = rstd,
                           .accum = accum},
                          stream_);
  } else {
    ops::layernorm_backward({.dinp = dinp,
                             .dweight = dweight,
                             .dbias = dbias,
                             .dout = dout,
                             .inp = rows(inp),
                             .weight = w(norm.weight),
                             .mean = mean,
                             .rstd = rstd,
                             .accum = accum},
                            stream_);
  }
}

// Dropout keys use global indices: sample first_sample + b, position
// tp_rank * T/TP + t on a sequence-parallel shard (plus sp_rank * T/U with
// Ulysses, whose attention sees every position), head tp_rank * NH/TP +
// sp_rank * NHa + h, so every layout drops what the single process drops.
// A key with a `step` tensor leaves the iteration and the first sample to the
// ops, which read them from it (dropout_key below; DropoutSpec::step_key).
DropoutSpec GptModel::dropout_spec(float p, int layer, DropoutSite site, int64_t pos0, int64_t head0) {
  const DropoutKey& k = S().key;
  if (!k.train || p == 0.f) return {};
  const bool by_value = !k.step.defined();
  return {.p = p,
          .stream = by_value ? dropout_stream(k.seed, k.iteration, layer, site) : 0,
          .sample0 = by_value ? k.first_sample : 0,
          .pos0 = pos0,
          .head0 = head0,
          .seed = k.seed,
          .layer = layer,
          .site = site};
}

DropoutSpec GptModel::hidden_dropout(int layer, DropoutSite site) {
  const float p = site == DropoutSite::Embedding && cfg_.embedding_dropout >= 0 ? cfg_.embedding_dropout
                                                                                 : cfg_.hidden_dropout;
  return dropout_spec(p, layer, site, sp_.rank * T_ + (tp_.sp() ? tp_.rank * local_seq(T_) : 0), 0);
}

DropoutSpec GptModel::attention_dropout(int layer) {
  return dropout_spec(cfg_.attention_dropout, layer, DropoutSite::AttentionProbs, 0, tp_.rank * NHl_ + sp_.rank * NHa_);
}

Tensor GptModel::dropout_key(const DropoutSpec& d) { return d.p != 0.f ? S().key.step : Tensor(); }

void GptModel::dropout_add(const Tensor& out, const Tensor& inp, const Tensor& residual, const DropoutSpec& d) {
  if (d.p == 0.f) {
    ops::add({.out = out, .a = inp, .b = residual}, stream_);
    return;
  }
  auto bt = [&](const Tensor& t) { return t.defined() ? t.reshape({B_, local_seq(T_), d_.C}) : t; };
  ops::dropout_forward(
      {.out = bt(out), .inp = bt(inp), .residual = bt(residual), .dropout = d, .dropout_key = dropout_key(d)},
      stream_);
}

// The gradient goes into dnorm_, which is free wherever this is called (before
// a row-parallel linear's backward and before the embedding backward).
Tensor GptModel::dropout_grad(const Tensor& dy, const DropoutSpec& d) {
  if (d.p == 0.f) return dy;
  const Shape s{B_, local_seq(T_), d_.C};
  const Tensor dx = dnorm_.view(0, {B_ * local_seq(T_), d_.C});
  ops::dropout_backward(
      {.out = dx.reshape(s), .inp = dy.reshape(s), .residual = Tensor(), .dropout = d, .dropout_key = dropout_key(d)},
      stream_);
  return dx;
}

// Tensor parallel: qkv and fc are column-parallel (copy_to_tp on their
// input), attention runs on this rank's NHl heads, attn.proj and mlp.proj are
// row-parallel (reduce_from_tp on their output). Their replicated bias is
// added by tp rank 0 only, before the all-reduce, so the sum holds it once.
void GptModel::layer_forward(int l, const Tensor& x, const Tensor& y, const Tensor& x_residual, ResidualAdd add) {
  LayerActs& a = S().acts[l];
  const LayerParams& P = lp(l);
  const bool row_bias = tp_.rank == 0;
  if (d_.post_norm) {  // the attention reads x itself (post-norm blocks never leave their add to the next norm)
    DS_CHECK(!x_residual.defined(), "post-norm layer {}: a pending residual add", l);
  } else if (x_residual.defined()) {  // the previous layer's closing add, fused with this norm1
    dropout_add_norm(P.norm1, x, x, x_residual, DropoutSpec{}, a.norm1_out, a.norm1_mean, a.norm1_rstd);
  } else {
    norm_forward(P.norm1, a.norm1_out, a.norm1_mean, a.norm1_rstd, x);
  }
  Tensor qkv_lin = d_.rope ? a.qkv_pre : a.qkv;  // (B, U*T, QKVa): the attention's heads
  quantize_input(l, 0, a.norm1_out);
  ops::matmul_forward({.out = rows(sp_.active() ? uly_qkv_ : qkv_lin),
                       .inp = enter_tp(attn_input(a, x)),
                       .weight = w(P.attn.qkv.weight),
                       .bias = opt(P.attn.qkv.bias, false)},
                      stream_);
  if (sp_.active()) ulysses_seq_to_heads(sp_, qkv_split_, B_, uly_qkv_, qkv_lin, uly_, stream_);
  const int nh = static_cast<int>(NHa_), nkv = static_cast<int>(NKVa_);
  if (d_.rope)
    ops::rope_forward({.out = a.qkv, .inp = a.qkv_pre, .NH = nh, .pos_offset = 0, .theta = cfg_.rope_theta,
                       .NKV = nkv, .rot_dims = d_.rot},
                      stream_);
  const DropoutSpec drop = attention_dropout(l);
  ops::attention_forward({.out = a.attn_out,
                          .lse = a.lse,
                          .qkv = a.qkv,
                          .NH = nh,
                          .NKV = nkv,
                          .dropout = drop,
                          .dropout_key = dropout_key(drop),
                          .lengths = S().lengths},
                         stream_);
  if (sp_.active()) ulysses_heads_to_seq(sp_, out_split_, B_, a.attn_out, a.attn_seq, uly_, stream_);
  if (quantizes(l, 1)) {  // a copy: the attention's backward reads its own output
    ops::cast({.out = rows(a.attn_q), .inp = rows(a.attn_seq)}, stream_);
    quantize_input(l, 1, a.attn_q);
  }
  ops::matmul_forward({.out = exit_tp_target(a.resid_mid),
                       .inp = proj_input(l, a),
                       .weight = w(P.attn.proj.weight),
                       .bias = row_bias ? opt(P.attn.proj.bias, false) : Tensor()},
                      stream_);
  exit_tp(a.resid_mid);
  if (d_.post_norm) {  // x1 = norm1(x + attn), y = norm2(x1 + mlp(x1))
    dropout_add_norm(P.norm1, a.resid_mid, a.resid_mid, rows(x), hidden_dropout(l, DropoutSite::AttentionOut),
                     a.norm1_out, a.norm1_mean, a.norm1_rstd);
    mlp_forward(l, a, a.resid_out, ResidualAdd::InLayer);
    norm_forward(P.norm2, rows(y), a.norm2_mean, a.norm2_rstd, a.resid_out);
    return;
  }
  dropout_add_norm(P.norm2, a.resid_mid, a.resid_mid, rows(x), hidden_dropout(l, DropoutSite::AttentionOut),
                   a.norm2_out, a.norm2_mean, a.norm2_rstd);
  if (P.is_moe())
    moe_forward(l, a, y, add);
  else
    mlp_forward(l, a, y, add);
}

Tensor GptModel::attn_input(const LayerActs& a, const Tensor& x) const {
  return d_.post_norm ? rows(x) : a.norm1_out;
}

// y = resid_mid + dropout(proj(act(fc(norm2_out)))) (with add InNextNorm,
// y = proj(...) only: the next norm adds resid_mid); post-norm blocks read
// and add norm1_out instead (mlp_input, mlp_residual). fc_out holds the
// pre-activation either way (the fused op's `pre`), act_out the activation.
void GptModel::mlp_forward(int l, LayerActs& a, const Tensor& y, ResidualAdd add) {
  const LayerParams& P = lp(l);
  const bool row_bias = tp_.rank == 0;
  quantize_input(l, 2, mlp_input(a));
  if (fused_gelu_mlp()) {
    ops::matmul_bias_gelu_forward({.out = a.act_out,
                                   .pre = a.fc_out,
                                   .inp = enter_tp(mlp_input(a)),
                                   .weight = w(P.mlp.fc.weight),
                                   .bias = opt(P.mlp.fc.bias, false)},
                                  stream_);
  } else {
    ops::matmul_forward({.out = a.fc_out,
                         .inp = enter_tp(mlp_input(a)),
                         .weight = w(P.mlp.fc.weight),
                         .bias = opt(P.mlp.fc.bias, false)},
                        stream_);
    if (d_.swiglu) {
      ops::swiglu_forward({.out = a.act_out, .inp = a.fc_out}, stream_);
    } else if (d_.relu) {
      ops::relu_forward({.out = a.act_out, .inp = a.fc_out, .dout = Tensor()}, stream_);
    } else {
      ops::gelu_forward({.out = a.act_out, .inp = a.fc_out, .dout = Tensor()}, stream_);
    }
  }
  Tensor y2 = rows(y);
  quantize_input(l, 3, a.act_out);
  ops::matmul_forward({.out = exit_tp_target(y2),
                       .inp = a.act_out,
                       .weight = w(P.mlp.proj.weight),
                       .bias = row_bias ? opt(P.mlp.proj.bias, false) : Tensor()},
                      stream_);
  exit_tp(y2);
  if (add == ResidualAdd::InLayer) dropout_add(y2, y2, mlp_residual(a), hidden_dropout(l, DropoutSite::MlpOut));
}

ResidualAdd GptModel::closing_add(int l, int chunk) {
  // A dropping layer (random-LTD) reads a complete input and writes a complete output.
  if (ltd_active(l) || ltd_active(l + 1) || d_.post_norm) return ResidualAdd::InLayer;
  const bool next_norm_here = l + 1 < layout_.chunks[chunk].end || has_head(chunk);
  const bool no_dropout = hidden_dropout(l, DropoutSite::MlpOut).p == 0.f;
  return next_norm_here && no_dropout ? ResidualAdd::InNextNorm : ResidualAdd::InLayer;
}

// The MLP branch's backward down to dnorm_ (the gradient of norm2_out).
// Fused GELU: proj's weight/bias gradients, then dfc_ = (dy @ W_proj) *
// gelu'(fc_out) with fc's bias gradient in one op, then fc's weight gradient
// and input gradient (fc's bias gradient already done).
void GptModel::mlp_backward(int l, LayerActs& a, const Tensor& dresid) {
  const LayerParams& P = lp(l);
  const bool fused = fused_gelu_mlp();
  const Tensor dy = exit_tp_backward(dropout_grad(dresid, hidden_dropout(l, DropoutSite::MlpOut)));
  ops::matmul_backward({.dinp = fused ? Tensor() : dact_,
                        .dweight = weight_grad(l, P.mlp.proj.weight, dy, a.act_out),
                        .dbias = opt(P.mlp.proj.bias, true),
                        .dout = dy,
                        .inp = a.act_out,
                        .weight = w(P.mlp.proj.weight),
                        .accum = Accum::Overwrite},
                       stream_);
  if (fused) {
    ops::matmul_dgelu_bgrad({.dinp = dfc_,
                             .dbias = opt(P.mlp.fc.bias, true),
                             .dout = dy,
                             .weight = w(P.mlp.proj.weight),
                             .pre = a.fc_out},
                            stream_);
  } else if (d_.swiglu) {
    ops::swiglu_backward({.dinp = dfc_, .dout = dact_, .inp = a.fc_out}, stream_);
  } else if (d_.relu) {
    ops::relu_backward({.out = dfc_, .inp = a.fc_out, .dout = dact_}, stream_);
  } else {
    ops::gelu_backward({.out = dfc_, .inp = a.fc_out, .dout = dact_}, stream_);
  }
  const Tensor fc_in = enter_tp(mlp_input(a));
  ops::matmul_backward({.dinp = dnorm_,
                        .dweight = weight_grad(l, P.mlp.fc.weight, dfc_, fc_in),
                        .dbias = fused ? Tensor() : opt(P.mlp.fc.bias, true),
                        .dout = dfc_,
                        .inp = fc_in,
                        .weight = w(P.mlp.fc.weight),
                        .accum = Accum::Overwrite},
                       stream_);
}

void GptModel::layer_backward(int l, const Tensor& x, const Tensor& dresid) {
  if (d_.post_norm) return post_norm_layer_backward(l, x, dresid);
  LayerActs& a = S().acts[l];
  const LayerParams& P = lp(l);
  if (P.is_moe()) {
    norm_backward(P.norm2, dresid, moe_backward(l, a, dresid), a.resid_mid, a.norm2_mean, a.norm2_rstd);
  } else {
    mlp_backward(l, a, dresid);
    norm_backward(P.norm2, dresid, enter_tp_backward(dnorm_), a.resid_mid, a.norm2_mean, a.norm2_rstd);
  }
  attention_branch_backward(l, a, x, dresid);
  norm_backward(P.norm1, dresid, enter_tp_backward(dnorm_), x, a.norm1_mean, a.norm1_rstd);
}

// y = norm2(r), r = x1 + dropout(mlp(x1)), x1 = norm1(m), m = x + dropout(attn(x)):
// dresid goes in as dy and comes out as dx.
void GptModel::post_norm_layer_backward(int l, const Tensor& x, const Tensor& dresid) {
  LayerActs& a = S().acts[l];
  const LayerParams& P = lp(l);
  norm_backward(P.norm2, dpost_, dresid, a.resid_out, a.norm2_mean, a.norm2_rstd, Accum::Overwrite);  // dr
  mlp_backward(l, a, dpost_);
  ops::add({.out = dpost_, .a = dpost_, .b = enter_tp_backward(dnorm_)}, stream_);  // dx1: the residual + the MLP
  norm_backward(P.norm1, dresid, dpost_, a.resid_mid, a.norm1_mean, a.norm1_rstd, Accum::Overwrite);  // dm
  attention_branch_backward(l, a, x, dresid);
  ops::add({.out = dresid, .a = dresid, .b = enter_tp_backward(dnorm_)}, stream_);  // dx: the residual + attention
}

void GptModel::attention_branch_backward(int l, LayerActs& a, const Tensor& x, const Tensor& dresid) {
  const LayerParams& P = lp(l);
  const Tensor dproj = exit_tp_backward(dropout_grad(dresid, hidden_dropout(l, DropoutSite::AttentionOut)));
  ops::matmul_backward({.dinp = rows(dattn_),
                        .dweight = weight_grad(l, P.attn.proj.weight, dproj, proj_input(l, a)),
                        .dbias = opt(P.attn.proj.bias, true),
                        .dout = dproj,
                        .inp = proj_input(l, a),
                        .weight = w(P.attn.proj.weight),
                        .accum = Accum::Overwrite},
                       stream_);
  if (sp_.active()) ulysses_seq_to_heads(sp_, out_split_, B_, dattn_, dattn_a_, uly_, stream_);
  const int nh = static_cast<int>(NHa_), nkv = static_cast<int>(NKVa_);
  const DropoutSpec drop = attention_dropout(l);
  ops::attention_backward({.dqkv = dqkv_a_,
                           .dout = dattn_a_,
                           .out = a.attn_out,
                           .lse = a.lse,
                           .qkv = a.qkv,
                           .NH = nh,
                           .NKV = nkv,
                           .dropout = drop,
                           .dropout_key = dropout_key(drop),
                           .lengths = S().lengths},
                          stream_);
  if (d_.rope)
    ops::rope_backward({.out = dqkv_a_, .inp = dqkv_a_, .NH = nh, .pos_offset = 0, .theta = cfg_.rope_theta,
                        .NKV = nkv, .rot_dims = d_.rot},
                       stream_);
  // Ulysses: back to the sequence shard; replicated kv heads sum their replicas.
  if (sp_.active()) ulysses_heads_to_seq(sp_, qkv_split_, B_, dqkv_a_, dqkv_, uly_, stream_);
  // Replicated kv heads: this rank's qkv gradients go to a scratch first
  // (their kv rows are partial sums, completed over tp by sum_shared_kv_grads).
  const bool kv_shared = kv_dw_.defined();
  if (kv_shared) {
    kv_dw_.zero_();
    if (kv_db_.defined()) kv_db_.zero_();
  }
  // (Replicated kv heads: their gradients are summed over tp right here, so
  // the qkv weight gradient is never deferred.)
  const Tensor qkv_in = enter_tp(attn_input(a, x));
  ops::matmul_backward({.dinp = dnorm_,
                        .dweight = kv_shared ? kv_dw_ : weight_grad(l, P.attn.qkv.weight, rows(dqkv_), qkv_in),
                        .dbias = kv_shared ? kv_db_ : opt(P.attn.qkv.bias, true),
                        .dout = rows(dqkv_),
                        .inp = qkv_in,
                        .weight = w(P.attn.qkv.weight),
                        .accum = Accum::Overwrite},
                       stream_);
  if (kv_shared) sum_shared_kv_grads(P.attn);
}

// A pipeline stage runs only its layers: the first embeds the tokens, the
// others start from the received S().resid[first_layer]; the last adds the
// final norm and the logits.
void GptModel::forward(const Tensor& tokens, int chunk) {
  ensure_acts(tokens.size(0), tokens.size(1));
  if (chunk == 0) draw_random_ltd(S());
  const int last = d_.L + 1;
  if (embeds(chunk)) {
    use_params(0);
    if (d_.projects()) {
      projected_embedding_forward(tokens);
    } else {
      // Vocab-parallel: each rank embeds the tokens it owns (zeros elsewhere);
      // the replicated wpe is added by tp rank 0 only; the all-reduce sums both.
      Tensor wpe = tp_.rank == 0 ? opt(layout_.embed.wpe, false) : Tensor();
      Tensor emb = exit_tp_target(rows(S().resid[0])).reshape({B_, T_, d_.C});
      ops::embedding_forward(
          {.out = emb,
           .tokens = tokens,
           .wte = w(layout_.embed.wte),
           .wpe = wpe,
           .vocab_start = vocab_start_,
           .pos_offset = sp_.rank * T_,  // Ulysses: global positions
           .row_offset = d_.pos_offset,
           .lengths = S().lengths,
           .pad_row = d_.pos_offset - 1,
           .shifts = S().shifts},
          stream_);
      exit_tp(rows(S().resid[0]));
    }
    const DropoutSpec d = hidden_dropout(-1, DropoutSite::Embedding);
    if (d.p != 0.f) dropout_add(rows(S().resid[0]), rows(S().resid[0]), Tensor(), d);
    drop_params(0);
  }
  // pending: the residual (a layer's resid_mid) that the next norm still adds.
  Tensor pending;
  for (int l = layout_.chunks[chunk].begin; l < layout_.chunks[chunk].end; ++l) {
    use_params(l + 1);
    const ResidualAdd add = closing_add(l, chunk);
    if (ltd_active(l))
      ltd_layer_forward(l);  // pending is empty: the layer before closed its own add
    else
      layer_forward(l, S().resid[l], S().resid[l + 1], pending, add);
    if (full_recompute(l)) S().acts[l].moe = MoeActs{};  // an MoE layer's too are recomputed before its backward
    pending = add == ResidualAdd::InNextNorm ? S().acts[l].resid_mid : Tensor();
    drop_params(l + 1);
  }
  if (!has_head(chunk)) return;
  use_params(last);
  if (pending.defined())
    dropout_add_norm(layout_.head.final_norm, S().resid[d_.L], S().resid[d_.L], pending, DropoutSpec{}, S().final_out,
                     S().final_mean, S().final_rstd);
  else if (d_.final_norm())
    norm_forward(layout_.head.final_norm, S().final_out, S().final_mean, S().final_rstd, S().resid[d_.L]);
  if (d_.projects())
    ops::matmul_forward({.out = S().head_in, .inp = final_output(), .weight = w(layout_.head.project_out),
                         .bias = Tensor()},
                        stream_);
  if (!d_.untied) {
    drop_params(last);
    use_params(0);
  }
  Tensor head = d_.untied ? w(layout_.head.head) : w(layout_.embed.wte);  // this rank's vocab rows
  ops::matmul_forward({.out = S().logits, .inp = enter_tp(head_input()), .weight = head, .bias = Tensor()}, stream_);
  drop_params(d_.untied ? last : 0);
}

Tensor GptModel::final_output() { return d_.final_norm() ? S().final_out : rows(S().resid[d_.L]); }

Tensor GptModel::head_input() { return d_.projects() ? S().head_in : final_output(); }

// resid[0] = project_in(wte[tokens]) + the positions (learned positions as
// embedding_forward adds them: an empty token table leaves the positions alone).
void GptModel::projected_embedding_forward(const Tensor& tokens) {
  DS_CHECK(!tp_.active() && !sp_.active(), "a projected embedding runs on one tensor- and sequence-parallel rank");
  ops::embedding_forward({.out = S().emb_in, .tokens = tokens, .wte = w(layout_.embed.wte), .wpe = Tensor()},
                         stream_);
  ops::matmul_forward({.out = rows(S().resid[0]), .inp = rows(S().emb_in), .weight = w(layout_.embed.project_in),
                       .bias = Tensor()},
                      stream_);
  if (!layout_.embed.wpe.defined()) return;
  ops::embedding_forward({.out = emb_pos_,
                          .tokens = tokens,
                          .wte = no_rows_,
                          .wpe = w(layout_.embed.wpe),
                          .row_offset = d_.pos_offset,
                          .lengths = S().lengths,
                          .pad_row = d_.pos_offset - 1,
                          .shifts = S().shifts},
                         stream_);
  ops::add({.out = rows(S().resid[0]), .a = rows(S().resid[0]), .b = rows(emb_pos_)}, stream_);
}

void GptModel::projected_embedding_backward(const Tensor& tokens, const Tensor& demb) {
  if (layout_.embed.wpe.defined())
    ops::embedding_backward({.dwte = Tensor::empty({0, d_.C}, dw(layout_.embed.wpe).dtype(), dev_),
                             .dwpe = dw(layout_.embed.wpe),
                             .dout = demb,
                             .tokens = tokens,
                             .row_offset = d_.pos_offset,
                             .lengths = S().lengths,
                             .pad_row = d_.pos_offset - 1,
                             .shifts = S().shifts},
                            stream_);
  use_params(0);  // project_in's input gradient needs its weight
  ops::matmul_backward({.dinp = rows(demb_in_),
                        .dweight = dw(layout_.embed.project_in),
                        .dbias = Tensor(),
                        .dout = rows(demb),
                        .inp = rows(S().emb_in),
                        .weight = w(layout_.embed.project_in),
                        .accum = Accum::Overwrite},
                       stream_);
  drop_params(0);
  ops::embedding_backward({.dwte = dw(layout_.embed.wte), .dout = demb_in_, .tokens = tokens}, stream_);
}

float GptModel::loss_and_dlogits(const Tensor& tokens, const Tensor& targets, float loss_weight, bool backward,
                                 bool to_sink) {
  if (head_loss_) {
    DS_CHECK(!dloss_scale_.defined(), "a head loss with a device-side loss scale (a captured fp16 step)");
    const double loss = head_loss_->apply(S().logits, tokens, targets, loss_weight, backward);
    if (!(to_sink && loss_sink_.defined())) return static_cast<float>(loss);
    if (loss_sink_weight_ != 0.f) {
      float v = static_cast<float>(loss_sink_weight_ * loss);
      const Tensor h = Tensor::from_blob(&v, {1}, DType::F32);
      ops::add({.out = loss_sink_, .a = loss_sink_, .b = dev_.is_cpu() ? h : h.to(dev_)}, stream_);
    }
    return NAN;
  }
  DS_CHECK(!d_.value_head, "a value-head model has no loss of its own; set a head loss (GptModel::set_head_loss)");
  Tensor t = targets.reshape({targets.numel()});
  const int64_t n = t.numel();
  // One rule on every backend and layout: a target < 0 is ignored, one >= V
  // is an error. The CPU op checks it; a kernel cannot throw, so a loss that
  // is read back (no sink) checks the targets on the host, and a sink's
  // producer guarantees it (forward_backward).
  const bool deferred = to_sink && loss_sink_.defined();
  Tensor tg;
  if (!deferred) {
    tg = t.device().is_cpu() ? t : t.to(Device::cpu());
    for (int64_t i = 0; i < n; ++i)
      DS_CHECK(tg.data<int32_t>()[i] < d_.V, "cross_entropy: target {} at row {} is >= V={}", tg.data<int32_t>()[i],
               i, d_.V);
  }
  if (tp_.active())
    vocab_parallel_loss(t, loss_weight, backward);
  else
    ops::cross_entropy({.losses = losses_,
                        .dlogits = backward ? S().logits : Tensor(),
                        .logits = S().logits,
                        .targets = t,
                        .V = d_.V,
                        .dloss = loss_weight,
                        .dloss_scale = dloss_scale_},
                       stream_);
  if (deferred) {  // stream-ordered, no host wait
    if (loss_sink_weight_ != 0.f)
      ops::masked_mean({.out = loss_sink_, .losses = losses_.view(0, {n}), .targets = t, .weight = loss_sink_weight_},
                       stream_);
    return NAN;
  }
  Tensor l = losses_.device().is_cpu() ? losses_ : losses_.to(Device::cpu());
  return mean_loss(l.view(0, {n}), tg);
}

float GptModel::mean_loss(const Tensor& losses, const Tensor& targets) {
  float mean = 0.f;  // out += 1 * mean: exactly the mean, 0 when no row counts
  ops::masked_mean({.out = Tensor::from_blob(&mean, {1}, DType::F32), .losses = losses, .targets = targets},
                   Stream{});
  return mean;
}

void GptModel::set_loss_sink(const Tensor& sink, float weight) {
  DS_CHECK(!sink.defined() || (sink.dtype() == DType::F32 && sink.device() == dev_ && sink.numel() == 1),
           "loss sink: expected one f32 element on the model's device, got {} {}", dtype_name(sink.dtype()),
           shape_str(sink.shape()));
  loss_sink_ = sink;
  loss_sink_weight_ = weight;
}

void GptModel::abandon_pass() {
  for (Tensor& t : unit_params_) t = Tensor();
  for (Tensor& t : unit_grads_) t = Tensor();
  lora_w_.clear();
  lora_dw_.clear();
  store_->abandon_pass();
}

void GptModel::set_dloss_scale(const Tensor& scale) {
  DS_CHECK(!scale.defined() || (scale.dtype() == DType::F32 && scale.device() == dev_ && scale.numel() == 1 &&
                                !tp_.active()),
           "dloss scale: expected one f32 element on the model's device without a vocab-parallel loss, got {} {}",
           dtype_name(scale.dtype()), shape_str(scale.shape()));
  dloss_scale_ = scale;
}

// Vocab-parallel cross-entropy: the logits stay split; only per-row
// statistics cross ranks (max, then sum of exp and the target's logit).
void GptModel::vocab_parallel_loss(const Tensor& t, float loss_weight, bool backward) {
  VocabParallelCEArgs a;
  a.logits = S().logits;
  a.targets = t;
  a.rowmax = ce_max_;
  a.stats = ce_stats_;
  a.vocab_start = vocab_start_;
  a.V = d_.V;
  a.dloss = loss_weight;
  a.phase = VocabCEPhase::Max;
  ops::vocab_parallel_cross_entropy(a, stream_);
  all_reduce_max_tp(tp_, ce_max_);
  a.phase = VocabCEPhase::Stats;
  ops::vocab_parallel_cross_entropy(a, stream_);
  tp_.comm->all_reduce(ce_stats_, ReduceOp::Sum);
  a.phase = VocabCEPhase::Finish;
  a.losses = losses_;
  if (backward) a.dlogits = S().logits;
  ops::vocab_parallel_cross_entropy(a, stream_);
}

// Last stage: logits -> final norm, leaving the residual gradient in dresid_.
// A tied wte gradient stays acquired until the embedding backward when this
// stage also embeds (pp = 1); otherwise it is complete here.
void GptModel::head_backward() {
  const int last = d_.L + 1, head_unit = d_.untied ? last : 0;
  use_params(head_unit);
  use_grads(head_unit);
  Tensor head = d_.untied ? w(layout_.head.head) : w(layout_.embed.wte);
  Tensor dhead = d_.untied ? dw(layout_.head.head) : dw(layout_.embed.wte);
  ops::matmul_backward({.dinp = d_.projects() ? dhead_in_ : dnorm_,
                        .dweight = dhead,
                        .dbias = Tensor(),
                        .dout = S().logits,
                        .inp = enter_tp(head_input()),
                        .weight = head,
                        .accum = Accum::Overwrite},
                       stream_);
  if (!d_.untied) {
    drop_params(0);
    if (!layout_.first_stage()) grads_done(0);
    use_params(last);
    use_grads(last);
  }
  if (d_.projects())
    ops::matmul_backward({.dinp = dnorm_,
                          .dweight = dw(layout_.head.project_out),
                          .dbias = Tensor(),
                          .dout = dhead_in_,
                          .inp = final_output(),
                          .weight = w(layout_.head.project_out),
                          .accum = Accum::Overwrite},
                         stream_);
  Tensor dfinal = enter_tp_backward(dnorm_);
  if (d_.final_norm()) {
    dresid_.zero_();
    norm_backward(layout_.head.final_norm, dresid_, dfinal, S().resid[d_.L], S().final_mean, S().final_rstd);
  } else {
    dresid_.copy_from(dfinal);
  }
  drop_params(last);
  grads_done(last);
}

void GptModel::backward(const Tensor& tokens, const Tensor& dout, int chunk) {
  if (has_head(chunk))
    head_backward();
  else
    dresid_.copy_from(dout);
  for (int l = layout_.chunks[chunk].end - 1; l >= layout_.chunks[chunk].begin; --l) {
    use_params(l + 1);
    use_grads(l + 1);
    if (ltd_active(l)) {
      ltd_layer_backward(l);
    } else {
      recompute_before_backward(l);
      layer_backward(l, S().resid[l], dresid_);
    }
    drop_params(l + 1);
    grads_done(l + 1);
  }
  if (!embeds(chunk)) return;
  use_grads(0);
  // Every rank: the same (replicated) wpe gradient (sequence parallel: gathered).
  Tensor demb = exit_tp_backward(dropout_grad(dresid_, hidden_dropout(-1, DropoutSite::Embedding))).reshape({B_, T_, d_.C});
  if (d_.projects()) {
    projected_embedding_backward(tokens, demb);
    grads_done(0);
    return;
  }
  ops::embedding_backward({.dwte = dw(layout_.embed.wte),
                           .dwpe = opt(layout_.embed.wpe, true),
                           .dout = demb,
                           .tokens = tokens,
                           .vocab_start = vocab_start_,
                           .pos_offset = sp_.rank * T_,
                           .row_offset = d_.pos_offset,
                           .lengths = S().lengths,
                           .pad_row = d_.pos_offset - 1,
                           .shifts = S().shifts},
                          stream_);
  grads_done(0);
}

float GptModel::forward_backward(const Tensor& tokens, const Tensor& targets, float loss_weight,
                                 const DropoutKey& key) {
  cur_ = 0;
  std::vector<int> order = forward_order(), bwd = backward_order();
  order.insert(order.end(), bwd.begin(), bwd.end());
  store_->begin_pass(order);
  ensure_acts(tokens.size(0), tokens.size(1));
  S().key = key;
  S().lengths = lengths_;
  S().shifts = shifts_;
  forward(tokens);
  if (distill_.teacher) distill_into_dlogits(tokens, loss_weight, key);
  float loss = loss_and_dlogits(tokens, targets, loss_weight, true, /*to_sink=*/true);
  if (distill_.teacher) add_distill_grad();
  aux_grad_ = cfg_.moe.loss_coeff * loss_weight * static_cast<float>(tokens.numel());
  backward(tokens);
  store_->end_pass();
  return loss;
}

float GptModel::forward_loss(const Tensor& tokens, const Tensor& targets) {
  cur_ = 0;
  store_->begin_pass(forward_order());
  ensure_acts(tokens.size(0), tokens.size(1));
  S().key = DropoutKey{};  // evaluation: no dropout
  S().lengths = lengths_;
  S().shifts = shifts_;
  forward(tokens);
  store_->end_pass();
  return loss_and_dlogits(tokens, targets, 0.f, false);
}

Tensor GptModel::forward_logits(const Tensor& tokens, const DropoutKey& key) {
  DS_CHECK(layout_.first_stage() && layout_.last_stage(), "forward_logits: needs the whole model on this rank");
  cur_ = 0;
  store_->begin_pass(forward_order());
  ensure_acts(tokens.size(0), tokens.size(1));
  S().key = key;
  S().lengths = lengths_;
  S().shifts = shifts_;
  forward(tokens);
  store_->end_pass();
  return S().logits;
}

void GptModel::set_distillation(const Distill& d) {
  if (d.teacher) {
    DS_CHECK(!tp_.active() && layout_.first_stage() && layout_.last_stage() && sp_.size == 1,
             "distillation: the student must be whole on its rank (tensor, pipeline and Ulysses size 1)");
    DS_CHECK(d.teacher->dims().V == d_.V && d.teacher->Vl_ == Vl_ && d.teacher->device() == dev_ &&
                 d.teacher->compute_dtype() == compute_ && d.seq_length > 0,
             "distillation: the teacher's padded vocabulary {}, device and dtype must be the student's ({})",
             d.teacher->Vl_, Vl_);
  }
  distill_ = d;
}

void GptModel::set_kd_loss_sink(const Tensor& sink, float weight) {
  DS_CHECK(!sink.defined() || (sink.dtype() == DType::F32 && sink.device() == dev_ && sink.numel() == 1),
           "kd loss sink: expected one f32 element on the model's device, got {} {}", dtype_name(sink.dtype()),
           shape_str(sink.shape()));
  kd_sink_ = sink;
  kd_sink_weight_ = weight;
}

// Megatron-DeepSpeed's calculate_mos_loss, per micro-batch of B samples of
// T positions (T < seq_length under a curriculum):
//   kd = beta * temp^2 * sum_rows KL(p_t || p_s) / (B * seq_length)
// added to the micro-batch's loss. The lm loss's per-token weight loss_weight
// is the micro-batch mean's weight / (B * T), so d kd / d logits, with that
// weight, is loss_weight * T / seq_length * beta * temp * (p_s - p_t). The
// gradient goes into the teacher's logits buffer (add_distill_grad adds it
// once the lm loss has written dlogits over the student's logits).
void GptModel::distill_into_dlogits(const Tensor& tokens, float loss_weight, const DropoutKey& key) {
  const Distill& d = distill_;
  DropoutKey tkey = key;
  tkey.seed = d.seed;
  Tensor tl = d.teacher->forward_logits(tokens, tkey);
  const int64_t N = tokens.numel();
  if (!kd_losses_.defined() || kd_losses_.numel() != N) {
    kd_losses_ = Tensor::empty({N}, DType::F32, dev_);
    kd_rows_ = Tensor::zeros({N}, DType::I32, dev_);
  }
  const double t_over_s = static_cast<double>(tokens.size(1)) / static_cast<double>(d.seq_length);
  ops::kd_loss({.losses = kd_losses_,
                .dlogits = tl,
                .logits = S().logits,
                .teacher = tl,
                .V = d_.V,
                .temp = d.temp,
                .dscale = static_cast<float>(loss_weight * t_over_s * d.beta * d.temp)},
               stream_);
  if (kd_sink_.defined() && kd_sink_weight_ != 0.f)  // the mean over every row times B*T / (B*seq_length)
    ops::masked_mean({.out = kd_sink_,
                      .losses = kd_losses_,
                      .targets = kd_rows_,
                      .weight = static_cast<float>(kd_sink_weight_ * d.beta * d.temp * d.temp * t_over_s)},
                     stream_);
}

void GptModel::add_distill_grad() {
  const Tensor& g = distill_.teacher->S().logits;
  ops::add({.out = S().logits, .a = S().logits, .b = g}, stream_);
}

void GptModel::set_activation_slots(int n) {
  DS_CHECK(n >= 1, "activation slots {} < 1", n);
  n_slots_ = n;
  B_ = T_ = 0;  // reallocate on next use
}

Tensor GptModel::stage_input(int slot, int chunk, int64_t B, int64_t T) {
  ensure_acts(B, T);
  DS_CHECK(slot >= 0 && slot < n_slots_, "activation slot {} outside [0, {})", slot, n_slots_);
  return sets_[slot].resid[layout_.chunks.at(chunk).begin];
}

Tensor GptModel::stage_output(int slot, int chunk) {
  DS_CHECK(slot >= 0 && slot < static_cast<int>(sets_.size()), "activation slot {} not allocated", slot);
  return sets_[slot].resid[layout_.chunks.at(chunk).end];
}

float GptModel::stage_forward(int slot, int chunk, const Tensor& tokens, const Tensor& targets, float loss_weight,
                              bool backward, const DropoutKey& key) {
  ensure_acts(tokens.size(0), tokens.size(1));
  DS_CHECK(slot >= 0 && slot < n_slots_, "activation slot {} outside [0, {})", slot, n_slots_);
  cur_ = slot;
  S().key = key;
  S().lengths = lengths_;
  S().shifts = shifts_;
  if (backward) aux_grad_ = cfg_.moe.loss_coeff * loss_weight * static_cast<float>(tokens.numel());
  store_->begin_pass(forward_order(chunk));
  forward(tokens, chunk);
  store_->end_pass();
  return has_head(chunk) ? loss_and_dlogits(tokens, targets, loss_weight, backward, /*to_sink=*/backward) : 0.f;
}

void GptModel::stage_backward(int slot, int chunk, const Tensor& tokens, const Tensor& dout, bool defer_weights) {
  DS_CHECK(slot >= 0 && slot < static_cast<int>(sets_.size()), "activation slot {} not allocated", slot);
  DS_CHECK(!defer_weights || (lora_slots_.empty() && frozen_.empty()),
           "deferred weight gradients with LoRA or frozen parameters");
  cur_ = slot;
  if (defer_weights) deferred_.emplace_back();
  defer_weights_ = defer_weights;
  store_->begin_pass(backward_order(chunk));
  backward(tokens, dout, chunk);
  store_->end_pass();
  defer_weights_ = false;
}

void GptModel::set_activation_quantization(ActivationQuantization q) {
  DS_CHECK(q.bits.empty() || static_cast<int>(q.bits.size()) == d_.L, "activation quantization for {} of {} layers",
           q.bits.size(), d_.L);
  DS_USER_CHECK(q.bits.empty() || !d_.post_norm, "activation quantization of post-norm blocks (OPT-350m's) is "
                "not supported");
  act_quant_ = std::move(q);
  act_ranges_ = act_quant_.calibrate_static ? Tensor::zeros({d_.L, 4, 2}, DType::F32, dev_) : Tensor();
  B_ = T_ = 0;  // reallocate on next use (attn_q)
}

void GptModel::quantize_input(int l, int which, const Tensor& x) {
  if (!quantizes(l, which)) return;
  ops::act_quantize({.x = x,
                     .range = act_quant_.calibrate_static ? act_ranges_.view((l * 4 + which) * 2, {2}) : Tensor(),
                     .bits = act_quant_.bits[static_cast<size_t>(l)][which],
                     .symmetric = act_quant_.symmetric,
                     .update = S().key.train},
                    stream_);
}

Tensor GptModel::proj_input(int l, LayerActs& a) { return quantizes(l, 1) ? rows(a.attn_q) : rows(a.attn_seq); }

Tensor GptModel::weight_grad(int l, ParamRef weight, const Tensor& dout, const Tensor& inp) {
  if (!defer_weights_) return dw(weight);
  deferred_.back().push_back({.weight = weight, .unit = l + 1, .dout = dout.clone(), .inp = inp.clone()});
  return Tensor();
}

// The units of the set in the order their layers' backwards left them
// (last layer first); each unit's gradients are acquired once.
void GptModel::stage_weight_grads() {
  DS_CHECK(!deferred_.empty(), "a weight pass with no deferred weight gradients");
  std::vector<DeferredWeightGrad> set = std::move(deferred_.front());
  deferred_.pop_front();
  std::vector<int> order;
  int64_t bytes = 0;
  for (const DeferredWeightGrad& d : set) {
    if (order.empty() || order.back() != d.unit) order.push_back(d.unit);
    bytes += static_cast<int64_t>(d.dout.nbytes() + d.inp.nbytes());
  }
  // What --estimate-memory and the start-up line count (replicated kv heads
  // keep their qkv gradient out of the set).
  DS_CHECK(kv_dw_.defined() || bytes == deferred_weight_grad_bytes(B_, T_),
           "deferred weight gradients: {} bytes held, {} counted", bytes, deferred_weight_grad_bytes(B_, T_));
  store_->begin_pass(order);
  size_t i = 0;
  for (int unit : order) {
    use_params(unit);  // for the weight's shape
    use_grads(unit);
    for (; i < set.size() && set[i].unit == unit; ++i)
      ops::matmul_backward({.dinp = Tensor(),
                            .dweight = dw(set[i].weight),
                            .dbias = Tensor(),
                            .dout = set[i].dout,
                            .inp = set[i].inp,
                            .weight = w(set[i].weight)},
                           stream_);
    drop_params(unit);
    grads_done(unit);
  }
  store_->end_pass();
}

int64_t GptModel::deferred_weight_grad_bytes(int64_t B, int64_t T, int chunk) const {
  std::vector<int> layers;
  for (int l = layout_.chunks[chunk].begin; l < layout_.chunks[chunk].end; ++l) layers.push_back(l);
  return ds::deferred_weight_grad_bytes(d_, tp_.size, B * T, static_cast<int64_t>(dtype_size(compute_)), layers);
}

Tensor GptModel::stage_input_grad() { return dresid_.reshape({B_, local_seq(T_), d_.C}); }

}  // namespace ds
