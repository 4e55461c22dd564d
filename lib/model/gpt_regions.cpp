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
  sp_full_ = sp_tmp_ = dnorm_sh_ = sp_dw_ = sp_db_ = Tensor();
  if (!tp_.sp()) return;
  const int64_t C = d_.C, N = B * T;
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
  sp_full_ = act({N, C});
  sp_tmp_ = act({N, C});
  dnorm_sh_ = act({B * local_seq(T), C});
  sp_dw_ = f32({C});
  sp_db_ = f32({C});
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
void GptModel::sp_norm_backward(const std::string& prefix, const Tensor& dinp, const Tensor& dout,
                                const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
  auto rows = [](const Tensor& t) { return t.reshape({t.numel() / t.size(-1), t.size(-1)}); };
  sp_dw_.zero_();
  if (d_.rmsnorm) {
    ops::rmsnorm_backward({.dinp = dinp,
                           .dweight = sp_dw_,
                           .dout = dout,
                           .inp = rows(inp),
                           .weight = w(prefix + ".weight"),
                           .rstd = rstd,
                           .accum = Accum::Add},
                          stream_);
  } else {
    sp_db_.zero_();
    ops::layernorm_backward({.dinp = dinp,
                             .dweight = sp_dw_,
                             .dbias = sp_db_,
                             .dout = dout,
                             .inp = rows(inp),
                             .weight = w(prefix + ".weight"),
                             .mean = mean,
                             .rstd = rstd,
                             .accum = Accum::Add},
                            stream_);
    sp_all_reduce(tp_, sp_db_);
    Tensor db = dw(prefix + ".bias");
    ops::add({.out = db, .a = db, .b = sp_db_}, stream_);
  }
  sp_all_reduce(tp_, sp_dw_);
  Tensor dwt = dw(prefix + ".weight");
  ops::add({.out = dwt, .a = dwt, .b = sp_dw_}, stream_);
}

}  // namespace ds
