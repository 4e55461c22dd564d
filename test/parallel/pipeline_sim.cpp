// The pipeline simulator (pipeline_sim.h): ranks as cooperating state
// machines over FIFO channels, advanced in time order.
#include "test/parallel/pipeline_sim.h"

#include <algorithm>
#include <deque>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <tuple>

#include "lib/core/error.h"

namespace ds {

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
    std::deque<int> pending_weights;  // micro-batches whose input pass ran, weight pass not yet
    size_t ahead = 0;                 // weight passes after the posted batch, run while it is in flight
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
    bool done = true;
    for (const PostedOp* op : rs.batch) done &= op->done;
    if (!done) {
      // A weight pass right after the batch reads nothing it carries: it runs
      // while the batch is in flight (the executor waits only for the batch
      // holding what a compute reads).
      const size_t next = rs.batch_end + rs.ahead;
      if (next >= lists_[r].size() || lists_[r][next].kind != ActionKind::WeightGrad) return false;
      const size_t pc = rs.pc;
      rs.pc = next;
      compute(r, lists_[r][next]);
      rs.pc = pc;
      ++rs.ahead;
      return true;
    }
    for (const PostedOp* op : rs.batch) rs.clock = std::max(rs.clock, op->done_at);
    rs.batch.clear();
    rs.posted = false;
    rs.pc = rs.batch_end + rs.ahead;
    rs.ahead = 0;
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
    double cost = opt_.forward_cost;
    if (a.kind == ActionKind::WeightGrad) {
      DS_CHECK(!rs.pending_weights.empty() && rs.pending_weights.front() == m,
               "{}: not the oldest pending weight pass (pending: {})", at, fmt::join(rs.pending_weights, " "));
      rs.pending_weights.pop_front();
      cost = opt_.weight_cost;
    } else if (a.kind == ActionKind::Forward) {
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
      cost = opt_.backward_cost;
      if (a.kind == ActionKind::BackwardInput) {
        rs.pending_weights.push_back(m);
        cost = opt_.backward_input_cost;
      }
    }
    result_.trace[r].push_back({rs.clock, a});
    rs.clock += cost;
  }

  void check_finished() const {
    std::string blocked;
    for (int r = 0; r < pp_; ++r)
      if (ranks_[r].pc < lists_[r].size()) blocked += "; " + where(r, ranks_[r].pc);
    if (!blocked.empty()) DS_THROW("pipeline deadlock: blocked at {}", blocked.substr(2));
    for (int r = 0; r < pp_; ++r)
      DS_CHECK(ranks_[r].pending_weights.empty(), "rank {}: micro-batch {}'s weight pass never ran", r,
               ranks_[r].pending_weights.front());
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
