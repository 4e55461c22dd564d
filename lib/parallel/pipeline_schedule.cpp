// Megatron-LM's pipeline schedules (forward_backward_pipelining_without_ and
// _with_interleaving) written out as per-rank action lists. The schedule
// builders decide *where* a receive is posted exactly as Megatron does; which
// (micro, chunk) a receive carries is then fixed by channel order (the k-th
// receive of activations is the input of the k-th Forward that needs one),
// which the simulator (test/parallel/pipeline_sim.h) checks against what the
// neighbour actually sends.
#include "lib/parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <fmt/format.h>
#include <map>
#include <tuple>

#include "lib/core/error.h"

namespace ds {

bool is_communication(ActionKind kind) {
  return kind != ActionKind::Forward && !is_backward(kind) && kind != ActionKind::WeightGrad;
}

bool is_backward(ActionKind kind) { return kind == ActionKind::Backward || kind == ActionKind::BackwardInput; }

bool is_zero_bubble(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleH1Exact;
}

ScheduleKind pipeline_schedule_kind(int virtual_stages, bool zbh1, bool zbh1_exact) {
  if (virtual_stages > 1) return ScheduleKind::Interleaved1F1B;
  if (zbh1) return zbh1_exact ? ScheduleKind::ZeroBubbleH1Exact : ScheduleKind::ZeroBubbleH1;
  return ScheduleKind::OneFOneB;
}

std::string to_string(const PipeAction& a, int virtual_stages) {
  const char* name = "";
  switch (a.kind) {
    case ActionKind::RecvForward: name = "RecvF"; break;
    case ActionKind::Forward: name = "F"; break;
    case ActionKind::SendForward: name = "SendF"; break;
    case ActionKind::RecvBackward: name = "RecvB"; break;
    case ActionKind::Backward: name = "B"; break;
    case ActionKind::SendBackward: name = "SendB"; break;
    case ActionKind::BackwardInput: name = "BI"; break;
    case ActionKind::WeightGrad: name = "W"; break;
  }
  if (virtual_stages > 1) return fmt::format("{}{}.{}", name, a.micro, a.chunk);
  return fmt::format("{}{}", name, a.micro);
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved-1f1b";
    case ScheduleKind::ZeroBubbleH1: return "zbh1";
    case ScheduleKind::ZeroBubbleH1Exact: return "zbh1-exact";
  }
  return "?";
}

namespace {

void validate(ScheduleKind kind, int pp, int n_micro, int v) {
  DS_USER_CHECK(pp >= 1, "pipeline-model-parallel-size must be >= 1, got {}", pp);
  DS_USER_CHECK(n_micro >= 1, "number of micro-batches must be >= 1, got {}", n_micro);
  DS_USER_CHECK(v >= 1, "virtual pipeline stages per rank must be >= 1, got {}", v);
  if (kind != ScheduleKind::Interleaved1F1B) {
    DS_USER_CHECK(v == 1,
                  "the {} schedule holds one model chunk per rank, got {} virtual stages "
                  "per rank; use the interleaved schedule",
                  is_zero_bubble(kind) ? "ZB-H1" : "1F1B", v);
    return;
  }
  DS_USER_CHECK(pp >= 2,
                "the interleaved schedule needs pipeline-model-parallel-size >= 2, got {}", pp);
  DS_USER_CHECK(n_micro % pp == 0,
                "number of micro-batches ({}) is not divisible by pipeline-model-parallel-size "
                "({}) with the interleaved schedule; pick a global batch size giving a "
                "multiple of {} micro-batches",
                n_micro, pp, pp);
}

void validate_stage(int pp, int stage) {
  DS_USER_CHECK(stage >= 0 && stage < pp,
                "pipeline stage {} is outside [0, {}) for pipeline-model-parallel-size {}",
                stage, pp, pp);
}

int floor_mod(int a, int b) { return ((a % b) + b) % b; }

// Megatron's numbering of the n_micro * v forward (or backward) passes of a
// rank in the interleaved schedule: groups of pp micro-batches run through
// chunk 0, 1, ... v-1 (backward: v-1 ... 0) before the next group starts.
struct Interleave {
  int pp, v;
  int chunk_of(int k, bool forward) const {
    int c = floor_mod(k, pp * v) / pp;
    return forward ? c : v - 1 - c;
  }
  int micro_of(int k) const { return (k / (pp * v)) * pp + k % pp; }
};

// Appends actions of one rank; sends a virtual stage must not do are dropped
// here, receives are appended as slots and given their tags in finish().
class Builder {
 public:
  Builder(int pp, int stage, int v) : pp_(pp), stage_(stage), v_(v) {}

  bool first_virtual(int c) const { return stage_ == 0 && c == 0; }
  bool last_virtual(int c) const { return stage_ == pp_ - 1 && c == v_ - 1; }

  void forward(int m, int c) { out_.push_back({ActionKind::Forward, m, c}); }
  void backward(int m, int c) { out_.push_back({ActionKind::Backward, m, c}); }
  void send_forward(int m, int c) {
    if (!last_virtual(c)) out_.push_back({ActionKind::SendForward, m, c});
  }
  void send_backward(int m, int c) {
    if (!first_virtual(c)) out_.push_back({ActionKind::SendBackward, m, c});
  }
  void recv_forward() { out_.push_back({ActionKind::RecvForward, -1, -1}); }
  void recv_backward() { out_.push_back({ActionKind::RecvBackward, -1, -1}); }

  // Tags the k-th RecvForward with the k-th Forward that needs an input and
  // the k-th RecvBackward with the k-th Backward that needs an output gradient.
  std::vector<PipeAction> finish() {
    std::vector<PipeAction> fwd_needs, bwd_needs;
    for (const PipeAction& a : out_) {
      if (a.kind == ActionKind::Forward && !first_virtual(a.chunk)) fwd_needs.push_back(a);
      if (a.kind == ActionKind::Backward && !last_virtual(a.chunk)) bwd_needs.push_back(a);
    }
    size_t nf = 0, nb = 0;
    for (PipeAction& a : out_) {
      if (a.kind == ActionKind::RecvForward) {
        DS_CHECK(nf < fwd_needs.size(), "stage {}: more activation receives than inputs", stage_);
        a.micro = fwd_needs[nf].micro, a.chunk = fwd_needs[nf].chunk, ++nf;
      } else if (a.kind == ActionKind::RecvBackward) {
        DS_CHECK(nb < bwd_needs.size(), "stage {}: more gradient receives than outputs", stage_);
        a.micro = bwd_needs[nb].micro, a.chunk = bwd_needs[nb].chunk, ++nb;
      }
    }
    DS_CHECK(nf == fwd_needs.size() && nb == bwd_needs.size(),
             "stage {}: {} of {} inputs and {} of {} gradients received", stage_, nf,
             fwd_needs.size(), nb, bwd_needs.size());
    return std::move(out_);
  }

 private:
  int pp_, stage_, v_;
  std::vector<PipeAction> out_;
};

// PipeDream-Flush: warmup forwards, then one forward + one backward per step,
// then the cooldown backwards (Megatron's ..._without_interleaving).
std::vector<PipeAction> one_f_one_b(int pp, int stage, int n_micro) {
  Builder b(pp, stage, 1);
  const bool first = stage == 0, last = stage == pp - 1;
  const int warmup = warmup_micro_batches(ScheduleKind::OneFOneB, pp, stage, n_micro);
  const int remaining = n_micro - warmup;
  for (int i = 0; i < warmup; ++i) {
    if (!first) b.recv_forward();
    b.forward(i, 0);
    b.send_forward(i, 0);
  }
  if (remaining > 0 && !first) b.recv_forward();
  for (int i = 0; i < remaining; ++i) {
    b.forward(warmup + i, 0);
    b.send_forward(warmup + i, 0);
    if (!last) b.recv_backward();
    b.backward(i, 0);
    b.send_backward(i, 0);
    if (i != remaining - 1 && !first) b.recv_forward();
  }
  for (int i = 0; i < warmup; ++i) {
    if (!last) b.recv_backward();
    b.backward(remaining + i, 0);
    b.send_backward(remaining + i, 0);
  }
  return b.finish();
}

// ZB-H1 (Megatron-DeepSpeed's ZeroBubbleH1Pipeline) as a rewrite of the
// stage's 1F1B list: the same forwards, messages and backward order, each
// backward j (micro-batch j) either whole or an input pass whose weight pass
// runs later. Upstream's sections, in 1F1B's terms (s = stage, r = the
// steady phase's length, n_micro - warmup):
//   j < r, j < s          input pass only (its weight pass waits)
//   j < r, j == r - 1     input pass, then the oldest pending weight pass
//   j < r, otherwise      whole backward; exact: as the line above
//   j >= r (cooldown)     input pass, then the oldest pending weight pass
// and the weight passes still pending at the end. Stage 0 runs whole
// backwards throughout (nothing waits on its input gradient). A weight pass
// runs right before the next compute, after the messages that follow its
// input pass have been posted, so it overlaps them.
std::vector<PipeAction> zero_bubble_h1(int pp, int stage, int n_micro, bool exact) {
  std::vector<PipeAction> base = one_f_one_b(pp, stage, n_micro);
  if (stage == 0) return base;
  const int steady = n_micro - warmup_micro_batches(ScheduleKind::OneFOneB, pp, stage, n_micro);
  std::vector<PipeAction> out;
  std::deque<int> pending;
  bool weight_due = false;
  auto weight_pass = [&] {
    out.push_back({ActionKind::WeightGrad, pending.front(), 0});
    pending.pop_front();
    weight_due = false;
  };
  for (const PipeAction& a : base) {
    if (!is_communication(a.kind) && weight_due) weight_pass();
    if (a.kind != ActionKind::Backward) {
      out.push_back(a);
      continue;
    }
    const int j = a.micro;  // 1F1B's backwards run in micro-batch order
    const bool input_only = j >= steady || j < stage || j == steady - 1 || exact;
    if (!input_only) {
      out.push_back(a);
      continue;
    }
    out.push_back({ActionKind::BackwardInput, j, 0});
    pending.push_back(j);
    weight_due = !(j < steady && j < stage);
  }
  while (!pending.empty()) weight_pass();
  return out;
}

// Steady phase of the interleaved schedule: forward k + warmup, backward k,
// then one batch of sends and receives (Megatron's ..._with_interleaving).
void interleaved_steady(Builder& b, const Interleave& il, int stage, int warmup, int remaining) {
  const bool first = stage == 0, last = stage == il.pp - 1;
  for (int k = 0; k < remaining; ++k) {
    const int fk = k + warmup;
    const int f_chunk = il.chunk_of(fk, true), b_chunk = il.chunk_of(k, false);
    b.forward(il.micro_of(fk), f_chunk);
    b.backward(il.micro_of(k), b_chunk);
    b.send_forward(il.micro_of(fk), f_chunk);
    b.send_backward(il.micro_of(k), b_chunk);
    // The first rank runs pp - 1 forwards ahead of the last one, which sends
    // nothing from its last chunk; likewise backwards on the last rank.
    bool recv_prev = !first || il.chunk_of(fk - (il.pp - 1), true) != il.v - 1;
    const bool recv_next = !last || il.chunk_of(k - (il.pp - 1), false) != 0;
    if (k == remaining - 1) recv_prev = false;
    if (recv_prev) b.recv_forward();
    if (recv_next) b.recv_backward();
  }
}

std::vector<PipeAction> interleaved(int pp, int stage, int n_micro, int v) {
  Builder b(pp, stage, v);
  const Interleave il{pp, v};
  const bool first = stage == 0, last = stage == pp - 1;
  const int total = n_micro * v;
  const bool all_warmup = n_micro == pp;
  const int warmup = warmup_micro_batches(ScheduleKind::Interleaved1F1B, pp, stage, n_micro, v);
  const int remaining = total - warmup;

  if (!first) b.recv_forward();
  for (int k = 0; k < warmup; ++k) {
    b.forward(il.micro_of(k), il.chunk_of(k, true));
    b.send_forward(il.micro_of(k), il.chunk_of(k, true));
    bool recv_prev = !(first && il.chunk_of(k + 1, true) == 0);
    if (k == total - 1) recv_prev = false;
    if (recv_prev) b.recv_forward();
    // The last warmup step also fetches the gradient of the first backward.
    if (k == warmup - 1 && !all_warmup && !last) b.recv_backward();
  }
  interleaved_steady(b, il, stage, warmup, remaining);
  if (all_warmup && !last) b.recv_backward();
  for (int k = remaining; k < total; ++k) {
    b.backward(il.micro_of(k), il.chunk_of(k, false));
    b.send_backward(il.micro_of(k), il.chunk_of(k, false));
    bool recv_next = !(last && il.chunk_of(k + 1, false) == v - 1);
    if (k == total - 1) recv_next = false;
    if (recv_next) b.recv_backward();
  }
  return b.finish();
}

}  // namespace

std::vector<PipeAction> make_schedule(ScheduleKind kind, int pp, int stage, int n_micro,
                                      int virtual_stages) {
  validate(kind, pp, n_micro, virtual_stages);
  validate_stage(pp, stage);
  if (kind == ScheduleKind::OneFOneB) return one_f_one_b(pp, stage, n_micro);
  if (is_zero_bubble(kind))
    return zero_bubble_h1(pp, stage, n_micro, kind == ScheduleKind::ZeroBubbleH1Exact);
  return interleaved(pp, stage, n_micro, virtual_stages);
}

std::vector<std::vector<PipeAction>> make_all_schedules(ScheduleKind kind, int pp, int n_micro,
                                                        int virtual_stages) {
  validate(kind, pp, n_micro, virtual_stages);
  std::vector<std::vector<PipeAction>> all;
  for (int s = 0; s < pp; ++s) all.push_back(make_schedule(kind, pp, s, n_micro, virtual_stages));
  return all;
}

int warmup_micro_batches(ScheduleKind kind, int pp, int stage, int n_micro, int virtual_stages) {
  validate(kind, pp, n_micro, virtual_stages);
  validate_stage(pp, stage);
  if (kind != ScheduleKind::Interleaved1F1B) return std::min(pp - stage - 1, n_micro);
  const int total = n_micro * virtual_stages;
  if (n_micro == pp) return total;
  return std::min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp, total);
}

int max_live_activations(ScheduleKind kind, int pp, int stage, int n_micro, int virtual_stages) {
  const int warmup = warmup_micro_batches(kind, pp, stage, n_micro, virtual_stages);
  return std::min(warmup + 1, n_micro * virtual_stages);
}

int max_pending_weight_grads(ScheduleKind kind, int pp, int stage, int n_micro) {
  if (!is_zero_bubble(kind)) return 0;
  int pending = 0, peak = 0;
  for (const PipeAction& a : make_schedule(kind, pp, stage, n_micro)) {
    pending += a.kind == ActionKind::BackwardInput ? 1 : a.kind == ActionKind::WeightGrad ? -1 : 0;
    peak = std::max(peak, pending);
  }
  return peak;
}

double bubble_fraction(ScheduleKind kind, int pp, int n_micro, int virtual_stages) {
  validate(kind, pp, n_micro, virtual_stages);
  if (is_zero_bubble(kind)) return double(pp - 1) / (3.0 * n_micro);
  return double(pp - 1) / double(n_micro) / double(virtual_stages);
}

int virtual_stage_index(int pp, int rank, int chunk) { return chunk * pp + rank; }

VirtualStage locate_virtual_stage(int pp, int virtual_stages, int s) {
  DS_CHECK(pp >= 1 && virtual_stages >= 1 && s >= 0 && s < pp * virtual_stages,
           "virtual stage {} outside [0, {}) (pp {}, virtual stages {})", s, pp * virtual_stages,
           pp, virtual_stages);
  return {s % pp, s / pp};
}

VirtualStage forward_peer(int pp, int virtual_stages, int rank, int chunk) {
  return locate_virtual_stage(pp, virtual_stages, virtual_stage_index(pp, rank, chunk) + 1);
}

VirtualStage backward_peer(int pp, int virtual_stages, int rank, int chunk) {
  return locate_virtual_stage(pp, virtual_stages, virtual_stage_index(pp, rank, chunk) - 1);
}

}  // namespace ds
