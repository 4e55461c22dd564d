// Megatron-LM's pipeline schedules (forward_backward_pipelining_without_ and
// _with_interleaving) written out as per-rank action lists, plus the simulator
// that plays the lists of all ranks against each other. The schedule builders
// decide *where* a receive is posted exactly as Megatron does; which (micro,
// chunk) a receive carries is then fixed by channel order (the k-th receive of
// activations is the input of the k-th Forward that needs one), which the
// simulator checks against what the neighbour actually sends.
#include "lib/parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <fmt/format.h>
#include <map>
#include <tuple>

#include "lib/core/error.h"

namespace ds {

bool is_communication(ActionKind kind) {
  return kind != ActionKind::Forward && kind != ActionKind::Backward;
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
  }
  if (virtual_stages > 1) return fmt::format("{}{}.{}", name, a.micro, a.chunk);
  return fmt::format("{}{}", name, a.micro);
}

std::string to_string(ScheduleKind kind) {
  return kind == ScheduleKind::OneFOneB ? "1f1b" : "interleaved-1f1b";
}

namespace {

void validate(ScheduleKind kind, int pp, int n_micro, int v) {
  DS_USER_CHECK(pp >= 1, "pipeline-model-parallel-size must be >= 1, got {}", pp);
  DS_USER_CHECK(n_micro >= 1, "number of micro-batches must be >= 1, got {}", n_micro);
  DS_USER_CHECK(v >= 1, "virtual pipeline stages per rank must be >= 1, got {}", v);
  if (kind == ScheduleKind::OneFOneB) {
    DS_USER_CHECK(v == 1,
                  "the 1F1B schedule holds one model chunk per rank, got {} virtual stages "
                  "per rank; use the interleaved schedule",
                  v);
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
  if (kind == ScheduleKind::OneFOneB) return std::min(pp - stage - 1, n_micro);
  const int total = n_micro * virtual_stages;
  if (n_micro == pp) return total;
  return std::min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp, total);
}

int max_live_activations(ScheduleKind kind, int pp, int stage, int n_micro, int virtual_stages) {
  const int warmup = warmup_micro_batches(kind, pp, stage, n_micro, virtual_stages);
  return std::min(warmup + 1, n_micro * virtual_stages);
}

double bubble_fraction(ScheduleKind kind, int pp, int n_micro, int virtual_stages) {
  validate(kind, pp, n_micro, virtual_stages);
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

// ---- Simulation ------------------------------------------------------------

namespace {

// A posted send or receive; `done` once matched (or at once for a buffered send).
struct PostedOp {
  int rank = 0;
  PipeAction tag;  // for a send: the (micro, chunk) as the receiver names it
  double posted_at = 0;
  bool done = false;
  double done_at = 0;
};

// Both ends of the FIFO link from one rank to another in one direction.
struct Channel {
  std::deque<PostedOp*> sends, recvs;
};

class Simulator {
 public:
  Simulator(const std::vector<std::vector<PipeAction>>& lists, int n_micro, int v,
            const PipelineSimOptions& opt)
      : lists_(lists), pp_(int(lists.size())), n_(n_micro), v_(v), opt_(opt) {
    DS_CHECK(pp_ >= 1 && n_ >= 1 && v_ >= 1, "simulate_pipeline: pp {}, n_micro {}, v {}", pp_,
             n_, v_);
    const int stages = pp_ * v_;
    ranks_.resize(pp_);
    fwd_seq_.assign(n_, std::vector<long>(stages, -1));
    bwd_seq_ = fwd_seq_;
    recv_f_ = sent_f_ = recv_b_ = sent_b_ =
        std::vector<std::vector<char>>(n_, std::vector<char>(stages, 0));
    result_.peak_live.assign(pp_, 0);
    result_.forwards_before_first_backward.assign(pp_, -1);
    result_.trace.resize(pp_);
    result_.ideal = n_ * v_ * (opt.forward_cost + opt.backward_cost);
  }

  PipelineSimResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < pp_; ++r) progress |= step(r);
      for (auto& [key, ch] : channels_) progress |= match(key, ch);
    }
    check_finished();
    for (const RankState& rs : ranks_) result_.makespan = std::max(result_.makespan, rs.clock);
    return std::move(result_);
  }

 private:
  struct RankState {
    size_t pc = 0;
    bool posted = false;
    size_t batch_end = 0;
    std::vector<PostedOp*> batch;
    double clock = 0;
    int live = 0, forwards = 0;
  };
  using Key = std::tuple<int, int, bool>;  // (from rank, to rank, carries activations)

  std::string where(int r, size_t i) const {
    return fmt::format("rank {} action {} ({})", r, i, to_string(lists_[r][i], v_));
  }
  bool first_virtual(int r, int c) const { return r == 0 && c == 0; }
  bool last_virtual(int r, int c) const { return r == pp_ - 1 && c == v_ - 1; }

  bool step(int r) {
    RankState& rs = ranks_[r];
    if (rs.pc >= lists_[r].size()) return false;
    const PipeAction& a = lists_[r][rs.pc];
    DS_CHECK(a.micro >= 0 && a.micro < n_ && a.chunk >= 0 && a.chunk < v_,
             "{}: micro-batch or chunk out of range (n_micro {}, virtual stages {})",
             where(r, rs.pc), n_, v_);
    if (!is_communication(a.kind)) {
      compute(r, a);
      ++rs.pc;
      return true;
    }
    if (!rs.posted) {
      post_batch(r);
      return true;
    }
    for (const PostedOp* op : rs.batch)
      if (!op->done) return false;
    for (const PostedOp* op : rs.batch) rs.clock = std::max(rs.clock, op->done_at);
    rs.batch.clear();
    rs.posted = false;
    rs.pc = rs.batch_end;
    return true;
  }

  void post_batch(int r) {
    RankState& rs = ranks_[r];
    size_t end = rs.pc + 1;
    if (opt_.comm == CommModel::Batched)
      while (end < lists_[r].size() && is_communication(lists_[r][end].kind)) ++end;
    for (size_t i = rs.pc; i < end; ++i) post(r, i);
    rs.batch_end = end;
    rs.posted = true;
  }

  void post(int r, size_t i) {
    const PipeAction& a = lists_[r][i];
    RankState& rs = ranks_[r];
    const int s = virtual_stage_index(pp_, r, a.chunk);
    PostedOp& op = ops_.emplace_back(PostedOp{r, a, rs.clock});  // deque: stable address
    rs.batch.push_back(&op);
    const bool activations = a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvForward;
    switch (a.kind) {
      case ActionKind::SendForward:
      case ActionKind::SendBackward: {
        const bool fwd = a.kind == ActionKind::SendForward;
        DS_CHECK(fwd ? !last_virtual(r, a.chunk) : !first_virtual(r, a.chunk),
                 "{}: the {} virtual stage has no one to send to", where(r, i),
                 fwd ? "last" : "first");
        DS_CHECK(fwd ? fwd_seq_[a.micro][s] >= 0 : bwd_seq_[a.micro][s] >= 0,
                 "{}: sends data not computed yet", where(r, i));
        char& sent = fwd ? sent_f_[a.micro][s] : sent_b_[a.micro][s];
        DS_CHECK(!sent, "{}: sent twice", where(r, i));
        sent = 1;
        const VirtualStage to = fwd ? forward_peer(pp_, v_, r, a.chunk)
                                    : backward_peer(pp_, v_, r, a.chunk);
        op.tag.chunk = to.chunk;
        if (opt_.comm == CommModel::Buffered) op.done = true, op.done_at = rs.clock;
        channels_[Key{r, to.rank, activations}].sends.push_back(&op);
        break;
      }
      default: {
        const bool fwd = a.kind == ActionKind::RecvForward;
        DS_CHECK(fwd ? !first_virtual(r, a.chunk) : !last_virtual(r, a.chunk),
                 "{}: the {} virtual stage receives nothing", where(r, i),
                 fwd ? "first" : "last");
        const VirtualStage from = fwd ? backward_peer(pp_, v_, r, a.chunk)
                                      : forward_peer(pp_, v_, r, a.chunk);
        channels_[Key{from.rank, r, activations}].recvs.push_back(&op);
      }
    }
  }

  bool match(const Key& key, Channel& ch) {
    bool any = false;
    while (!ch.sends.empty() && !ch.recvs.empty()) {
      PostedOp* snd = ch.sends.front();
      PostedOp* rcv = ch.recvs.front();
      ch.sends.pop_front();
      ch.recvs.pop_front();
      DS_CHECK(snd->tag.micro == rcv->tag.micro && snd->tag.chunk == rcv->tag.chunk,
               "rank {} {} was matched with the {} micro-batch {} chunk {} of rank {} "
               "(channel {} -> {})",
               rcv->rank, to_string(rcv->tag, v_),
               std::get<2>(key) ? "activations of" : "gradient of", snd->tag.micro,
               snd->tag.chunk, snd->rank, std::get<0>(key), std::get<1>(key));
      const double at = std::max(snd->posted_at, rcv->posted_at);
      if (!snd->done) snd->done = true, snd->done_at = at;
      rcv->done = true, rcv->done_at = at;
      char& got = rcv->tag.kind == ActionKind::RecvForward
                      ? recv_f_[rcv->tag.micro][virtual_stage_index(pp_, rcv->rank, rcv->tag.chunk)]
                      : recv_b_[rcv->tag.micro][virtual_stage_index(pp_, rcv->rank, rcv->tag.chunk)];
      DS_CHECK(!got, "rank {} {} received twice", rcv->rank, to_string(rcv->tag, v_));
      got = 1;
      any = true;
    }
    return any;
  }

  void compute(int r, const PipeAction& a) {
    RankState& rs = ranks_[r];
    const std::string at = where(r, rs.pc);
    const int s = virtual_stage_index(pp_, r, a.chunk);
    const int m = a.micro;
    if (a.kind == ActionKind::Forward) {
      DS_CHECK(fwd_seq_[m][s] < 0, "{}: forward run twice", at);
      DS_CHECK(first_virtual(r, a.chunk) || recv_f_[m][s], "{}: input not received", at);
      fwd_seq_[m][s] = seq_++;
      result_.peak_live[r] = std::max(result_.peak_live[r], ++rs.live);
      ++rs.forwards;
    } else {
      DS_CHECK(bwd_seq_[m][s] < 0, "{}: backward run twice", at);
      DS_CHECK(fwd_seq_[m][s] >= 0, "{}: backward before its forward", at);
      DS_CHECK(last_virtual(r, a.chunk) || recv_b_[m][s], "{}: output gradient not received", at);
      bwd_seq_[m][s] = seq_++;
      --rs.live;
      if (result_.forwards_before_first_backward[r] < 0)
        result_.forwards_before_first_backward[r] = rs.forwards;
    }
    result_.trace[r].push_back({rs.clock, a});
    rs.clock += a.kind == ActionKind::Forward ? opt_.forward_cost : opt_.backward_cost;
  }

  void check_finished() const {
    std::string blocked;
    for (int r = 0; r < pp_; ++r)
      if (ranks_[r].pc < lists_[r].size()) blocked += "; " + where(r, ranks_[r].pc);
    if (!blocked.empty()) DS_THROW("pipeline deadlock: blocked at {}", blocked.substr(2));
    for (const auto& [key, ch] : channels_)
      DS_CHECK(ch.sends.empty(), "rank {} sent {} to rank {} and it was never received",
               std::get<0>(key), to_string(ch.sends.front()->tag, v_), std::get<1>(key));
    for (int m = 0; m < n_; ++m) {
      for (int s = 0; s < pp_ * v_; ++s) {
        DS_CHECK(fwd_seq_[m][s] >= 0 && bwd_seq_[m][s] >= 0,
                 "micro-batch {} never ran {} on virtual stage {}", m,
                 fwd_seq_[m][s] < 0 ? "forward" : "backward", s);
        if (s == 0) continue;
        DS_CHECK(fwd_seq_[m][s] > fwd_seq_[m][s - 1],
                 "micro-batch {}: forward on virtual stage {} before stage {}", m, s, s - 1);
        DS_CHECK(bwd_seq_[m][s] < bwd_seq_[m][s - 1],
                 "micro-batch {}: backward on virtual stage {} after stage {}", m, s, s - 1);
      }
    }
  }

  const std::vector<std::vector<PipeAction>>& lists_;
  int pp_, n_, v_;
  PipelineSimOptions opt_;
  std::vector<RankState> ranks_;
  std::deque<PostedOp> ops_;  // every posted send and receive
  std::map<Key, Channel> channels_;
  std::vector<std::vector<long>> fwd_seq_, bwd_seq_;  // (n_micro, virtual stage) -> order
  std::vector<std::vector<char>> recv_f_, sent_f_, recv_b_, sent_b_;
  long seq_ = 0;
  PipelineSimResult result_;
};

}  // namespace

PipelineSimResult simulate_pipeline(const std::vector<std::vector<PipeAction>>& per_rank,
                                    int n_micro, int virtual_stages,
                                    const PipelineSimOptions& options) {
  return Simulator(per_rank, n_micro, virtual_stages, options).run();
}

}  // namespace ds
