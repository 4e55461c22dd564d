// Tensor-parallel regions of GptModel, with and without sequence parallelism.
// Without SP (Megatron's copy_to_tp / reduce_from_tp):
//   enter_tp: identity, backward all-reduce; exit_tp: all-reduce, backward identity.
// With SP the residual stream, norms and residual adds hold this rank's
// (B, T/TP, C) shard (lib/model/sequence_parallel.h):
//   enter_tp: all-gather of the sequence, backward reduce-scatter;
//   exit_tp:  reduce-scatter, backward all-gather.
// Norm weights then see only this rank's rows: their gradients are summed
// over tp (sp_norm_backward). Row-parallel biases are added by tp rank 0
// before the reduce-scatter and their gradient comes from the gathered
// output gradient, so it is already the full (replicated) one.
#include "lib/model/gpt.h"
#include "lib/model/sequence_parallel.h"
#include "lib/ops/ops.h"

namespace ds {

void GptModel::alloc_sp_buffers(int64_t B, int64_t T) {
  sp_full_ = sp_tmp_ = dnorm_sh_ = sp_dw_ = sp_db_ = moe_full_ = Tensor();
  moe_ux_ = moe_uy_ = moe_udx_ = moe_utmp_ = Tensor();
  if (sp_.active() && has_moe()) {  // MoE layers see the whole sequence (moe_layer.cpp)
    const Shape whole{B * T * sp_.size, d_.C};
    for (Tensor* t : {&moe_ux_, &moe_uy_, &moe_udx_, &moe_utmp_}) *t = Tensor::empty(whole, compute_, dev_);
  }
  if (!tp_.sp()) return;
  const int64_t C = d_.C, N = B * T;
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
  sp_full_ = act({N, C});
  sp_tmp_ = act({N, C});
  dnorm_sh_ = act({B * local_seq(T), C});
  sp_dw_ = f32({C});
  sp_db_ = f32({C});
  if (has_moe()) moe_full_ = act({N, C});
}

Tensor GptModel::enter_tp(const Tensor& x) {
  if (!tp_.sp()) {
    copy_to_tp_forward(tp_, x);
    return x;
  }
  sp_gather(tp_, B_, x, sp_full_, sp_tmp_);
  return sp_full_;
}

Tensor GptModel::enter_tp_backward(const Tensor& dx) {
  if (!tp_.sp()) {
    copy_to_tp_backward(tp_, dx);
    return dx;
  }
  sp_reduce_scatter(tp_, B_, dx, dnorm_sh_, sp_tmp_);
  return dnorm_sh_;
}

Tensor GptModel::exit_tp_target(const Tensor& y) { return tp_.sp() ? sp_full_ : y; }

void GptModel::exit_tp(const Tensor& y) {
  if (!tp_.sp()) {
    reduce_from_tp_forward(tp_, y);
    return;
  }
  sp_reduce_scatter(tp_, B_, sp_full_, y, sp_tmp_);
}

Tensor GptModel::exit_tp_backward(const Tensor& dy) {
  if (!tp_.sp()) {
    reduce_from_tp_backward(tp_, dy);
    return dy;
  }
  sp_gather(tp_, B_, dy, sp_full_, sp_tmp_);
  return sp_full_;
}

// Norm backward on this rank's rows; the weight (and bias) gradients of the
// shard are summed over tp before they are added to the gradient buffers.
void GptModel::sp_norm_backward(const NormParams& norm, const Tensor& dinp, const Tensor& dout,
                                const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
  sp_dw_.zero_();
  if (!d_.rmsnorm) sp_db_.zero_();
  norm_backward_op(norm, dinp, dout, inp, mean, rstd, sp_dw_, d_.rmsnorm ? Tensor() : sp_db_);
  if (!d_.rmsnorm) {
    sp_all_reduce(tp_, sp_db_);
    Tensor db = dw(norm.bias);
    ops::add({.out = db, .a = db, .b = sp_db_}, stream_);
  }
  sp_all_reduce(tp_, sp_dw_);
  Tensor dwt = dw(norm.weight);
  ops::add({.out = dwt, .a = dwt, .b = sp_dw_}, stream_);
}

}  // namespace ds

namespace ds {

// Grouped-query attention with NKV < TP (lib/model/layout.h: the kv parts of
// attn.qkv are replicated over the tp / NKV ranks of a query group).
void GptModel::alloc_kv_grad_buffers() {
  kv_dw_ = kv_db_ = kv_full_ = Tensor();
  if (kv_parts(d_, tp_.size) == tp_.size) return;
  const int64_t C = d_.C, KV = int64_t{d_.NKV} * d_.HS;  // full k (and v) rows
  kv_dw_ = Tensor::empty({QKVl_, C}, DType::F32, dev_);
  if (d_.bias) kv_db_ = Tensor::empty({QKVl_}, DType::F32, dev_);
  kv_full_ = Tensor::empty({2 * KV * (C + (d_.bias ? 1 : 0))}, DType::F32, dev_);
}

// kv_dw_ / kv_db_ hold this rank's qkv gradients with partial k and v rows:
// each rank puts its k and v rows at its kv head's place in a zeroed full-NKV
// buffer (the other groups' places stay zero), the all-reduce over tp sums the
// partials of each group, and every rank takes its head's sums back; then the
// whole scratch is added to the layer's gradients.
void GptModel::sum_shared_kv_grads(const AttentionParams& attn) {
  const int64_t C = d_.C, HS = d_.HS, KV = int64_t{d_.NKV} * HS, q_rows = NHl_ * HS;
  const int64_t kh = tp_.rank / (tp_.size / d_.NKV);  // this rank's kv head (NKVl = 1)
  kv_full_.zero_();
  // (offset in the scratch, offset in kv_full_, count) of the k and v weight and bias rows
  struct Part {
    const Tensor* local;
    int64_t local_at, full_at, n;
  };
  std::vector<Part> parts;
  for (int64_t kv = 0; kv < 2; ++kv) {  // k, then v
    parts.push_back({&kv_dw_, (q_rows + kv * HS) * C, (kv * KV + kh * HS) * C, HS * C});
    if (d_.bias) parts.push_back({&kv_db_, q_rows + kv * HS, 2 * KV * C + kv * KV + kh * HS, HS});
  }
  for (const Part& p : parts) kv_full_.view(p.full_at, {p.n}).copy_from(p.local->view(p.local_at, {p.n}));
  tp_.comm->all_reduce(kv_full_, ReduceOp::Sum);
  for (const Part& p : parts) p.local->view(p.local_at, {p.n}).copy_from(kv_full_.view(p.full_at, {p.n}));
  const Tensor dw_qkv = dw(attn.qkv.weight);
  ops::add({.out = dw_qkv, .a = dw_qkv, .b = kv_dw_}, stream_);
  if (!d_.bias) return;
  const Tensor db_qkv = dw(attn.qkv.bias);
  ops::add({.out = db_qkv, .a = db_qkv, .b = kv_db_}, stream_);
}

}  // namespace ds
