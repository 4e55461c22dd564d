// The Mixture-of-Experts MLP of a GptModel layer (docs/moe.md), DeepSpeed-MoE
// as Megatron-DeepSpeed uses it:
//   logits = norm2_out @ gate^T                      (N, E), f32
//   choices, rows, weights, l_aux = gate(logits)     (ops::moe_gate_forward)
//   xin[e] = the tokens routed to expert e           (ops::moe_dispatch_forward)
//   xout[e] = proj_e(act(fc_e(xin[e])))              (one GEMM pair per expert)
//   y = sum over a token's kept choices of weight * xout[e, row]   (ops::moe_combine_forward)
// Experts have no output bias (DeepSpeed's experts drop the bias their
// Megatron MLP returns). With expert parallelism (EP ranks, E / EP experts
// each) xin is exchanged between dispatch and the experts and xout back
// before the combine (expert_comm.h); an expert's GEMMs then run over the
// rows of every rank of its group at once. Tensor-parallel ranks compute the
// same MoE output on the same (replicated) input, each with its own
// expert-parallel group, so no tp region is entered. With expert tensor
// parallelism (--enable-expert-tensor-parallelism) each expert's fc is
// column-parallel and its proj row-parallel, as in the dense MLP: the ranks
// route alike, each computes its slice of every expert and a partial output,
// and the combined output is summed over tp (so is the combine weights'
// gradient, a dot with that output, and the experts' input gradient after the
// dispatch's backward). The PR-MoE dense branch stays replicated.
// DeepSpeed-Ulysses (U ranks, each holding T/U positions of every sequence):
// an MoE layer runs on the whole sequence, so that the gate sees the tokens
// a single process sees (capacity, dropping, l_aux): the input is
// all-gathered over the Ulysses group, every Ulysses rank computes the same
// output and keeps its positions. The backward gathers the output gradient
// the same way, scaled by 1/U: the MoE weights' gradients, complete on every
// Ulysses rank, then sum to the single-process ones over the
// sequence-data-parallel reduction, and the rank's rows of the input
// gradient are scaled back by U (the l_aux gradient is 1/U per rank
// already: its weight counts the rank's own tokens). U a power of two keeps
// both scalings exact.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/error.h"
#include "lib/model/gpt.h"
#include "lib/model/sequence_parallel.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

// DeepSpeed's _capacity: ceil(tokens / experts * factor), with the factor
// times k for top-2 and top-k, at least min_capacity. The product is taken
// in f32, as DeepSpeed multiplies by a float32 tensor.
int64_t moe_capacity(int64_t tokens, int64_t experts, int k, float factor, int min_capacity) {
  const float f = static_cast<float>(static_cast<double>(factor) * (k >= 2 ? k : 1));
  const float per = static_cast<float>(static_cast<double>(tokens) / static_cast<double>(experts));
  const auto c = static_cast<int64_t>(std::ceil(per * f));
  return std::max<int64_t>(c, min_capacity);
}

// The key of one MoE layer's random draws (RTS, Gumbel noise) in one
// micro-batch: training draws follow the dropout key (iteration, first
// sample), so every layout draws the same values for the same micro-batch.
uint64_t moe_noise_stream(const DropoutKey& key, int layer) {
  uint64_t h = dropout_mix(0x6d6f65ull ^ (key.train ? 1u : 0u));  // "moe"
  h = dropout_mix(h ^ static_cast<uint64_t>(key.iteration));
  h = dropout_mix(h ^ static_cast<uint64_t>(key.first_sample));
  return dropout_mix(h ^ static_cast<uint64_t>(layer));
}

Tensor row(const Tensor& t, int64_t i) {  // t[i] of a (n, ...) tensor
  Shape s(t.shape().begin() + 1, t.shape().end());
  return t.view(i * shape_numel(s), s);
}

// Which of a layer's El local experts compute. Training runs them all (the
// backward reads every expert's activations), and so does expert parallelism
// (an expert's rows come from other ranks too). Otherwise, on the CPU, an
// expert that no kept token reached is skipped: decoding routes a few tokens
// to k of E experts, and the combine reads only kept rows, so the output is
// the same without reading the other experts' weights. (On a GPU the routing
// would have to be read back first.)
std::vector<char> experts_to_run(const MoeActs& m, int64_t El, bool all) {
  if (all || !m.expert.device().is_cpu()) return std::vector<char>(static_cast<size_t>(El), 1);
  std::vector<char> runs(static_cast<size_t>(El), 0);
  const int32_t* expert = m.expert.data<int32_t>();
  const int32_t* slot = m.slot.data<int32_t>();
  for (int64_t i = 0; i < m.expert.numel(); ++i)
    if (slot[i] >= 0) runs[static_cast<size_t>(expert[i])] = 1;
  return runs;
}

}  // namespace

bool GptModel::has_moe() const {
  for (const LayerParams& p : layout_.layers)
    if (p.is_moe()) return true;
  return false;
}

double GptModel::moe_aux_loss() const {
  double sum = 0;
  for (const LayerActs& a : sets_[static_cast<size_t>(cur_)].acts)
    if (a.moe.aux.defined()) sum += a.moe.aux.to(Device::cpu()).data<float>()[0];
  return sum;
}

void GptModel::set_moe_loss_sink(const Tensor& sink, float weight) {
  DS_CHECK(!sink.defined() || (sink.dtype() == DType::F32 && sink.device() == dev_ && sink.numel() == 1),
           "moe loss sink: expected one f32 element on the model's device, got {} {}", dtype_name(sink.dtype()),
           shape_str(sink.shape()));
  moe_sink_ = sink;
  moe_sink_weight_ = weight;
}

void GptModel::moe_mlp(int l, const Tensor& x, const Tensor& y, MoeActs& m, const DropoutKey& key, int64_t seq) {
  const MoeParams& P = lp(l).moe;
  const MoeConfig& mc = cfg_.moe;
  const int64_t N = x.size(0), C = d_.C, E = d_.layer_experts(l), K = d_.topk;
  const int64_t Fin = (d_.swiglu ? 2 : 1) * d_.F;  // the PR-MoE dense branch's (replicated)
  const bool split = expert_tp();
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
  auto i32 = [&](Shape s) { return Tensor::empty(s, DType::I32, dev_); };
  // Router logits in f32 (DeepSpeed's gate runs in f32; here the GEMM runs in
  // the compute dtype and its output is widened).
  m.logits = f32({N, E});
  const Tensor lg = compute_ == DType::F32 ? m.logits : act({N, E});
  // Noisy gate policy Jitter (training): the router reads its input scaled
  // element-wise by uniforms in (1 - 1e-2, 1 + 1e-2), DeepSpeed's
  // multiplicative_jitter; the experts read it unscaled.
  m.gate_in = Tensor();
  if (key.train && mc.noisy_gate_policy == NoisyGatePolicy::Jitter) {
    m.gate_in = act({N, C});
    m.jitter_stream = moe_noise_stream(key, l) ^ 0x6a6974746572ull;  // "jitter"
    ops::moe_jitter({.out = m.gate_in, .inp = x, .eps = 1e-2f, .noise_seed = key.seed,
                     .noise_stream = m.jitter_stream},
                    stream_);
  }
  ops::matmul_forward({.out = lg, .inp = m.gate_in.defined() ? m.gate_in : x, .weight = w(P.gate), .bias = Tensor()},
                      stream_);
  if (compute_ != DType::F32) ops::cast({.out = m.logits, .inp = lg}, stream_);
  const int64_t capacity =
      mc.drop_tokens ? moe_capacity(N, E, static_cast<int>(K), key.train ? mc.train_capacity_factor
                                                                         : mc.eval_capacity_factor, mc.min_capacity)
                     : 0;
  m.gates = f32({N, E});
  m.expert = i32({N, K});
  m.slot = i32({N, K});
  m.weight = f32({N, K});
  m.counts = i32({E});
  m.aux = f32({1});
  ops::moe_gate_forward({.gates = m.gates,
                         .expert = m.expert,
                         .slot = m.slot,
                         .weight = m.weight,
                         .counts = m.counts,
                         .aux = m.aux,
                         .logits = m.logits,
                         .capacity = capacity,
                         .rts = K == 1 && mc.use_rts,
                         .rsample = K == 1 && key.train && mc.noisy_gate_policy == NoisyGatePolicy::RSample,
                         .second_sampling = K == 2 && mc.top2_2nd_expert_sampling,
                         .noise_seed = key.seed,
                         .noise_stream = moe_noise_stream(key, l),
                         .seq = seq},
                        stream_);
  // Rows per expert buffer: the capacity (no more than there are tokens), or
  // dropless the largest expert load (read back, as DeepSpeed does).
  int64_t rows = std::min(capacity, N);
  if (capacity == 0) {
    const Tensor counts = m.counts.device().is_cpu() ? m.counts : m.counts.to(Device::cpu());
    rows = *std::max_element(counts.data<int32_t>(), counts.data<int32_t>() + E);
  }
  rows = std::max<int64_t>(rows, 1);
  // Expert parallelism: every rank of the group sends and receives the same
  // number of rows per expert (dropless: the group's largest load).
  const EpComm& ep = stage_.ep;
  if (ep.active() && capacity == 0)
    rows = static_cast<int64_t>(ep.comm->all_reduce_scalar(static_cast<double>(rows), dev_, ReduceOp::Max));
  const Tensor wfc = w(P.fc.weight), wproj = w(P.proj);
  const int64_t El = wfc.size(0), Rl = rows * ep.size;  // local experts, rows each
  m.xout = act({E, rows, C});  // the experts' outputs, by this rank's tokens' experts
  Tensor xloc = m.xout, scratch;
  if (ep.active()) {
    const Tensor xtok = act({E, rows, C});
    scratch = act({E, rows, C});
    m.xin = act({El, Rl, C});
    ops::moe_dispatch_forward({.out = xtok, .inp = x, .expert = m.expert, .slot = m.slot}, stream_);
    experts_scatter(ep, xtok, scratch, m.xin);
    xloc = act({El, Rl, C});
  } else {
    m.xin = act({E, rows, C});
    ops::moe_dispatch_forward({.out = m.xin, .inp = x, .expert = m.expert, .slot = m.slot}, stream_);
  }
  m.fc_out = act({El, Rl, wfc.size(1)});  // (this rank's slice with expert tensor parallelism)
  m.act_out = act({El, Rl, wproj.size(2)});
  const Tensor bfc = opt(P.fc.bias, false);
  const std::vector<char> runs = experts_to_run(m, El, key.train || ep.active());
  for (int64_t e = 0; e < El; ++e) {
    if (!runs[static_cast<size_t>(e)]) continue;
    const Tensor pre = row(m.fc_out, e), out = row(m.act_out, e);
    ops::matmul_forward({.out = pre, .inp = row(m.xin, e), .weight = row(wfc, e),
                         .bias = bfc.defined() ? row(bfc, e) : Tensor()},
                        stream_);
    if (d_.swiglu)
      ops::swiglu_forward({.out = out, .inp = pre}, stream_);
    else
      ops::gelu_forward({.out = out, .inp = pre, .dout = Tensor()}, stream_);
    ops::matmul_forward({.out = row(xloc, e), .inp = out, .weight = row(wproj, e), .bias = Tensor()}, stream_);
  }
  if (ep.active()) experts_gather(ep, xloc, scratch, m.xout);
  if (!P.coef.weight.defined()) {
    ops::moe_combine_forward({.out = y, .inp = m.xout, .weight = m.weight, .expert = m.expert, .slot = m.slot},
                             stream_);
    if (split) reduce_from_tp_forward(tp_, y);
    return;
  }
  // PR-MoE: y = c0 * experts(x) + c1 * mlp(x), (c0, c1) = softmax(coefficient(x)).
  m.y_moe = act({N, C});
  ops::moe_combine_forward({.out = m.y_moe, .inp = m.xout, .weight = m.weight, .expert = m.expert, .slot = m.slot},
                           stream_);
  if (split) reduce_from_tp_forward(tp_, m.y_moe);
  m.res_fc = act({N, Fin});
  m.res_act = act({N, d_.F});
  m.y_res = act({N, C});
  ops::matmul_forward({.out = m.res_fc, .inp = x, .weight = w(P.res_fc.weight), .bias = opt(P.res_fc.bias, false)},
                      stream_);
  if (d_.swiglu)
    ops::swiglu_forward({.out = m.res_act, .inp = m.res_fc}, stream_);
  else
    ops::gelu_forward({.out = m.res_act, .inp = m.res_fc, .dout = Tensor()}, stream_);
  ops::matmul_forward({.out = m.y_res, .inp = m.res_act, .weight = w(P.res_proj), .bias = Tensor()}, stream_);
  m.coef = f32({N, 2});
  const Tensor cl = compute_ == DType::F32 ? m.coef : act({N, 2});
  ops::matmul_forward({.out = cl, .inp = x, .weight = w(P.coef.weight), .bias = w(P.coef.bias)}, stream_);
  if (compute_ != DType::F32) ops::cast({.out = m.coef, .inp = cl}, stream_);
  ops::moe_mix_forward({.out = y, .moe = m.y_moe, .mlp = m.y_res, .coef = m.coef}, stream_);
}

namespace {

// The Ulysses group as the sequence-parallel helpers' communicator: both
// shard the sequence in contiguous (B, T/P) blocks.
TpComm sequence_group(const SpComm& sp) {
  return TpComm{.comm = sp.comm, .size = sp.size, .rank = sp.rank, .sequence_parallel = true};
}

}  // namespace

void GptModel::moe_forward(int l, LayerActs& a, const Tensor& y, ResidualAdd add) {
  MoeActs& m = a.moe;
  const DropoutKey& key = S().key;
  const Tensor y2 = y.reshape({a.norm2_out.size(0), d_.C});
  // Sequence parallelism: the tp ranks' sequence first (every tp rank then
  // computes the same MoE output and keeps its rows).
  const Tensor x = tp_.sp() ? enter_tp(a.norm2_out) : a.norm2_out;
  const Tensor out = tp_.sp() ? moe_full_ : y2;
  if (sp_.active()) {  // Ulysses: the whole sequence through the MoE, then this rank's positions
    const TpComm u = sequence_group(sp_);
    sp_gather(u, B_, x, moe_ux_, moe_utmp_);
    moe_mlp(l, moe_ux_, moe_uy_, m, key, T_ * sp_.size);
    sp_take_shard(u, B_, moe_uy_, out);
  } else {
    moe_mlp(l, x, out, m, key, T_);
  }
  if (tp_.sp()) sp_take_shard(tp_, B_, moe_full_, y2);
  if (add == ResidualAdd::InLayer) dropout_add(y2, y2, a.resid_mid, hidden_dropout(l, DropoutSite::MlpOut));
  if (key.train && !recomputing_ && moe_sink_.defined() && moe_sink_weight_ != 0.f) {  // the step's "moe loss"
    ops::scale({.x = m.aux, .s = moe_sink_weight_}, stream_);
    ops::add({.out = moe_sink_, .a = moe_sink_, .b = m.aux}, stream_);
  }
}

Tensor GptModel::moe_backward(int l, LayerActs& a, const Tensor& dresid) {
  const Tensor dy = dropout_grad(dresid, hidden_dropout(l, DropoutSite::MlpOut));
  // Sequence parallelism: the whole sequence's output gradient and input
  // again, the MoE backward on all of it (every tp rank the same), this
  // rank's rows of the input gradient. The weights' gradients are complete
  // on every rank (replicated, like the forward).
  Tensor dyl = dy.reshape({a.norm2_out.size(0), d_.C});
  if (tp_.sp()) {
    sp_gather(tp_, B_, dy, moe_full_, sp_tmp_);
    dyl = moe_full_;
  }
  if (sp_.active()) {  // Ulysses: the whole sequence again, the gradients scaled (see the top)
    const TpComm u = sequence_group(sp_);
    const float U = static_cast<float>(sp_.size);
    sp_gather(u, B_, dyl, moe_uy_, moe_utmp_);
    ops::scale({.x = moe_uy_, .s = 1.f / U}, stream_);
    sp_gather(u, B_, tp_.sp() ? enter_tp(a.norm2_out) : a.norm2_out, moe_ux_, moe_utmp_);
    moe_mlp_backward(l, a, moe_ux_, moe_uy_, moe_udx_);
    sp_take_shard(u, B_, moe_udx_, dnorm_);
    ops::scale({.x = dnorm_, .s = U}, stream_);
  } else {
    moe_mlp_backward(l, a, tp_.sp() ? enter_tp(a.norm2_out) : a.norm2_out, dyl, dnorm_);
  }
  if (!tp_.sp()) return dnorm_;
  sp_take_shard(tp_, B_, dnorm_, dnorm_sh_);
  return dnorm_sh_;
}

// Down to dx (the gradient of x, complete on every tp rank).
void GptModel::moe_mlp_backward(int l, LayerActs& a, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const MoeParams& P = lp(l).moe;
  MoeActs& m = a.moe;
  const int64_t N = x.size(0), C = d_.C, E = d_.layer_experts(l), K = d_.topk;
  // rows: per expert buffer on the token side; Rl, El: of this rank's experts
  // (all of them without expert parallelism, then Rl == rows).
  const int64_t rows = m.xout.size(1), El = m.xin.size(0), Rl = m.xin.size(1), Fin = m.fc_out.size(2);
  const EpComm& ep = stage_.ep;
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  auto act = [&](Shape s) { return Tensor::empty(s, compute_, dev_); };
  const bool residual = P.coef.weight.defined();
  Tensor dy_moe = dy, dy_res, dcoef;
  if (residual) {  // PR-MoE: the mix's gradients to both branches and the coefficients
    dy_moe = act({N, C});
    dy_res = act({N, C});
    dcoef = f32({N, 2});
    ops::moe_mix_backward({.dmoe = dy_moe, .dmlp = dy_res, .dcoef = dcoef, .dout = dy, .moe = m.y_moe, .mlp = m.y_res,
                           .coef = m.coef},
                          stream_);
  }
  const Tensor dxout = act({E, rows, C}), dweight = f32({N, K});
  ops::moe_combine_backward({.dinp = dxout, .dweight = dweight, .dout = dy_moe, .inp = m.xout, .weight = m.weight,
                             .expert = m.expert, .slot = m.slot},
                            stream_);
  const bool split = expert_tp();
  if (split) reduce_from_tp_forward(tp_, dweight);  // m.xout holds this rank's partial sums
  const Tensor wfc = w(P.fc.weight), wproj = w(P.proj), dwfc = dw(P.fc.weight), dwproj = dw(P.proj);
  const Tensor dbfc = opt(P.fc.bias, true);
  Tensor dloc = dxout, scratch;
  if (ep.active()) {  // the outputs' gradients to the experts' ranks
    scratch = act({E, rows, C});
    dloc = act({El, Rl, C});
    experts_scatter(ep, dxout, scratch, dloc);
  }
  const Tensor dxin = act({El, Rl, C}), dact = act({Rl, m.act_out.size(2)}), dfc = act({Rl, Fin});
  for (int64_t e = 0; e < El; ++e) {
    ops::matmul_backward({.dinp = dact,
                          .dweight = row(dwproj, e),
                          .dbias = Tensor(),
                          .dout = row(dloc, e),
                          .inp = row(m.act_out, e),
                          .weight = row(wproj, e),
                          .accum = Accum::Overwrite},
                         stream_);
    if (d_.swiglu)
      ops::swiglu_backward({.dinp = dfc, .dout = dact, .inp = row(m.fc_out, e)}, stream_);
    else
      ops::gelu_backward({.out = dfc, .inp = row(m.fc_out, e), .dout = dact}, stream_);
    ops::matmul_backward({.dinp = row(dxin, e),
                          .dweight = row(dwfc, e),
                          .dbias = dbfc.defined() ? row(dbfc, e) : Tensor(),
                          .dout = dfc,
                          .inp = row(m.xin, e),
                          .weight = row(wfc, e),
                          .accum = Accum::Overwrite},
                         stream_);
  }
  Tensor dtok = dxin;
  if (ep.active()) {  // the inputs' gradients back to the tokens' ranks
    dtok = act({E, rows, C});
    experts_gather(ep, dxin, scratch, dtok);
  }
  ops::moe_dispatch_backward({.dinp = dx, .dout = dtok, .expert = m.expert, .slot = m.slot}, stream_);
  if (split) reduce_from_tp_forward(tp_, dx);  // each rank's experts' slices gave part of it
  // The router: through the combine weights and l_aux to the logits, then the gate GEMM.
  const Tensor dlogits = f32({N, E});
  ops::moe_gate_backward(
      {.dlogits = dlogits, .dweight = dweight, .gates = m.gates, .expert = m.expert, .slot = m.slot, .daux = aux_grad_},
      stream_);
  Tensor dlg = dlogits;
  if (compute_ != DType::F32) {
    dlg = act({N, E});
    ops::cast({.out = dlg, .inp = dlogits}, stream_);
  }
  if (m.gate_in.defined()) {  // Jitter: through the router to its scaled input, then the same scaling
    const Tensor dgi = act({N, C});
    ops::matmul_backward({.dinp = dgi,
                          .dweight = dw(P.gate),
                          .dbias = Tensor(),
                          .dout = dlg,
                          .inp = m.gate_in,
                          .weight = w(P.gate),
                          .accum = Accum::Overwrite},
                         stream_);
    ops::moe_jitter({.out = dgi, .inp = dgi, .eps = 1e-2f, .noise_seed = S().key.seed,
                     .noise_stream = m.jitter_stream},
                    stream_);
    ops::add({.out = dx, .a = dx, .b = dgi}, stream_);
  } else {
    ops::matmul_backward({.dinp = dx,
                          .dweight = dw(P.gate),
                          .dbias = Tensor(),
                          .dout = dlg,
                          .inp = x,
                          .weight = w(P.gate),
                          .accum = Accum::Add},
                         stream_);
  }
  if (!residual) return;
  // PR-MoE: the dense MLP and the coefficient linear, both adding into dx.
  const Tensor rdact = act({N, m.res_act.size(1)}), rdfc = act({N, m.res_fc.size(1)});
  ops::matmul_backward({.dinp = rdact,
                        .dweight = dw(P.res_proj),
                        .dbias = Tensor(),
                        .dout = dy_res,
                        .inp = m.res_act,
                        .weight = w(P.res_proj),
                        .accum = Accum::Overwrite},
                       stream_);
  if (d_.swiglu)
    ops::swiglu_backward({.dinp = rdfc, .dout = rdact, .inp = m.res_fc}, stream_);
  else
    ops::gelu_backward({.out = rdfc, .inp = m.res_fc, .dout = rdact}, stream_);
  ops::matmul_backward({.dinp = dx,
                        .dweight = dw(P.res_fc.weight),
                        .dbias = opt(P.res_fc.bias, true),
                        .dout = rdfc,
                        .inp = x,
                        .weight = w(P.res_fc.weight),
                        .accum = Accum::Add},
                       stream_);
  Tensor dcl = dcoef;
  if (compute_ != DType::F32) {
    dcl = act({N, 2});
    ops::cast({.out = dcl, .inp = dcoef}, stream_);
  }
  ops::matmul_backward({.dinp = dx,
                        .dweight = dw(P.coef.weight),
                        .dbias = dw(P.coef.bias),
                        .dout = dcl,
                        .inp = x,
                        .weight = w(P.coef.weight),
                        .accum = Accum::Add},
                       stream_);
}

}  // namespace ds
