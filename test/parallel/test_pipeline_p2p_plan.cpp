// The pipeline's posting plan (lib/parallel/pipeline_p2p_plan.h) played on a
// model of the executor, over the schedule grid, with and without overlap:
// every rank posts batches into one FIFO queue per communicator (its
// communication thread or stream) and runs a compute only once the batches holding its receives have
// completed; a queued batch starts when the ones before it completed, and a
// message passes when both its send and its receive have started
// (rendezvous). Checks: no deadlock, every message lands in the receive of
// the same micro-batch and the next virtual stage, a backward waits for the
// send of its forward's output (it frees that buffer), the compute order is
// the schedule's, and with overlap receives are posted ahead of their
// compute: 1F1B every receive but the first, interleaved every receive of the
// steady state but the first forward's (and each queue keeps the schedule's
// sequence of batches there).
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "lib/core/error.h"
#include "lib/parallel/pipeline_p2p_plan.h"

using namespace ds;

namespace {

struct Op {
  int rank, post, index;
};

struct SimResult {
  bool deadlock = false;
  std::vector<std::vector<PipeAction>> computed;  // per rank, in order
};

// The plan's post number `index` (posts counted in plan order).
const P2PPlanStep& plan_post(const std::vector<P2PPlanStep>& plan, int index) {
  for (const P2PPlanStep& s : plan)
    if (s.kind == P2PPlanStep::Kind::Post && index-- == 0) return s;
  throw ds::Error("no such post");
}

bool is_send(ActionKind k) { return k == ActionKind::SendForward || k == ActionKind::SendBackward; }

SimResult simulate(const std::vector<std::vector<P2PPlanStep>>& plans, int vp) {
  const int pp = static_cast<int>(plans.size());
  std::vector<std::vector<const std::vector<PipeAction>*>> posts(pp);
  std::vector<size_t> pc(pp, 0);
  std::vector<std::array<std::deque<int>, 2>> queue(pp);  // per rank and queue
  std::vector<std::vector<char>> done(pp);                  // per post
  std::vector<std::vector<std::vector<char>>> matched(pp);  // per post, per op
  std::vector<std::vector<std::vector<int>>> seq(pp);       // per post, per op: message number
  std::map<std::tuple<int, int, int, bool>, int> counter;   // (self, peer, channel, send) -> next
  SimResult res;
  res.computed.resize(pp);

  auto peer_channel = [&](int r, const PipeAction& a) {
    const bool fwd_link = a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvBackward;
    const int peer = fwd_link ? forward_peer(pp, vp, r, a.chunk).rank : backward_peer(pp, vp, r, a.chunk).rank;
    const int channel = (a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvForward) ? 0 : 1;
    return std::pair<int, int>{peer, channel};
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {  // hosts run until a compute must wait
      while (pc[r] < plans[r].size()) {
        const P2PPlanStep& s = plans[r][pc[r]];
        if (s.kind == P2PPlanStep::Kind::Post) {
          const int id = static_cast<int>(posts[r].size());
          posts[r].push_back(&s.batch);
          done[r].push_back(0);
          matched[r].emplace_back(s.batch.size(), 0);
          seq[r].emplace_back();
          for (const PipeAction& a : s.batch) {
            auto [peer, ch] = peer_channel(r, a);
            seq[r].back().push_back(counter[{r, peer, ch, is_send(a.kind)}]++);
          }
          queue[r][s.queue].push_back(id);
        } else {
          bool ready = true;
          for (int w : s.waits) ready = ready && w < static_cast<int>(done[r].size()) && done[r][w];
          if (!ready) break;
          res.computed[r].push_back(s.compute);
        }
        ++pc[r];
        progress = true;
      }
    }
    // Messages whose send and receive both sit in the batch at a queue head.
    std::map<std::tuple<int, int, int, int>, Op> heads;  // (from, to, channel, number) -> op
    for (int rq = 0; rq < pp * 2; ++rq) {
      const int r = rq / 2, q = rq % 2;
      if (queue[r][q].empty()) continue;
      const int id = queue[r][q].front();
      for (size_t i = 0; i < posts[r][id]->size(); ++i) {
        if (matched[r][id][i]) continue;
        const PipeAction& a = (*posts[r][id])[i];
        auto [peer, ch] = peer_channel(r, a);
        const bool send = is_send(a.kind);
        auto key = std::make_tuple(send ? r : peer, send ? peer : r, ch, seq[r][id][i]);
        auto it = heads.find(key);
        if (it == heads.end()) {
          heads[key] = {r, id, static_cast<int>(i)};
          continue;
        }
        const Op o = it->second;
        const PipeAction& b = (*posts[o.rank][o.post])[o.index];
        const PipeAction& snd = send ? a : b;
        const PipeAction& rcv = send ? b : a;
        const int from = send ? r : o.rank, to = send ? o.rank : r;
        REQUIRE(snd.micro == rcv.micro);
        const int vs = virtual_stage_index(pp, from, snd.chunk), vr = virtual_stage_index(pp, to, rcv.chunk);
        REQUIRE(vr == (snd.kind == ActionKind::SendForward ? vs + 1 : vs - 1));
        matched[r][id][i] = 1;
        matched[o.rank][o.post][o.index] = 1;
        heads.erase(it);
        progress = true;
      }
    }
    for (int r = 0; r < pp; ++r) {
      for (std::deque<int>& q : queue[r]) {
        while (!q.empty()) {
          const int id = q.front();
          bool all = true;
          for (char m : matched[r][id]) all = all && m;
          if (!all) break;
          done[r][id] = 1;
          q.pop_front();
          progress = true;
        }
      }
    }
  }
  for (int r = 0; r < pp; ++r)
    res.deadlock = res.deadlock || pc[r] < plans[r].size() || !queue[r][0].empty() || !queue[r][1].empty();
  return res;
}

struct Case {
  ScheduleKind kind;
  int pp, n, v;
};

std::vector<Case> grid() {
  std::vector<Case> cases;
  for (int pp = 1; pp <= 6; ++pp)
    for (int n : {1, 2, 3, 4, 5, 7, 8, 12})
      for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleH1Exact})
        cases.push_back({k, pp, n, 1});
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 1; v <= 4; ++v)
      for (int mult : {1, 2, 3, 4}) cases.push_back({ScheduleKind::Interleaved1F1B, pp, pp * mult, v});
  return cases;
}

std::vector<std::vector<P2PPlanStep>> all_plans(const Case& c, bool overlap) {
  std::vector<std::vector<P2PPlanStep>> plans;
  for (int s = 0; s < c.pp; ++s) plans.push_back(make_p2p_plan(make_schedule(c.kind, c.pp, s, c.n, c.v), c.kind, overlap));
  return plans;
}

// For each compute that receives (in compute order): the computes run between
// the post holding its receive and the compute itself. Second: the index of
// that compute among all computes.
std::vector<std::pair<int, int>> lead_by_compute(const std::vector<P2PPlanStep>& plan) {
  std::vector<int> post_at_compute;  // post index -> computes run before it was posted
  std::vector<std::pair<int, int>> out;
  int computes = 0;
  for (const P2PPlanStep& s : plan) {
    if (s.kind == P2PPlanStep::Kind::Post) {
      post_at_compute.push_back(computes);
      continue;
    }
    const auto recv = [&](int w) {
      for (const PipeAction& a : plan_post(plan, w).batch)
        if (a.micro == s.compute.micro && a.chunk == s.compute.chunk &&
            a.kind == (s.compute.kind == ActionKind::Forward ? ActionKind::RecvForward : ActionKind::RecvBackward))
          return true;
      return false;
    };
    for (int w : s.waits)
      if (recv(w)) out.push_back({computes - post_at_compute[w], computes});
    ++computes;
  }
  return out;
}

std::vector<int> lead(const std::vector<P2PPlanStep>& plan) {
  std::vector<int> out;
  for (auto [l, i] : lead_by_compute(plan)) out.push_back(l);
  return out;
}

// Each queue's batches, in posting order.
std::vector<std::vector<PipeAction>> queue_batches(const std::vector<P2PPlanStep>& plan, int queue) {
  std::vector<std::vector<PipeAction>> out;
  for (const P2PPlanStep& s : plan)
    if (s.kind == P2PPlanStep::Kind::Post && s.queue == queue) out.push_back(s.batch);
  return out;
}

}  // namespace

// Why the interleaved schedule has a rule of its own: the 1F1B rule (single
// receives moved ahead of the sends before them) deadlocks it, PP 2, m 2, v 2
// already: on the ring of activation queues a receive moved into an earlier
// batch waits for a send queued behind the partner's earlier batch.
TEST_CASE("moving single interleaved receives ahead of sends deadlocks") {
  std::vector<std::vector<P2PPlanStep>> plans;
  for (int s = 0; s < 2; ++s)
    plans.push_back(make_p2p_plan(make_schedule(ScheduleKind::Interleaved1F1B, 2, s, 2, 2), ScheduleKind::OneFOneB, true));
  CHECK(simulate(plans, 2).deadlock);
  plans.clear();
  for (int s = 0; s < 2; ++s)
    plans.push_back(make_p2p_plan(make_schedule(ScheduleKind::Interleaved1F1B, 2, s, 2, 2), ScheduleKind::Interleaved1F1B, true));
  CHECK_FALSE(simulate(plans, 2).deadlock);
}

TEST_CASE("p2p plans run without deadlock and keep the schedule's computes") {
  for (const Case& c : grid()) {
    for (bool overlap : {false, true}) {
      INFO(to_string(c.kind) << " pp=" << c.pp << " n_micro=" << c.n << " v=" << c.v << " overlap=" << overlap);
      const std::vector<std::vector<P2PPlanStep>> plans = all_plans(c, overlap);
      SimResult res = simulate(plans, c.v);
      REQUIRE_FALSE(res.deadlock);
      for (int s = 0; s < c.pp; ++s) {
        std::vector<PipeAction> expect;
        for (const PipeAction& a : make_schedule(c.kind, c.pp, s, c.n, c.v))
          if (!is_communication(a.kind)) expect.push_back(a);
        REQUIRE(res.computed[s] == expect);
        if (!overlap && c.kind == ScheduleKind::OneFOneB)
          for (int l : lead(plans[s])) REQUIRE(l == 0);
        if (overlap && c.kind != ScheduleKind::Interleaved1F1B) {  // every receive but one in the first run arrives during an earlier compute
          const std::vector<int> l = lead(plans[s]);
          for (size_t i = 1; i < l.size(); ++i) REQUIRE(l[i] >= 1);
        }
        // A backward waits for the batch that sent its forward's output.
        std::map<std::pair<int, int>, int> sent_in;
        int post = 0;
        for (const P2PPlanStep& st : plans[s]) {
          if (st.kind == P2PPlanStep::Kind::Post) {
            for (const PipeAction& a : st.batch)
              if (a.kind == ActionKind::SendForward) sent_in[{a.micro, a.chunk}] = post;
            ++post;
          } else if (is_backward(st.compute.kind)) {
            auto it = sent_in.find({st.compute.micro, st.compute.chunk});
            if (it != sent_in.end())
              CHECK(std::find(st.waits.begin(), st.waits.end(), it->second) != st.waits.end());
          }
        }
      }
    }
  }
}

// Interleaved with overlap, over the grid: each queue carries the schedule's
// batches (each run's activation or gradient part) in the schedule's order,
// and in the steady state every receive but the first forward's is posted one
// or two computes ahead (one: the other kind's compute between, as
// F4.0 [SendF4.0 RecvF5.0] B0.1 [SendB0.1 RecvB1.1] F5.0; two when the batch
// also passed a compute that sends nothing, e.g. a backward of the first
// virtual stage). Nothing is posted more than two computes ahead.
TEST_CASE("interleaved overlap posts steady-state receives a compute ahead, queue order unchanged") {
  for (const Case& c : grid()) {
    if (c.kind != ScheduleKind::Interleaved1F1B) continue;
    for (int s = 0; s < c.pp; ++s) {
      INFO("pp=" << c.pp << " n_micro=" << c.n << " v=" << c.v << " stage=" << s);
      const std::vector<PipeAction> acts = make_schedule(c.kind, c.pp, s, c.n, c.v);
      const std::vector<P2PPlanStep> on = make_p2p_plan(acts, c.kind, true);
      const std::vector<P2PPlanStep> off = make_p2p_plan(acts, c.kind, false);
      for (int q : {0, 1}) {
        std::vector<std::vector<PipeAction>> expect;
        for (const P2PPlanStep& st : off) {
          std::vector<PipeAction> part;
          for (const PipeAction& a : st.batch)
            if (p2p_queue(a.kind) == q) part.push_back(a);
          if (!part.empty()) expect.push_back(part);
        }
        REQUIRE(queue_batches(on, q) == expect);
      }
      const int w = warmup_micro_batches(c.kind, c.pp, s, c.n, c.v);
      const int steady_end = w + 2 * (c.n * c.v - w);  // computes [w, steady_end) alternate F, B
      const std::vector<std::pair<int, int>> leads = lead_by_compute(on);
      size_t receives = 0;
      for (const PipeAction& a : acts) receives += a.kind == ActionKind::RecvForward || a.kind == ActionKind::RecvBackward;
      REQUIRE(leads.size() == receives);  // every receive found before its compute
      for (auto [l, i] : leads) {
        INFO("compute " << i << " lead " << l);
        REQUIRE(l <= 2);
        if (i > w && i < steady_end) REQUIRE(l >= 1);
      }
    }
  }
}

TEST_CASE("with overlap a receive is posted one compute before it is needed") {
  // 1F1B, 4 stages, 8 micro-batches, stage 1: warm-up F0 F1, steady F2 B0 ...
  const std::vector<PipeAction> acts = make_schedule(ScheduleKind::OneFOneB, 4, 1, 8);
  std::vector<int> off = lead(make_p2p_plan(acts, ScheduleKind::OneFOneB, false));
  std::vector<int> on = lead(make_p2p_plan(acts, ScheduleKind::OneFOneB, true));
  REQUIRE(off.size() == on.size());
  REQUIRE(off.size() == 8 + 8);  // every forward and every backward of stage 1 receives
  for (int l : off) CHECK(l == 0);
  CHECK(on[0] == 0);  // the first receive has no compute before it
  for (size_t i = 1; i < on.size(); ++i) CHECK(on[i] == 1);
  // The steady state's first backward (B0) gets its gradient in a batch of
  // its own, posted before the forward F2 that precedes it.
  std::vector<P2PPlanStep> plan = make_p2p_plan(acts, ScheduleKind::OneFOneB, true);
  int f2 = -1, recv_b0 = -1;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == P2PPlanStep::Kind::Compute && plan[i].compute == PipeAction{ActionKind::Forward, 2, 0})
      f2 = static_cast<int>(i);
    if (plan[i].kind == P2PPlanStep::Kind::Post && plan[i].batch.size() == 1 &&
        plan[i].batch[0] == PipeAction{ActionKind::RecvBackward, 0, 0})
      recv_b0 = static_cast<int>(i);
  }
  REQUIRE(f2 >= 0);
  REQUIRE(recv_b0 >= 0);
  CHECK(recv_b0 < f2);
}
