// make_p2p_plan: the schedule's runs of send/receive actions turned into
// asynchronous batches, receives moved one compute earlier when overlapping.
#include "lib/parallel/pipeline_p2p_plan.h"

#include <map>
#include <tuple>

#include "lib/core/error.h"

namespace ds {

namespace {

bool is_receive(ActionKind k) { return k == ActionKind::RecvForward || k == ActionKind::RecvBackward; }

// The receive a compute consumes: RecvForward for a Forward, RecvBackward for
// a Backward, of the same (micro, chunk).
std::tuple<ActionKind, int, int> receive_key(const PipeAction& a) {
  if (a.kind == ActionKind::Forward) return {ActionKind::RecvForward, a.micro, a.chunk};
  if (a.kind == ActionKind::Backward) return {ActionKind::RecvBackward, a.micro, a.chunk};
  return {a.kind, a.micro, a.chunk};
}

}  // namespace

int p2p_queue(ActionKind kind) {
  return kind == ActionKind::SendForward || kind == ActionKind::RecvForward ? 0 : 1;
}

std::vector<P2PPlanStep> make_p2p_plan(const std::vector<PipeAction>& actions, bool overlap) {
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
  // early[k]: receives moved from runs[k + 1] to be posted before compute k.
  std::vector<std::vector<PipeAction>> early(runs.size());
  if (overlap) {
    for (size_t k = 1; k < runs.size(); ++k) {
      std::vector<PipeAction> keep;
      for (const PipeAction& a : runs[k]) (is_receive(a.kind) ? early[k - 1] : keep).push_back(a);
      runs[k] = std::move(keep);
    }
  }

  std::vector<P2PPlanStep> plan;
  std::map<std::tuple<ActionKind, int, int>, int> posted_in;  // receive -> post index
  int n_posts = 0;
  auto post_queue = [&](const std::vector<PipeAction>& batch, int queue) {
    if (batch.empty()) return;
    P2PPlanStep s;
    s.kind = P2PPlanStep::Kind::Post;
    s.batch = batch;
    s.queue = queue;
    for (const PipeAction& a : batch)
      if (is_receive(a.kind) || a.kind == ActionKind::SendForward) posted_in[{a.kind, a.micro, a.chunk}] = n_posts;
    ++n_posts;
    plan.push_back(std::move(s));
  };
  // Without overlap a run is one batch on queue 0 (as the schedule pairs
  // them); with it, each queue gets its part of the run.
  auto post = [&](const std::vector<PipeAction>& run) {
    if (!overlap) return post_queue(run, 0);
    for (int q : {0, 1}) {
      std::vector<PipeAction> part;
      for (const PipeAction& a : run)
        if (p2p_queue(a.kind) == q) part.push_back(a);
      post_queue(part, q);
    }
  };
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<PipeAction> merged = runs[k];
    merged.insert(merged.end(), early[k].begin(), early[k].end());
    post(merged);
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
    if (computes[k].kind == ActionKind::Backward) {
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
