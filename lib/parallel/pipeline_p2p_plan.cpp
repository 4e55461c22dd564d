// make_p2p_plan: the schedule's runs of send/receive actions turned into
// asynchronous batches. With overlap, 1F1B moves its receives one compute
// earlier; the interleaved schedule moves whole per-queue batches one compute
// earlier where the compute they pass produced none of their sends.
#include "lib/parallel/pipeline_p2p_plan.h"

#include <map>
#include <tuple>

#include "lib/core/error.h"

namespace ds {

namespace {

bool is_receive(ActionKind k) { return k == ActionKind::RecvForward || k == ActionKind::RecvBackward; }

// The receive a compute consumes: RecvForward for a Forward, RecvBackward for
// a Backward (or input pass), of the same (micro, chunk). A weight pass
// consumes none.
std::tuple<ActionKind, int, int> receive_key(const PipeAction& a) {
  if (a.kind == ActionKind::Forward) return {ActionKind::RecvForward, a.micro, a.chunk};
  if (is_backward(a.kind)) return {ActionKind::RecvBackward, a.micro, a.chunk};
  return {a.kind, a.micro, a.chunk};
}

// One asynchronous batch, on one queue.
struct Post {
  std::vector<PipeAction> batch;
  int queue = 0;
};
using PostsBefore = std::vector<std::vector<Post>>;  // [k]: posted right before compute k

std::vector<PipeAction> on_queue(const std::vector<PipeAction>& run, int queue) {
  std::vector<PipeAction> part;
  for (const PipeAction& a : run)
    if (p2p_queue(a.kind) == queue) part.push_back(a);
  return part;
}

void add(std::vector<Post>& posts, std::vector<PipeAction> batch, int queue) {
  if (!batch.empty()) posts.push_back({std::move(batch), queue});
}

// Without overlap: each run is one batch on queue 0, as the schedule pairs them.
PostsBefore paired(const std::vector<std::vector<PipeAction>>& runs) {
  PostsBefore out(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) add(out[k], runs[k], 0);
  return out;
}

// 1F1B with overlap: every receive is posted one compute earlier, after the
// rest of the run it moves into, each queue's part one batch.
PostsBefore receives_one_early(std::vector<std::vector<PipeAction>> runs) {
  std::vector<std::vector<PipeAction>> early(runs.size());
  for (size_t k = 1; k < runs.size(); ++k) {
    std::vector<PipeAction> keep;
    for (const PipeAction& a : runs[k]) (is_receive(a.kind) ? early[k - 1] : keep).push_back(a);
    runs[k] = std::move(keep);
  }
  PostsBefore out(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<PipeAction> merged = runs[k];
    merged.insert(merged.end(), early[k].begin(), early[k].end());
    for (int q : {0, 1}) add(out[k], on_queue(merged, q), q);
  }
  return out;
}

bool sends_output_of(const std::vector<PipeAction>& batch, const PipeAction& compute) {
  if (compute.kind == ActionKind::WeightGrad) return false;
  const ActionKind send =
      compute.kind == ActionKind::Forward ? ActionKind::SendForward : ActionKind::SendBackward;
  for (const PipeAction& a : batch)
    if (a.kind == send && a.micro == compute.micro && a.chunk == compute.chunk) return true;
  return false;
}

// Interleaved 1F1B with overlap. Moving single receives ahead of the sends
// before them reorders a queue, and the activation queues form a ring
// (rank PP-1 sends to rank 0): with every head a receive, nothing moves. So
// each queue keeps the schedule's sequence of batches (each run split by
// queue) and a batch is only posted earlier: one compute earlier, unless that
// compute produces what the batch sends. In the steady state the run after
// F(k+w) B(k) is [SendF(k+w) RecvF(next) | SendB(k) RecvB(k+1)]: its activation
// half goes out before B(k), its gradient half stays after B(k), so both
// receives are posted a compute before they are needed (Megatron's
// overlap_p2p_comm issues the same halves at the same points).
PostsBefore batches_one_early(const std::vector<std::vector<PipeAction>>& runs,
                              const std::vector<PipeAction>& computes) {
  PostsBefore own(runs.size()), moved(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    for (int q : {0, 1}) {
      std::vector<PipeAction> part = on_queue(runs[k], q);
      const bool move = k >= 1 && !sends_output_of(part, computes[k - 1]);
      add(move ? moved[k - 1] : own[k], std::move(part), q);
    }
  }
  // A moved batch follows the batches already posted before that compute, so
  // each queue's order is the schedule's.
  for (size_t k = 0; k < runs.size(); ++k) own[k].insert(own[k].end(), moved[k].begin(), moved[k].end());
  return own;
}

}  // namespace

int p2p_queue(ActionKind kind) {
  return kind == ActionKind::SendForward || kind == ActionKind::RecvForward ? 0 : 1;
}

std::vector<P2PPlanStep> make_p2p_plan(const std::vector<PipeAction>& actions, ScheduleKind kind, bool overlap) {
  // runs[k]: the send/receive actions right before compute k (runs[K]: after the last).
  std::vector<PipeAction> computes;
  std::vector<std::vector<PipeAction>> runs(1);
  for (const PipeAction& a : actions) {
    if (is_communication(a.kind)) {
      runs.back().push_back(a);
    } else {
      computes.push_back(a);
      runs.emplace_back();
    }
  }
  const PostsBefore posts = !overlap                                 ? paired(runs)
                            : kind != ScheduleKind::Interleaved1F1B ? receives_one_early(runs)
                                                                     : batches_one_early(runs, computes);

  std::vector<P2PPlanStep> plan;
  std::map<std::tuple<ActionKind, int, int>, int> posted_in;  // receive or SendForward -> post index
  int n_posts = 0;
  for (size_t k = 0; k < posts.size(); ++k) {
    for (const Post& p : posts[k]) {
      P2PPlanStep s;
      s.kind = P2PPlanStep::Kind::Post;
      s.batch = p.batch;
      s.queue = p.queue;
      for (const PipeAction& a : p.batch)
        if (is_receive(a.kind) || a.kind == ActionKind::SendForward) posted_in[{a.kind, a.micro, a.chunk}] = n_posts;
      ++n_posts;
      plan.push_back(std::move(s));
    }
    if (k == computes.size()) break;
    P2PPlanStep s;
    s.compute = computes[k];
    auto it = posted_in.find(receive_key(computes[k]));
    if (it != posted_in.end()) {
      s.waits.push_back(it->second);
      posted_in.erase(it);
    }
    // The backward frees the activations its forward sent from; that send may
    // sit on the other queue than the gradient it received.
    if (is_backward(computes[k].kind)) {
      auto sent = posted_in.find({ActionKind::SendForward, computes[k].micro, computes[k].chunk});
      if (sent != posted_in.end()) {
        if (s.waits.empty() || s.waits.back() != sent->second) s.waits.push_back(sent->second);
        posted_in.erase(sent);
      }
    }
    plan.push_back(std::move(s));
  }
  for (const auto& [key, post] : posted_in)
    DS_CHECK(std::get<0>(key) == ActionKind::SendForward, "pipeline p2p plan: a receive no compute consumes");
  return plan;
}

}  // namespace ds
