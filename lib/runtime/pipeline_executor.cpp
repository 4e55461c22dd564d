// The 1F1B / interleaved 1F1B pipeline executor: compute actions on the
// model's chunks, batches of point-to-point messages on the pipeline
// communicator(s) (activations on channel 0, gradients on channel 1), all
// issued asynchronously following make_p2p_plan; a compute waits only for the
// batches holding what it reads or frees.
#include "lib/runtime/pipeline_executor.h"

#include <set>

#include "lib/core/error.h"

namespace ds {

PipelineExecutor::PipelineExecutor(GptModel& model, Communicator& pp, int n_micro, Communicator* pp_grad,
                                   bool overlap, bool zbh1, bool zbh1_exact)
    : model_(model), pp_(pp), stage_(pp.rank()), n_stages_(pp.size()), n_micro_(n_micro),
      vp_(model.layout().shard.vp), pp_grad_(pp_grad) {
  DS_CHECK(!zbh1 || vp_ == 1, "pipeline: ZB-H1 with {} virtual stages", vp_);
  kind_ = pipeline_schedule_kind(vp_, zbh1, zbh1_exact);
  actions_ = make_schedule(kind_, n_stages_, stage_, n_micro_, vp_);
  overlap_ = overlap && n_stages_ > 1;
  if (overlap_)
    DS_CHECK(pp_grad && pp_grad->size() == pp.size() && pp_grad->rank() == pp.rank(),
             "pipeline stage {}: overlapping needs a second pipeline communicator", stage_);
  plan_ = make_p2p_plan(actions_, kind_, overlap_);
  max_live_ = max_live_activations(kind_, n_stages_, stage_, n_micro_, vp_);
  model_.set_activation_slots(max_live_);
  // NCCL sets a point-to-point direction between two ranks up on its first
  // use, and the host's ncclGroupEnd of that first use waits until the peer
  // posts the opposite end. The schedule's first posts (receives posted
  // early, on two communicators with overlap_comm) can then wait on each
  // other across stages for good (1F1B with fewer micro-batches than
  // stages, interleaved with as many). One symmetric exchange with every
  // neighbour on each communicator sets every link up before the first step.
  if (n_stages_ > 1) {
    connect_links(pp_);
    if (overlap_) connect_links(*pp_grad_);
  }
}

void PipelineExecutor::connect_links(Communicator& comm) {
  std::set<int> peers;  // symmetric: whoever this stage sends to or receives from
  for (int c = 0; c < vp_; ++c) {
    const int s = virtual_stage_index(n_stages_, stage_, c);
    if (s + 1 < n_stages_ * vp_) peers.insert(forward_peer(n_stages_, vp_, stage_, c).rank);
    if (s > 0) peers.insert(backward_peer(n_stages_, vp_, stage_, c).rank);
  }
  peers.erase(stage_);
  if (peers.empty()) return;
  Tensor buf = Tensor::zeros({2 * static_cast<int64_t>(peers.size())}, DType::F32, model_.device());
  std::vector<P2POp> ops;
  int64_t i = 0;
  for (int peer : peers) {
    ops.push_back({.is_send = true, .data = buf.view(i++, {1}).raw(), .count = 1, .dtype = DType::F32, .peer = peer});
    ops.push_back({.is_send = false, .data = buf.view(i++, {1}).raw(), .count = 1, .dtype = DType::F32, .peer = peer});
  }
  comm.batch_send_recv(ops);
}

int PipelineExecutor::slot_of(int k, bool allocate) {
  auto it = slots_.find(k);
  if (it != slots_.end()) return it->second;
  DS_CHECK(allocate, "pipeline stage {}: (micro, chunk) {} has no activations", stage_, k);
  DS_CHECK(!free_slots_.empty(), "pipeline stage {}: more than {} activation sets in flight", stage_, max_live_);
  const int s = free_slots_.back();
  free_slots_.pop_back();
  slots_[k] = s;
  return s;
}

void PipelineExecutor::free_slot(int k) {
  free_slots_.push_back(slot_of(k, false));
  slots_.erase(k);
}

const MicroBatch& PipelineExecutor::micro_batch(int micro) {
  auto it = batches_.find(micro);
  if (it == batches_.end()) it = batches_.emplace(micro, (*batch_fn_)(micro)).first;
  DS_CHECK(!it->second.lengths.defined(), "pipeline parallelism: micro-batches with right-padding lengths");
  return it->second;
}

Tensor PipelineExecutor::activation_buffer(const MicroBatch& mb) {
  return Tensor::empty({mb.tokens.size(0), model_.local_seq(mb.tokens.size(1)), model_.dims().C}, model_.compute_dtype(),
                       model_.device());
}

// One batch of the plan, issued asynchronously on the queue's communicator.
CommHandle PipelineExecutor::post(const P2PPlanStep& step) {
  std::vector<P2POp> ops;
  std::vector<Tensor> keep;  // alive (and, on the GPU, not reused) until the batch ran
  std::string names;
  for (const PipeAction& a : step.batch) {
    const MicroBatch& mb = micro_batch(a.micro);
    const int64_t B = mb.tokens.size(0), T = mb.tokens.size(1);
    const bool fwd_link = a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvBackward;
    const int next = fwd_link ? forward_peer(n_stages_, vp_, stage_, a.chunk).rank : -1;
    const int prev = fwd_link ? -1 : backward_peer(n_stages_, vp_, stage_, a.chunk).rank;
    Tensor t;
    int peer = stage_, channel = 0;
    switch (a.kind) {
      case ActionKind::RecvForward: t = fwd_in_[key(a)] = activation_buffer(mb); peer = prev; break;
      case ActionKind::SendForward: t = model_.stage_output(slot_of(key(a), false), a.chunk); peer = next; break;
      case ActionKind::RecvBackward:
        t = grad_in_[key(a)] = activation_buffer(mb);
        peer = next;
        channel = 1;
        break;
      case ActionKind::SendBackward: t = grad_out_.at(key(a)); peer = prev; channel = 1; break;
      default: DS_THROW("pipeline stage {}: {} is not a communication", stage_, to_string(a, vp_));
    }
    DS_CHECK(t.numel() == B * model_.local_seq(T) * model_.dims().C, "pipeline stage {}: {} buffer of {} elements", stage_,
             to_string(a, vp_), t.numel());
    P2POp op;
    op.is_send = a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward;
    op.data = t.raw();
    op.count = t.numel();
    op.dtype = t.dtype();
    op.peer = peer;
    op.channel = channel;
    ops.push_back(op);
    keep.push_back(t);
    if (a.kind == ActionKind::SendBackward) grad_out_.erase(key(a));  // `keep` holds it now
    performed_.push_back(a);
    if (!names.empty()) names += ' ';
    names += to_string(a, vp_);
  }
  Communicator& comm = step.queue == 1 && overlap_ ? *pp_grad_ : pp_;
  if (!timeline_ || !timeline_->enabled()) return comm.ibatch_send_recv(std::move(ops), std::move(keep));
  for (const P2POp& op : ops)
    DS_CHECK(op.peer >= 0 && op.peer < comm.size() && op.peer != comm.rank(), "pipeline stage {}: p2p peer {}", stage_,
             op.peer);
  Timeline* tl = timeline_;
  Communicator* c = &comm;
  const double issued = tl->now_us();
  return comm.submit(
      "batch_send_recv",
      [tl, c, ops = std::move(ops), names = std::move(names), issued] {
        const double t0 = tl->now_us();
        c->batch_send_recv(ops);
        tl->add({"p2p " + names, "comm", 1, issued, t0, tl->now_us()});
      },
      std::move(keep));
}

void PipelineExecutor::compute(const PipeAction& a) {
  const MicroBatch& mb = micro_batch(a.micro);
  const int k = key(a);
  const bool first_virtual = stage_ == 0 && a.chunk == 0;
  if (a.kind == ActionKind::Forward) {
    DropoutKey key = key_;
    key.first_sample = mb.first_sample;
    if (mb.step_key.defined()) key.step = mb.step_key;
    const int slot = slot_of(k, true);
    if (auto in = fwd_in_.find(k); in != fwd_in_.end()) {
      model_.stage_input(slot, a.chunk, mb.tokens.size(0), mb.tokens.size(1)).copy_from(in->second);
      fwd_in_.erase(in);
    }
    loss_sum_ += model_.stage_forward(slot, a.chunk, mb.tokens, mb.targets, loss_weight_ * mb.loss_weight_scale, true,
                                     key);
    return;
  }
  if (a.kind == ActionKind::WeightGrad) {
    model_.stage_weight_grads();
    return;
  }
  auto g = grad_in_.find(k);
  model_.stage_backward(slot_of(k, false), a.chunk, mb.tokens, g != grad_in_.end() ? g->second : Tensor(),
                        a.kind == ActionKind::BackwardInput);
  if (g != grad_in_.end()) grad_in_.erase(g);
  free_slot(k);
  if (!first_virtual) {  // keep the input gradient until its SendBackward
    Tensor out = activation_buffer(mb);
    out.copy_from(model_.stage_input_grad());
    grad_out_[k] = out;
  }
}

void PipelineExecutor::train(const MicroBatchFeed& feed, int n, float loss_weight, const DropoutKey& key) {
  DS_CHECK(n == n_micro_, "pipeline: {} micro-batches in a step scheduled for {}", n, n_micro_);
  train(feed, loss_weight, key);
}

double PipelineExecutor::train(const MicroBatchFeed& batch, float loss_weight, const DropoutKey& key) {
  batch_fn_ = &batch;
  loss_weight_ = loss_weight;
  key_ = key;
  loss_sum_ = 0;
  performed_.clear();
  posted_.clear();
  slots_.clear();
  batches_.clear();
  fwd_in_.clear();
  grad_in_.clear();
  grad_out_.clear();
  free_slots_.clear();
  for (int s = max_live_ - 1; s >= 0; --s) free_slots_.push_back(s);
  const bool timed = timeline_ && timeline_->enabled();
  for (const P2PPlanStep& step : plan_) {
    if (step.kind == P2PPlanStep::Kind::Post) {
      posted_.push_back(post(step));
      continue;
    }
    for (int w : step.waits) posted_.at(w).wait();
    if (last_backward_hook_ && kind_ == ScheduleKind::OneFOneB && step.compute.kind == ActionKind::Backward &&
        step.compute.micro == n_micro_ - 1)
      last_backward_hook_();
    const double t0 = timed ? timeline_->now_us() : 0;
    compute(step.compute);
    if (timed) timeline_->add({"pipeline " + to_string(step.compute, vp_), "compute", 0, t0, t0, timeline_->now_us()});
    performed_.push_back(step.compute);
  }
  for (CommHandle& h : posted_) h.wait();  // the last sends
  posted_.clear();
  DS_CHECK(slots_.empty() && grad_out_.empty() && fwd_in_.empty() && grad_in_.empty() &&
               model_.pending_weight_grads() == 0,
           "pipeline stage {}: activations left after the schedule", stage_);
  batch_fn_ = nullptr;
  batches_.clear();
  return loss_sum_;
}

// Micro-batch after micro-batch, chunk after chunk: each virtual stage
// receives, runs and passes on (a chain of blocking send/recv).
double PipelineExecutor::forward_only(const MicroBatchFeed& batch, int n) {
  double sum = 0;
  const int last_virtual = n_stages_ * vp_ - 1;
  for (int m = 0; m < n; ++m) {
    MicroBatch mb = batch(m);
    DS_CHECK(!mb.lengths.defined(), "pipeline parallelism: micro-batches with right-padding lengths");
    const int64_t B = mb.tokens.size(0), T = mb.tokens.size(1);
    for (int c = 0; c < vp_; ++c) {
      const int v = virtual_stage_index(n_stages_, stage_, c);
      if (v > 0) pp_.recv(model_.stage_input(0, c, B, T), backward_peer(n_stages_, vp_, stage_, c).rank);
      sum += model_.stage_forward(0, c, mb.tokens, mb.targets, 0.f, false, {});
      if (v < last_virtual) pp_.send(model_.stage_output(0, c), forward_peer(n_stages_, vp_, stage_, c).rank);
    }
  }
  return sum;
}

}  // namespace ds
