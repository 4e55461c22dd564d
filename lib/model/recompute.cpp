// Activation recomputation of GptModel (see RecomputeConfig in gpt.h).
// Full: a recomputed layer's LayerActs are views of one shared scratch set;
// its forward is re-run (bit-identically: same ops, same inputs) just before
// its backward. Selective: only attn_out lives in the scratch; the attention
// core is re-run from the saved qkv (and lse) before the layer's backward.
// Our attention never stores the T x T probabilities (it keeps the
// log-sum-exp per row), so the saving is the attention output. Dropout masks
// are hashed from the micro-batch's key (ActSet::key), so a re-run draws the
// forward's masks again.
#include <set>

#include "lib/core/error.h"
#include "lib/model/gpt.h"
#include "lib/ops/ops.h"

namespace ds {

void GptModel::set_recompute(RecomputeConfig r) {
  DS_CHECK(r.num_layers >= 0, "recompute num_layers {} < 0", r.num_layers);
  recompute_ = r;
  B_ = T_ = 0;  // reallocate on next use
}

bool GptModel::full_recompute(int l) const {
  if (recompute_.kind != RecomputeConfig::Kind::Full) return false;
  for (const auto& c : layout_.chunks) {
    if (l < c.begin || l >= c.end) continue;
    return recompute_.num_layers == 0 || l < c.begin + recompute_.num_layers;
  }
  return false;
}

// One layer's worth of activations when any layer is fully recomputed; only
// the attention output when selective.
void GptModel::alloc_recompute_scratch(int64_t B, int64_t T) {
  scratch_ = LayerActs{};
  bool any_full = false;
  for (int l = layout_.first_layer; l < layout_.end_layer; ++l) any_full |= layout_.holds_layer(l) && full_recompute(l);
  if (any_full) {
    alloc_layer_acts(scratch_, B, T);
  } else if (recompute_.kind == RecomputeConfig::Kind::Selective) {
    scratch_.attn_out = Tensor::empty({B, T * sp_.size, Ca_}, compute_, dev_);
  }
}

// Re-runs what the layer dropped; the layer's parameters are acquired. A full
// recompute rewrites resid[l + 1] with the same values it already holds.
void GptModel::recompute_before_backward(int l, const Tensor& x, const Tensor& y) {
  if (full_recompute(l)) {
    recomputing_ = true;  // the forward's statistics (the MoE loss) were counted already
    layer_forward(l, x.defined() ? x : S().resid[l], y.defined() ? y : S().resid[l + 1]);
    recomputing_ = false;
  } else if (recompute_.kind == RecomputeConfig::Kind::Selective) {
    LayerActs& a = S().acts[l];
    // Same key as the forward: the same attention-dropout mask is redrawn.
    const DropoutSpec drop = attention_dropout(l);
    ops::attention_forward({.out = a.attn_out,
                            .lse = a.lse,
                            .qkv = a.qkv,
                            .NH = static_cast<int>(NHa_),
                            .NKV = static_cast<int>(NKVa_),
                            .dropout = drop,
                            .dropout_key = dropout_key(drop),
                            .lengths = S().lengths},
        stream_);
  }
}

int64_t GptModel::saved_activation_bytes(int64_t B, int64_t T) {
  ensure_acts(B, T);
  std::set<const void*> skip, seen;
  for (const Tensor* t : {&scratch_.norm1_out, &scratch_.norm1_mean, &scratch_.norm1_rstd, &scratch_.qkv,
                          &scratch_.qkv_pre, &scratch_.attn_out, &scratch_.attn_seq, &scratch_.lse, &scratch_.resid_mid,
                          &scratch_.norm2_out, &scratch_.norm2_mean, &scratch_.norm2_rstd, &scratch_.fc_out,
                          &scratch_.act_out, &scratch_.attn_q, &scratch_.resid_out})
    if (t->defined()) skip.insert(t->raw());
  int64_t bytes = 0;
  auto count = [&](const Tensor& t) {
    if (!t.defined() || skip.count(t.raw()) || !seen.insert(t.raw()).second) return;
    bytes += static_cast<int64_t>(t.nbytes());
  };
  const ActSet& s = sets_.at(0);
  for (const Tensor& t : s.resid) count(t);
  for (const LayerActs& a : s.acts)
    for (const Tensor* t : {&a.norm1_out, &a.norm1_mean, &a.norm1_rstd, &a.qkv, &a.qkv_pre, &a.attn_out, &a.attn_seq, &a.lse,
                            &a.resid_mid, &a.norm2_out, &a.norm2_mean, &a.norm2_rstd, &a.fc_out, &a.act_out, &a.attn_q,
                            &a.resid_out})
      count(*t);
  for (const Tensor* t : {&s.final_out, &s.final_mean, &s.final_rstd, &s.emb_in, &s.head_in, &s.logits}) count(*t);
  return bytes;
}

}  // namespace ds
