// Random-LTD in GptModel (random_ltd.h, docs/data_efficiency.md). A dropping
// layer gathers its kept rows of the residual stream (ops::token_gather),
// runs the ordinary layer forward on a (B, R) micro-batch and writes its
// output rows over a copy of its input (ops::token_scatter). Its backward
// gathers the output gradient's kept rows, runs the layer backward on them and
// overwrites those rows of the output gradient with the input gradient: the
// other rows pass the layer unchanged, as upstream's GatherTokens /
// ScatterTokens backward. While a dropping layer runs, its activations and
// the backward scratch are (B, R) views of the (B, T) buffers (ShortSeq), so
// the layer code sees an ordinary shorter micro-batch.
#include "lib/model/random_ltd.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "lib/ops/ops.h"

namespace ds {

int64_t random_ltd_reserved(const RandomLtdSchedule& s, int64_t step) {
  if (s.min_value >= s.max_value) return s.min_value;
  // Python: math.floor(float(step) / require * (max - min) + min), in double.
  const double x = static_cast<double>(step) / static_cast<double>(s.require_steps);
  int64_t v = static_cast<int64_t>(
      std::floor(x * static_cast<double>(s.max_value - s.min_value) + static_cast<double>(s.min_value)));
  v -= v % s.seq_per_step;
  return std::min(v, s.max_value);
}

void random_ltd_positions(uint64_t seed, int64_t iteration, int64_t sample, int layer, int64_t T, int64_t R,
                          int32_t* out) {
  DS_CHECK(R >= 0 && R <= T, "random-LTD: {} kept positions of {}", R, T);
  uint64_t h = splitmix64(seed ^ 0x72616e646f6d6c74ull);  // "randomlt"
  h = splitmix64(h ^ static_cast<uint64_t>(iteration));
  h = splitmix64(h ^ static_cast<uint64_t>(sample));
  Rng rng(splitmix64(h ^ static_cast<uint64_t>(layer)));
  // Selection sampling (Knuth's Algorithm S): position t is kept with
  // probability (still needed) / (still left), which draws every R-subset
  // with the same probability and yields it in order.
  int64_t kept = 0;
  for (int64_t t = 0; t < T && kept < R; ++t)
    if (static_cast<double>(T - t) * rng.uniform() < static_cast<double>(R - kept)) out[kept++] = static_cast<int32_t>(t);
  DS_CHECK(kept == R, "random-LTD: selection sampling kept {} of {}", kept, R);
}

void GptModel::set_random_ltd(RandomLtd r) {
  for (int l : r.layers) DS_CHECK(l >= 0 && l < d_.L, "random-LTD layer {} outside [0, {})", l, d_.L);
  DS_CHECK(r.layers.empty() || (!sp_.active() && !tp_.sp() && layout_.shard.pp == 1 && !d_.rope),
           "random-LTD with sequence parallelism, Ulysses, pipeline stages or rotary positions");
  DS_USER_CHECK(r.layers.empty() || !d_.post_norm, "random-LTD on post-norm blocks (OPT-350m's) is not supported");
  ltd_ = std::move(r);
  ltd_layer_.assign(static_cast<size_t>(d_.L), -1);
  for (size_t k = 0; k < ltd_.layers.size(); ++k) ltd_layer_[static_cast<size_t>(ltd_.layers[k])] = static_cast<int>(k);
  B_ = T_ = 0;  // reallocate on next use (the gather buffers)
}

bool GptModel::ltd_active(int l) const {
  return !ltd_layer_.empty() && l >= 0 && l < d_.L && sets_[static_cast<size_t>(cur_)].ltd_R > 0 &&
         ltd_layer_[static_cast<size_t>(l)] >= 0;
}

// The micro-batch's kept positions, drawn when a training forward starts.
void GptModel::draw_random_ltd(ActSet& s) {
  s.ltd_R = 0;
  if (ltd_.layers.empty() || !s.key.train || ltd_.reserved >= T_) return;
  DS_CHECK(!s.key.step.defined(), "random-LTD with a device-side step key (a captured CUDA graph)");
  DS_CHECK(!s.lengths.defined(), "random-LTD with padded micro-batches (lengths)");
  const int64_t n = static_cast<int64_t>(ltd_.layers.size()), R = ltd_.reserved;
  Tensor ix = Tensor::empty({n, B_, R}, DType::I32, Device::cpu());
  for (int64_t k = 0; k < n; ++k)
    for (int64_t b = 0; b < B_; ++b)
      random_ltd_positions(s.key.seed, s.key.iteration, s.key.first_sample + b, ltd_.layers[static_cast<size_t>(k)],
                           T_, R, ix.data<int32_t>() + (k * B_ + b) * R);
  s.ltd_index = dev_.is_cpu() ? ix : ix.to(dev_);
  s.ltd_R = R;
}

Tensor GptModel::ltd_index(int l) {
  const int64_t R = S().ltd_R, k = ltd_layer_[static_cast<size_t>(l)];
  return S().ltd_index.view(k * B_ * R, {B_, R});
}

// (B, R) views of a layer's (B, T) activations (alloc_layer_acts' shapes).
namespace {
Tensor first(const Tensor& t, const Shape& s) { return t.defined() ? t.view(0, s) : t; }
}  // namespace

struct GptModel::ShortSeq {
  GptModel& m;
  int l;
  LayerActs acts;
  int64_t T;
  Tensor dnorm, dqkv, dattn, dattn_a, dqkv_a, dfc, dact;
  ShortSeq(GptModel& model, int layer, int64_t R)
      : m(model), l(layer), acts(m.S().acts[layer]), T(m.T_), dnorm(m.dnorm_), dqkv(m.dqkv_), dattn(m.dattn_),
        dattn_a(m.dattn_a_), dqkv_a(m.dqkv_a_), dfc(m.dfc_), dact(m.dact_) {
    const int64_t B = m.B_, N = B * R, C = m.d_.C;
    LayerActs& a = m.S().acts[layer];
    auto rows = [&](Tensor& t) { t = first(t, t.dim() == 1 ? Shape{N} : Shape{N, t.size(1)}); };
    auto seq = [&](Tensor& t) { t = first(t, {B, R, t.dim() == 3 ? t.size(2) : 0}); };
    for (Tensor* t : {&a.norm1_out, &a.norm1_mean, &a.norm1_rstd, &a.resid_mid, &a.norm2_out, &a.norm2_mean,
                      &a.norm2_rstd, &a.fc_out, &a.act_out})
      if (t->defined()) rows(*t);
    for (Tensor* t : {&a.qkv, &a.qkv_pre, &a.attn_out, &a.attn_q})
      if (t->defined()) seq(*t);
    a.attn_seq = a.attn_out;
    if (a.lse.defined()) a.lse = first(a.lse, {B, a.lse.size(1), R});
    m.T_ = R;
    m.dnorm_ = first(m.dnorm_, {N, C});
    m.dqkv_ = first(m.dqkv_, {B, R, m.dqkv_.size(2)});
    m.dattn_ = first(m.dattn_, {B, R, m.dattn_.size(2)});
    m.dattn_a_ = m.dattn_;
    m.dqkv_a_ = m.dqkv_;
    m.dfc_ = first(m.dfc_, {N, m.dfc_.size(1)});
    if (m.dact_.defined()) m.dact_ = first(m.dact_, {N, m.dact_.size(1)});
  }
  ~ShortSeq() {
    MoeActs moe = std::move(m.S().acts[l].moe);  // sized by the short forward; kept for its backward
    m.S().acts[l] = acts;
    m.S().acts[l].moe = std::move(moe);
    m.T_ = T;
    m.dnorm_ = dnorm, m.dqkv_ = dqkv, m.dattn_ = dattn, m.dattn_a_ = dattn_a, m.dqkv_a_ = dqkv_a;
    m.dfc_ = dfc, m.dact_ = dact;
  }
  ShortSeq(const ShortSeq&) = delete;
  ShortSeq& operator=(const ShortSeq&) = delete;
};

void GptModel::ltd_layer_forward(int l) {
  const int64_t R = S().ltd_R, C = d_.C;
  const Tensor ix = ltd_index(l), xg = ltd_x_.view(0, {B_, R, C}), yg = ltd_y_.view(0, {B_, R, C});
  const Tensor& x = S().resid[static_cast<size_t>(l)];
  const Tensor& y = S().resid[static_cast<size_t>(l) + 1];
  ops::token_gather({.full = x, .part = xg, .index = ix}, stream_);
  {
    ShortSeq s(*this, l, R);
    layer_forward(l, xg, yg);
  }
  ops::cast({.out = y, .inp = x}, stream_);
  ops::token_scatter({.full = y, .part = yg, .index = ix}, stream_);
}

void GptModel::ltd_layer_backward(int l) {
  const int64_t R = S().ltd_R, C = d_.C;
  const Tensor ix = ltd_index(l), xg = ltd_x_.view(0, {B_, R, C}), yg = ltd_y_.view(0, {B_, R, C});
  const Tensor dy = dresid_.reshape({B_, T_, C});
  ops::token_gather({.full = S().resid[static_cast<size_t>(l)], .part = xg, .index = ix}, stream_);
  {
    ShortSeq s(*this, l, R);
    recompute_before_backward(l, xg, yg);  // a full recompute writes (and drops) its output in yg
    ops::token_gather({.full = dy, .part = yg, .index = ix}, stream_);
    layer_backward(l, xg, yg.reshape({B_ * R, C}));
  }
  ops::token_scatter({.full = dy, .part = yg, .index = ix}, stream_);
}

}  // namespace ds
