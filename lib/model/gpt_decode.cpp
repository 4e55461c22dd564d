// Incremental decoding with a key/value cache: the forward of new tokens
// only, each layer attending to the cached keys and values of the positions
// before them (ops::kv_attention). Same weights, ops and tensor-parallel
// regions as the training forward (lib/model/gpt.cpp), without dropout,
// saved statistics for a backward, or sequence parallelism. Samples of a
// batch sit at their own positions (prompts of different lengths): the
// position-dependent steps (position embedding, RoPE) run per sample, every
// matmul runs on the whole batch. Only each sample's last row reaches the
// head; the logits come back to the host over the real vocabulary.
#include <algorithm>

#include "lib/core/error.h"
#include "lib/model/gpt.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

Tensor rows(const Tensor& t) { return t.reshape({t.numel() / t.size(-1), t.size(-1)}); }
}  // namespace

KvCache kv_cache_rows(const KvCache& c, int64_t b0, int64_t n) {
  DS_CHECK(b0 >= 0 && n >= 1 && b0 + n <= c.B, "kv_cache_rows: samples [{}, {}) outside a cache of {}", b0, b0 + n,
           c.B);
  KvCache r;
  r.B = n;
  r.Tmax = c.Tmax;
  for (size_t l = 0; l < c.k.size(); ++l) {
    const int64_t KW = c.k[l].size(2), per = c.Tmax * KW;
    r.k.push_back(c.k[l].view(b0 * per, {n, c.Tmax, KW}));
    r.v.push_back(c.v[l].view(b0 * per, {n, c.Tmax, KW}));
  }
  return r;
}

KvCache GptModel::make_kv_cache(int64_t B, int64_t Tmax) const {
  DS_CHECK(layout_.first_stage() && layout_.last_stage() && layout_.shard.vp == 1,
           "make_kv_cache: generation needs the whole model on each rank (pipeline size 1)");
  DS_CHECK(!tp_.sp(), "make_kv_cache: generation runs without sequence parallelism");
  DS_CHECK(!sp_.active(), "make_kv_cache: generation runs without Ulysses sequence parallelism");
  DS_CHECK(!d_.value_head, "make_kv_cache: a value-head model has no vocabulary to generate from");
  DS_USER_CHECK(B >= 1 && Tmax >= 1, "generation: batch {} and context {} must be >= 1", B, Tmax);
  DS_USER_CHECK(Tmax <= d_.maxT, "generation: {} positions exceed the model's max_position_embeddings {}", Tmax,
                d_.maxT);
  KvCache c;
  c.B = B;
  c.Tmax = Tmax;
  for (int l = 0; l < d_.L; ++l) {
    c.k.push_back(Tensor::zeros({B, Tmax, NKVl_ * d_.HS}, compute_, dev_));
    c.v.push_back(Tensor::zeros({B, Tmax, NKVl_ * d_.HS}, compute_, dev_));
  }
  return c;
}

// Scratch for N = B*Tq rows (grown, never shrunk) and the per-sample head.
void GptModel::decode_scratch(KvCache& c, int64_t N) {
  if (N > c.work_rows) {
    const int64_t F_in = d_.swiglu ? 2 * Fl_ : Fl_;
    auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
    c.x = act({N, d_.C});
    c.h = act({N, d_.C});
    c.mid = act({N, d_.C});
    c.qkv = act({N, QKVl_});
    c.attn = act({N, Cl_});
    c.fc = act({N, F_in});
    c.act = act({N, Fl_});
    c.stat1 = Tensor::empty({N}, DType::F32, dev_);
    c.stat2 = Tensor::empty({N}, DType::F32, dev_);
    c.emb = d_.projects() ? act({N, d_.P}) : Tensor();
    c.work_rows = N;
  }
  if (!c.last.defined() || c.last.size(0) != c.B) {
    const int64_t B = c.B;
    c.last = Tensor::empty({B, d_.C}, compute_, dev_);
    c.last_norm = Tensor::empty({B, d_.C}, compute_, dev_);
    c.last_mean = Tensor::empty({B}, DType::F32, dev_);
    c.last_rstd = Tensor::empty({B}, DType::F32, dev_);
    c.last_proj = d_.projects() ? Tensor::empty({B, d_.P}, compute_, dev_) : Tensor();
    c.logits_local = Tensor::empty({Vl_, B}, compute_, dev_);
    c.logits_full = Tensor::empty({d_.Vp, B}, compute_, dev_);
    c.logits_f32 = Tensor::empty({d_.Vp, B}, DType::F32, dev_);
    c.pos = Tensor::empty({B}, DType::I32, dev_);
  }
}

// One layer on the N = B*Tq rows of c.x (updated in place): the training
// layer_forward's steps, with kv_attention over the cache instead of the
// full-sequence attention. As in training, a layer's closing add may be left
// to the next layer's norm1 (one add_norm_forward); c.mid holds the residual
// until that norm1 has read it.
void GptModel::decode_layer(int l, KvCache& c, int64_t B, int64_t Tq, const std::vector<int32_t>& pos,
                            ResidualAdd prev, ResidualAdd add) {
  const int64_t N = B * Tq;
  const LayerParams& P = lp(l);
  const bool row_bias = tp_.rank == 0;
  const int nh = static_cast<int>(NHl_), nkv = static_cast<int>(NKVl_);
  Tensor x = c.x.view(0, {N, d_.C}), h = c.h.view(0, {N, d_.C}), mid = c.mid.view(0, {N, d_.C});
  Tensor s1 = c.stat1.view(0, {N}), s2 = c.stat2.view(0, {N});
  Tensor qkv = c.qkv.view(0, {B, Tq, QKVl_}), attn = c.attn.view(0, {B, Tq, Cl_});
  DS_CHECK(!d_.post_norm || (prev == ResidualAdd::InLayer && add == ResidualAdd::InLayer),
           "post-norm layer {}: a residual add left to the next norm", l);
  if (d_.post_norm)
    h = x;  // the attention reads the layer's input
  else if (prev == ResidualAdd::InNextNorm)
    dropout_add_norm(P.norm1, x, x, mid, DropoutSpec{}, h, s1, s2);  // x += mid, fused with norm1
  else
    norm_forward(P.norm1, h, s1, s2, x);
  ops::matmul_forward(
      {.out = rows(qkv), .inp = h, .weight = w(P.attn.qkv.weight), .bias = opt(P.attn.qkv.bias, false)},
      stream_);
  if (d_.rope)
    for (int64_t b = 0; b < B; ++b) {
      Tensor qb = qkv.view(b * Tq * QKVl_, {1, Tq, QKVl_});
      ops::rope_forward({.out = qb, .inp = qb, .NH = nh, .pos_offset = pos[b], .theta = cfg_.rope_theta, .NKV = nkv,
                         .rot_dims = d_.rot},
                        stream_);
    }
  ops::kv_attention({.out = attn, .k_cache = c.k[l], .v_cache = c.v[l], .qkv = qkv, .pos = c.pos, .NH = nh,
                     .NKV = nkv},
                    stream_);
  ops::matmul_forward({.out = mid,
                       .inp = rows(attn),
                       .weight = w(P.attn.proj.weight),
                       .bias = row_bias ? opt(P.attn.proj.bias, false) : Tensor()},
                      stream_);
  reduce_from_tp_forward(tp_, mid);
  // Post-norm: h = norm1(x + attn) is the MLP's input and residual.
  if (d_.post_norm) h = c.h.view(0, {N, d_.C});
  dropout_add_norm(d_.post_norm ? P.norm1 : P.norm2, mid, mid, x, DropoutSpec{}, h, s1, s2);  // fused add + norm
  if (P.is_moe()) {  // every tp rank computes the whole output (expert tp: summed over tp inside)
    MoeActs m;
    moe_mlp(l, h, x, m, DropoutKey{}, Tq);
    if (add == ResidualAdd::InLayer) ops::add({.out = x, .a = x, .b = mid}, stream_);
    return;
  }
  Tensor fc = c.fc.view(0, {N, c.fc.size(1)}), act = c.act.view(0, {N, Fl_});
  ops::matmul_forward(
      {.out = fc, .inp = h, .weight = w(P.mlp.fc.weight), .bias = opt(P.mlp.fc.bias, false)}, stream_);
  if (d_.swiglu)
    ops::swiglu_forward({.out = act, .inp = fc}, stream_);
  else if (d_.relu)
    ops::relu_forward({.out = act, .inp = fc, .dout = Tensor()}, stream_);
  else
    ops::gelu_forward({.out = act, .inp = fc, .dout = Tensor()}, stream_);
  if (d_.post_norm) {  // x = norm2(h + mlp(h))
    ops::matmul_forward({.out = mid, .inp = act, .weight = w(P.mlp.proj.weight), .bias = opt(P.mlp.proj.bias, false)},
                        stream_);
    dropout_add_norm(P.norm2, mid, mid, h, DropoutSpec{}, x, s1, s2);
    return;
  }
  ops::matmul_forward({.out = x,
                       .inp = act,
                       .weight = w(P.mlp.proj.weight),
                       .bias = row_bias ? opt(P.mlp.proj.bias, false) : Tensor()},
                      stream_);
  reduce_from_tp_forward(tp_, x);
  if (add == ResidualAdd::InLayer) ops::add({.out = x, .a = x, .b = mid}, stream_);
}

Tensor GptModel::decode_forward(const Tensor& tokens, const std::vector<int32_t>& pos, KvCache& c) {
  const int64_t B = tokens.size(0), Tq = tokens.size(1), N = B * Tq;
  DS_CHECK(tokens.dim() == 2 && B == c.B && static_cast<int64_t>(pos.size()) == B && Tq >= 1,
           "decode_forward: tokens {} for a cache of {} samples and {} positions", shape_str(tokens.shape()), c.B,
           pos.size());
  for (int64_t b = 0; b < B; ++b)
    DS_CHECK(pos[b] >= 0 && pos[b] + Tq <= c.Tmax, "decode_forward: sample {} at positions [{}, {}) outside the "
             "cache of {}", b, pos[b], pos[b] + Tq, c.Tmax);
  decode_scratch(c, N);
  c.pos.copy_from(Tensor::from_blob(const_cast<int32_t*>(pos.data()), {B}, DType::I32));
  const int last = d_.L + 1;
  store_->begin_pass(forward_order());
  // Embedding: vocab-parallel rows, the position table added by tp rank 0, per sample at its offset.
  use_params(0);
  Tensor wpe = tp_.rank == 0 ? opt(layout_.embed.wpe, false) : Tensor();
  Tensor x = c.x.view(0, {N, d_.C});
  if (d_.projects()) {  // x = project_in(wte[tokens]) + the positions (a (0, C) token table: positions alone)
    Tensor emb = c.emb.view(0, {B, Tq, d_.P}), pos_rows = c.h.view(0, {N, d_.C});
    ops::embedding_forward({.out = emb, .tokens = tokens, .wte = w(layout_.embed.wte), .wpe = Tensor()}, stream_);
    ops::matmul_forward({.out = x, .inp = emb.reshape({N, d_.P}), .weight = w(layout_.embed.project_in)}, stream_);
    if (wpe.defined()) {
      const Tensor no_rows = Tensor::empty({0, d_.C}, compute_, dev_);
      for (int64_t b = 0; b < B; ++b)
        ops::embedding_forward({.out = pos_rows.view(b * Tq * d_.C, {1, Tq, d_.C}),
                                .tokens = tokens.view(b * Tq, {1, Tq}),
                                .wte = no_rows,
                                .wpe = wpe,
                                .pos_offset = pos[b],
                                .row_offset = d_.pos_offset},
                               stream_);
      ops::add({.out = x, .a = x, .b = pos_rows}, stream_);
    }
  } else {
    for (int64_t b = 0; b < B; ++b)
      ops::embedding_forward({.out = x.view(b * Tq * d_.C, {1, Tq, d_.C}),
                              .tokens = tokens.view(b * Tq, {1, Tq}),
                              .wte = w(layout_.embed.wte),
                              .wpe = wpe,
                              .vocab_start = vocab_start_,
                              .pos_offset = pos[b],
                              .row_offset = d_.pos_offset},
                             stream_);
    reduce_from_tp_forward(tp_, x);
  }
  drop_params(0);
  // The final norm reads only each sample's last row (c.last), so the last
  // layer adds its residual itself (post-norm layers always do).
  for (int l = 0; l < d_.L; ++l) {
    use_params(l + 1);
    const bool fuse = !d_.post_norm;
    decode_layer(l, c, B, Tq, pos, l > 0 && fuse ? ResidualAdd::InNextNorm : ResidualAdd::InLayer,
                 l + 1 < d_.L && fuse ? ResidualAdd::InNextNorm : ResidualAdd::InLayer);
    drop_params(l + 1);
  }
  // Head on each sample's last row. logits^T = head (Vl, C) @ last^T: this
  // rank's vocabulary rows are one contiguous block of the (Vp, B) result,
  // so an all-gather over tp assembles the full vocabulary.
  for (int64_t b = 0; b < B; ++b)
    c.last.view(b * d_.C, {d_.C}).copy_from(x.view(((b + 1) * Tq - 1) * d_.C, {d_.C}));
  use_params(last);
  Tensor head_in = c.last;
  if (d_.final_norm()) {
    norm_forward(layout_.head.final_norm, c.last_norm, c.last_mean, c.last_rstd, c.last);
    head_in = c.last_norm;
  }
  if (d_.projects()) {
    ops::matmul_forward({.out = c.last_proj, .inp = head_in, .weight = w(layout_.head.project_out)}, stream_);
    head_in = c.last_proj;
  }
  if (!d_.untied) {
    drop_params(last);
    use_params(0);
  }
  Tensor head = d_.untied ? w(layout_.head.head) : w(layout_.embed.wte);
  ops::matmul_forward({.out = c.logits_local, .inp = head, .weight = head_in, .bias = Tensor()}, stream_);
  drop_params(d_.untied ? last : 0);
  store_->end_pass();
  if (tp_.active())
    tp_.comm->all_gather(c.logits_local.raw(), c.logits_full.raw(), c.logits_local.numel(), compute_);
  else
    c.logits_full.copy_from(c.logits_local);
  Tensor f32 = c.logits_full;
  if (compute_ != DType::F32) {
    ops::cast({.out = c.logits_f32, .inp = c.logits_full}, stream_);
    f32 = c.logits_f32;
  }
  Tensor host = f32.device().is_cpu() ? f32 : f32.to(Device::cpu());
  Tensor out = Tensor::empty({B, d_.V}, DType::F32);
  const float* src = host.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t v = 0; v < d_.V; ++v) out.data<float>()[b * d_.V + v] = src[v * B + b];
  return out;
}

const Tensor& GptModel::forward_logits(const Tensor& tokens) {
  DS_CHECK(layout_.first_stage() && layout_.last_stage() && layout_.shard.vp == 1,
           "forward_logits: needs the whole model (pipeline size 1)");
  cur_ = 0;
  store_->begin_pass(forward_order());
  ensure_acts(tokens.size(0), tokens.size(1));
  S().key = DropoutKey{};
  S().lengths = lengths_;
  S().shifts = shifts_;
  forward(tokens);
  store_->end_pass();
  return S().logits;
}

}  // namespace ds
