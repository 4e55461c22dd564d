// Pipeline schedules as data (lib/parallel/pipeline_schedule.h): exact action
// lists for small cases, Megatron's warmup counts, and a grid over pipeline
// size, micro-batches and virtual stages where every rank's list is checked on
// its own and all lists are played against each other by simulate_pipeline
// (no deadlock, every send received in order, forward/backward order across
// virtual stages, live activations within the bound). Also checks that the
// simulator itself catches broken lists.
#include <algorithm>
#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/error.h"
#include "lib/parallel/pipeline_schedule.h"
#include "test/parallel/pipeline_sim.h"

using namespace ds;
using Catch::Matchers::Contains;

namespace {

constexpr ScheduleKind k1F1B = ScheduleKind::OneFOneB;
constexpr ScheduleKind kInter = ScheduleKind::Interleaved1F1B;

std::string join(const std::vector<PipeAction>& actions, int v, bool compute_only) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (compute_only && is_communication(a.kind)) continue;
    if (!s.empty()) s += ' ';
    s += to_string(a, v);
  }
  return s;
}

// Megatron-LM's warmup formulas, written out independently of the library.
int megatron_warmup(ScheduleKind kind, int pp, int stage, int n, int v) {
  if (kind == k1F1B) return std::min(pp - stage - 1, n);
  if (n == pp) return n * v;
  return std::min((pp - stage - 1) * 2 + (v - 1) * pp, n * v);
}

struct Case {
  ScheduleKind kind;
  int pp, n, v;
};

std::string name(const Case& c) {
  return fmt::format("{} pp={} n_micro={} v={}", to_string(c.kind), c.pp, c.n, c.v);
}

std::vector<Case> grid() {
  std::vector<Case> cases;
  for (int pp = 1; pp <= 8; ++pp)
    for (int n : {1, 2, 3, 4, 5, 7, 8, 12, 16}) cases.push_back({k1F1B, pp, n, 1});
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 1; v <= 4; ++v)
      for (int mult : {1, 2, 3, 4}) cases.push_back({kInter, pp, pp * mult, v});
  return cases;
}

// Checks one rank's list without simulation: every (micro, chunk) has exactly
// one Forward and one Backward, the Backward after the Forward; the warmup
// (forwards before the first backward) and cooldown (backwards after the last
// forward) match Megatron; sends and receives only where a neighbour exists.
void check_rank_list(const Case& c, int stage, const std::vector<PipeAction>& list) {
  const int total = c.n * c.v;
  std::map<std::pair<int, int>, int> fwd_at, bwd_at;
  int first_bwd = -1, last_fwd = -1, forwards_before = 0, backwards_after = 0;
  for (int i = 0; i < int(list.size()); ++i) {
    const PipeAction& a = list[i];
    REQUIRE(a.micro >= 0);
    REQUIRE(a.micro < c.n);
    REQUIRE(a.chunk >= 0);
    REQUIRE(a.chunk < c.v);
    const bool first_v = stage == 0 && a.chunk == 0;
    const bool last_v = stage == c.pp - 1 && a.chunk == c.v - 1;
    if (a.kind == ActionKind::Forward) {
      REQUIRE(fwd_at.emplace(std::pair{a.micro, a.chunk}, i).second);
      last_fwd = i;
      if (first_bwd < 0) ++forwards_before;
    } else if (a.kind == ActionKind::Backward) {
      REQUIRE(bwd_at.emplace(std::pair{a.micro, a.chunk}, i).second);
      if (first_bwd < 0) first_bwd = i;
    }
    if (a.kind == ActionKind::RecvForward || a.kind == ActionKind::SendBackward) REQUIRE(!first_v);
    if (a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvBackward) REQUIRE(!last_v);
  }
  for (int i = last_fwd + 1; i < int(list.size()); ++i)
    backwards_after += list[i].kind == ActionKind::Backward;
  REQUIRE(int(fwd_at.size()) == total);
  REQUIRE(int(bwd_at.size()) == total);
  for (const auto& [key, at] : fwd_at) REQUIRE(bwd_at.at(key) > at);
  const int warmup = warmup_micro_batches(c.kind, c.pp, stage, c.n, c.v);
  REQUIRE(warmup == megatron_warmup(c.kind, c.pp, stage, c.n, c.v));
  REQUIRE(forwards_before == std::min(warmup + 1, total));
  REQUIRE(backwards_after == std::min(warmup + 1, total));
}

}  // namespace

TEST_CASE("1F1B action lists for pp=4, 8 micro-batches", "[pipeline]") {
  auto all = make_all_schedules(k1F1B, 4, 8);
  CHECK(join(all[0], 1, true) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(join(all[2], 1, true) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(join(all[3], 1, true) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(join(all[1], 1, false) ==
        "RecvF0 F0 SendF0 RecvF1 F1 SendF1 RecvF2 "
        "F2 SendF2 RecvB0 B0 SendB0 RecvF3 F3 SendF3 RecvB1 B1 SendB1 RecvF4 "
        "F4 SendF4 RecvB2 B2 SendB2 RecvF5 F5 SendF5 RecvB3 B3 SendB3 RecvF6 "
        "F6 SendF6 RecvB4 B4 SendB4 RecvF7 F7 SendF7 RecvB5 B5 SendB5 "
        "RecvB6 B6 SendB6 RecvB7 B7 SendB7");
  // First stage: no activation receives, no gradient sends; last: the mirror.
  CHECK(join(all[0], 1, false).find("RecvF") == std::string::npos);
  CHECK(join(all[0], 1, false).find("SendB") == std::string::npos);
  CHECK(join(all[3], 1, false).find("SendF") == std::string::npos);
  CHECK(join(all[3], 1, false).find("RecvB") == std::string::npos);
}

TEST_CASE("1F1B with fewer micro-batches than stages and with one stage", "[pipeline]") {
  CHECK(join(make_schedule(k1F1B, 4, 0, 2), 1, true) == "F0 F1 B0 B1");
  CHECK(join(make_schedule(k1F1B, 4, 3, 2), 1, true) == "F0 B0 F1 B1");
  CHECK(join(make_schedule(k1F1B, 1, 0, 3), 1, false) == "F0 B0 F1 B1 F2 B2");
  CHECK(max_live_activations(k1F1B, 4, 0, 2) == 2);
  CHECK(max_live_activations(k1F1B, 4, 1, 2) == 2);
  CHECK(max_live_activations(k1F1B, 4, 2, 2) == 2);
  CHECK(max_live_activations(k1F1B, 4, 3, 2) == 1);
}

TEST_CASE("interleaved action list for pp=4, 8 micro-batches, 2 chunks", "[pipeline]") {
  auto all = make_all_schedules(kInter, 4, 8, 2);
  CHECK(join(all[0], 2, true) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
        "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
        "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  CHECK(join(all[3], 2, true) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 "
        "F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
        "B4.0 B5.0 B6.0 B7.0");
  // Rank 0 chunk 1 gets its input from rank 3 chunk 0; rank 3's chunk-0
  // outputs go to rank 0 and its chunk-1 forwards compute the loss.
  const std::string r0 = join(all[0], 2, false);
  CHECK(r0.find("RecvF0.0") == std::string::npos);
  CHECK(r0.find("RecvF0.1") != std::string::npos);
  CHECK(r0.find("SendB0.0") == std::string::npos);
  const std::string r3 = join(all[3], 2, false);
  CHECK(r3.find("SendF0.0") != std::string::npos);
  CHECK(r3.find("SendF0.1") == std::string::npos);
  CHECK(r3.find("RecvB0.1") == std::string::npos);
  CHECK(r3.find("RecvB0.0") != std::string::npos);
}

TEST_CASE("Megatron warmup counts, live activations and bubble", "[pipeline]") {
  for (int s = 0; s < 4; ++s) {
    CHECK(warmup_micro_batches(k1F1B, 4, s, 8) == 3 - s);
    CHECK(max_live_activations(k1F1B, 4, s, 8) == 4 - s);
    CHECK(warmup_micro_batches(kInter, 4, s, 8, 2) == 10 - 2 * s);
    CHECK(max_live_activations(kInter, 4, s, 8, 2) == 11 - 2 * s);
    // n_micro == pp: Megatron runs every forward first.
    CHECK(warmup_micro_batches(kInter, 4, s, 4, 2) == 8);
    CHECK(max_live_activations(kInter, 4, s, 4, 2) == 8);
  }
  CHECK(warmup_micro_batches(k1F1B, 8, 0, 3) == 3);
  CHECK(warmup_micro_batches(kInter, 8, 0, 16, 4) == 38);
  CHECK(bubble_fraction(k1F1B, 4, 8) == Approx(3.0 / 8));
  CHECK(bubble_fraction(kInter, 4, 8, 2) == Approx(3.0 / 16));
  CHECK(bubble_fraction(k1F1B, 1, 8) == 0.0);
}

TEST_CASE("invalid schedule parameters are user errors naming the numbers", "[pipeline]") {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([] { make_schedule(kInter, 4, 0, 6, 2); }),
             Contains("(6)") && Contains("(4)") && Contains("interleaved"));
  CHECK_THAT(message([] { make_schedule(k1F1B, 4, 0, 8, 2); }), Contains("got 2 virtual"));
  CHECK_THAT(message([] { make_schedule(kInter, 1, 0, 8, 2); }), Contains(">= 2, got 1"));
  CHECK_THAT(message([] { make_schedule(k1F1B, 4, 4, 8); }), Contains("stage 4"));
  CHECK_THAT(message([] { make_schedule(k1F1B, 4, -1, 8); }), Contains("stage -1"));
  CHECK_THAT(message([] { make_schedule(k1F1B, 0, 0, 8); }), Contains("got 0"));
  CHECK_THAT(message([] { make_schedule(k1F1B, 2, 0, 0); }), Contains("micro-batches must be"));
  CHECK_THAT(message([] { warmup_micro_batches(kInter, 4, 0, 0, 0); }), Contains("got 0"));
  CHECK_THAT(message([] { bubble_fraction(kInter, 4, 10, 2); }), Contains("(10)"));
}

TEST_CASE("virtual stage placement follows Megatron's interleaving", "[pipeline]") {
  CHECK(virtual_stage_index(4, 1, 1) == 5);
  CHECK(locate_virtual_stage(4, 2, 5) == VirtualStage{1, 1});
  CHECK(forward_peer(4, 2, 3, 0) == VirtualStage{0, 1});
  CHECK(backward_peer(4, 2, 0, 1) == VirtualStage{3, 0});
  CHECK(forward_peer(4, 1, 1, 0) == VirtualStage{2, 0});
  for (int pp = 1; pp <= 5; ++pp)
    for (int v = 1; v <= 3; ++v)
      for (int s = 0; s < pp * v; ++s) {
        const VirtualStage vs = locate_virtual_stage(pp, v, s);
        CHECK(virtual_stage_index(pp, vs.rank, vs.chunk) == s);
      }
  CHECK_THROWS_AS(locate_virtual_stage(4, 2, 8), Error);
  CHECK_THROWS_AS(forward_peer(4, 2, 3, 1), Error);  // last virtual stage
  CHECK_THROWS_AS(backward_peer(4, 2, 0, 0), Error);  // first virtual stage
}

TEST_CASE("grid: every schedule runs to completion against its neighbours", "[pipeline]") {
  for (const Case& c : grid()) {
    INFO(name(c));
    const auto all = make_all_schedules(c.kind, c.pp, c.n, c.v);
    REQUIRE(int(all.size()) == c.pp);
    for (int s = 0; s < c.pp; ++s) {
      INFO("stage " << s);
      REQUIRE(all[s] == make_schedule(c.kind, c.pp, s, c.n, c.v));
      check_rank_list(c, s, all[s]);
    }
    for (CommModel comm : {CommModel::Batched, CommModel::Buffered}) {
      PipelineSimOptions opt;
      opt.comm = comm;
      PipelineSimResult res;
      REQUIRE_NOTHROW(res = simulate_pipeline(all, c.n, c.v, opt));
      for (int s = 0; s < c.pp; ++s) {
        INFO("stage " << s);
        const int bound = max_live_activations(c.kind, c.pp, s, c.n, c.v);
        REQUIRE(res.peak_live[s] <= bound);
        REQUIRE(res.peak_live[s] == bound);  // the bound is tight
        REQUIRE(res.forwards_before_first_backward[s] ==
                std::min(megatron_warmup(c.kind, c.pp, s, c.n, c.v) + 1, c.n * c.v));
        REQUIRE(int(res.trace[s].size()) == 2 * c.n * c.v);
      }
      // With unit costs (forward 1, backward 2 per chunk) the schedule ends
      // after n * v + pp - 1 forward+backward slots: the measured bubble is
      // exactly Megatron's (pp - 1) / n / v.
      REQUIRE(res.makespan == Approx((c.n * c.v + c.pp - 1) * 3.0));
      REQUIRE(res.bubble() == Approx(bubble_fraction(c.kind, c.pp, c.n, c.v)));
    }
  }
}

TEST_CASE("the simulator rejects broken schedules", "[pipeline]") {
  using A = ActionKind;
  auto sim_error = [](const std::vector<std::vector<PipeAction>>& lists, int n, int v,
                      CommModel comm = CommModel::Batched) {
    PipelineSimOptions opt;
    opt.comm = comm;
    try {
      simulate_pipeline(lists, n, v, opt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto good = make_all_schedules(k1F1B, 2, 2);
  REQUIRE(sim_error(good, 2, 1) == "no error");

  SECTION("circular wait is a deadlock") {
    std::vector<std::vector<PipeAction>> lists = {
        {{A::Forward, 0}, {A::SendForward, 0}, {A::RecvBackward, 0}, {A::Backward, 0},
         {A::Forward, 1}, {A::SendForward, 1}, {A::RecvBackward, 1}, {A::Backward, 1}},
        {{A::RecvForward, 0}, {A::Forward, 0}, {A::Backward, 0}, {A::RecvForward, 1},
         {A::Forward, 1}, {A::Backward, 1}, {A::SendBackward, 0}, {A::SendBackward, 1}}};
    for (CommModel comm : {CommModel::Batched, CommModel::Buffered})
      CHECK_THAT(sim_error(lists, 2, 1, comm), Contains("deadlock") && Contains("rank 1"));
  }
  SECTION("receives in the wrong order are a mismatch") {
    auto lists = good;
    auto& r1 = lists[1];
    auto f0 = std::find(r1.begin(), r1.end(), PipeAction{A::RecvForward, 0});
    auto f1 = std::find(r1.begin(), r1.end(), PipeAction{A::RecvForward, 1});
    std::swap(f0->micro, f1->micro);
    CHECK_THAT(sim_error(lists, 2, 1), Contains("matched with"));
  }
  SECTION("a dropped send leaves its receiver waiting") {
    auto lists = good;
    lists[0].erase(std::find(lists[0].begin(), lists[0].end(), PipeAction{A::SendForward, 1}));
    CHECK_THAT(sim_error(lists, 2, 1), Contains("deadlock"));
    CHECK_THAT(sim_error(lists, 2, 1, CommModel::Buffered), Contains("deadlock"));
  }
  SECTION("an extra send is never received") {
    auto lists = good;
    lists[1].push_back({A::SendBackward, 1});
    CHECK_THAT(sim_error(lists, 2, 1, CommModel::Buffered), Contains("sent twice"));
  }
  SECTION("forward before its input arrives") {
    auto lists = good;
    auto& r1 = lists[1];
    auto recv = std::find(r1.begin(), r1.end(), PipeAction{A::RecvForward, 0});
    std::iter_swap(recv, recv + 1);
    CHECK_THAT(sim_error(lists, 2, 1), Contains("input not received"));
  }
  SECTION("backward before forward, and missing compute") {
    std::vector<std::vector<PipeAction>> one = {{{A::Backward, 0}, {A::Forward, 0}}};
    CHECK_THAT(sim_error(one, 1, 1), Contains("backward before its forward"));
    one = {{{A::Forward, 0}, {A::Backward, 0}}};
    CHECK_THAT(sim_error(one, 2, 1), Contains("micro-batch 1 never ran forward"));
  }
  SECTION("sending before computing, and from the last stage") {
    std::vector<std::vector<PipeAction>> lists = good;
    auto& r1 = lists[1];
    r1.insert(r1.begin() + 2, {A::SendForward, 0});
    CHECK_THAT(sim_error(lists, 2, 1), Contains("no one to send to"));
    lists = good;
    auto& r0 = lists[0];
    auto send = std::find(r0.begin(), r0.end(), PipeAction{A::SendForward, 0});
    std::iter_swap(send, send - 1);
    CHECK_THAT(sim_error(lists, 2, 1), Contains("not computed yet"));
  }
}

namespace {

// Megatron-DeepSpeed's ZeroBubbleH1Pipeline.steps() written out on its own:
// its F, FB, FBW, BW and W sections as a list of compute actions ("F3",
// "B3" whole backward, "BI3" input pass, "W3" the oldest pending weight pass).
std::vector<std::string> upstream_zbh1_computes(int stages, int stage, int m, bool exact) {
  std::vector<std::string> out;
  std::deque<int> queue;
  const int warm = stages - stage;
  const bool first = stage == 0;
  int fwd = 0, bwd = 0, weight = 0;
  auto F = [&] { out.push_back(fmt::format("F{}", fwd++)); };
  auto B = [&] { out.push_back(fmt::format("B{}", bwd++)); };
  auto BI = [&] {
    queue.push_back(bwd);
    out.push_back(fmt::format("BI{}", bwd++));
  };
  auto W = [&] {
    out.push_back(fmt::format("W{}", queue.front()));
    queue.pop_front();
  };
  for (int i = 0; i < warm - 1; ++i)
    if (fwd < m) F();
  for (int i = 0; i < stage; ++i)
    if (fwd < m) F(), BI();
  while (fwd < m) {
    F();
    ++weight;
    if (first) {
      B();
    } else if (fwd == m || exact) {
      BI();
      W();
    } else {
      B();
    }
  }
  while (bwd < m) {
    ++weight;
    if (first) {
      B();
    } else {
      BI();
      W();
    }
  }
  for (; weight < m; ++weight) W();
  return out;
}

std::vector<std::string> computes_of(const std::vector<PipeAction>& list) {
  std::vector<std::string> out;
  for (const PipeAction& a : list)
    if (!is_communication(a.kind)) out.push_back(to_string(a));
  return out;
}

}  // namespace

TEST_CASE("ZB-H1: the computes of Megatron-DeepSpeed's schedule, 1F1B's messages", "[pipeline]") {
  for (ScheduleKind kind : {ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleH1Exact})
    for (int pp = 1; pp <= 8; ++pp)
      for (int n : {1, 2, 3, 4, 5, 7, 8, 12, 16})
        for (int s = 0; s < pp; ++s) {
          INFO(to_string(kind) << " pp " << pp << " n " << n << " stage " << s);
          const std::vector<PipeAction> zb = make_schedule(kind, pp, s, n);
          CHECK(computes_of(zb) == upstream_zbh1_computes(pp, s, n, kind == ScheduleKind::ZeroBubbleH1Exact));
          // The messages are 1F1B's, in 1F1B's order, and so are the forwards
          // and backwards (whole or input passes).
          std::vector<PipeAction> base = make_schedule(k1F1B, pp, s, n), rest;
          for (PipeAction a : zb) {
            if (a.kind == ActionKind::WeightGrad) continue;
            if (a.kind == ActionKind::BackwardInput) a.kind = ActionKind::Backward;
            rest.push_back(a);
          }
          CHECK(rest == base);
          CHECK(max_live_activations(kind, pp, s, n) == max_live_activations(k1F1B, pp, s, n));
          // The input passes of the steady phase's first `s` backwards wait,
          // and one more while each later input pass runs before its weight pass.
          const int steady = n - std::min(pp - s - 1, n), waiting = std::min(s, steady);
          CHECK(max_pending_weight_grads(kind, pp, s, n) == (s == 0 ? 0 : waiting + (n > waiting ? 1 : 0)));
        }
  // pp 4, 8 micro-batches, stage 2: two input passes wait; the steady phase
  // runs whole backwards (default) or splits them too (exact).
  CHECK(join(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 2, 8), 1, true) ==
        "F0 F1 BI0 F2 BI1 F3 B2 F4 B3 F5 B4 F6 B5 F7 BI6 W0 BI7 W1 W6 W7");
  CHECK(join(make_schedule(ScheduleKind::ZeroBubbleH1Exact, 4, 2, 8), 1, true) ==
        "F0 F1 BI0 F2 BI1 F3 BI2 W0 F4 BI3 W1 F5 BI4 W2 F6 BI5 W3 F7 BI6 W4 BI7 W5 W6 W7");
  CHECK(to_string(ScheduleKind::ZeroBubbleH1) == "zbh1");
  CHECK(pipeline_schedule_kind(1, true, true) == ScheduleKind::ZeroBubbleH1Exact);
  CHECK(pipeline_schedule_kind(2, true, false) == kInter);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 0, 8, 2), UserError);
}

TEST_CASE("ZB-H1 runs against its neighbours and cuts 1F1B's bubble to a third", "[pipeline]") {
  for (ScheduleKind kind : {ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleH1Exact})
    for (int pp = 1; pp <= 8; ++pp)
      for (int n : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
        INFO(to_string(kind) << " pp " << pp << " n " << n);
        const auto all = make_all_schedules(kind, pp, n);
        for (CommModel comm : {CommModel::Batched, CommModel::Buffered}) {
          INFO((comm == CommModel::Batched ? "batched" : "buffered"));
          PipelineSimOptions opt;  // forward 1, input pass 1, weight pass 1, whole backward 2
          opt.comm = comm;
          PipelineSimResult zb, base;
          REQUIRE_NOTHROW(zb = simulate_pipeline(all, n, 1, opt));
          base = simulate_pipeline(make_all_schedules(k1F1B, pp, n), n, 1, opt);
          for (int s = 0; s < pp; ++s) REQUIRE(zb.peak_live[s] == base.peak_live[s]);
          REQUIRE(base.bubble() == Approx(bubble_fraction(k1F1B, pp, n)));
          REQUIRE(zb.makespan <= base.makespan);
          if (pp > 1 && n > 1) REQUIRE(zb.makespan < base.makespan);
          if (n >= pp && comm == CommModel::Batched) {
            // The zero-bubble paper's count with F = B = W: the bubble is
            // (pp - 1) (F + B - W), a third of 1F1B's (pp - 1) (F + B + W).
            // Exact semantics run one weight pass more in the cooldown when
            // the steady phase is longer than the pipeline.
            const bool extra = kind == ScheduleKind::ZeroBubbleH1Exact && n > pp && pp > 1;
            CHECK(zb.makespan == Approx(3.0 * n + (pp - 1) + (extra ? 1 : 0)));
            if (!extra) CHECK(zb.bubble() == Approx(bubble_fraction(kind, pp, n)));
          }
        }
      }
  // The trace of pp 4, 8 micro-batches: stage 0 waits 3 units for its first
  // gradient (1F1B: 6) and ends at 27 (1F1B: 33).
  const PipelineSimResult r = simulate_pipeline(make_all_schedules(ScheduleKind::ZeroBubbleH1, 4, 8), 8, 1);
  REQUIRE(r.trace[0][4].action == PipeAction{ActionKind::Backward, 0, 0});
  CHECK(r.trace[0][4].start == 7.0);
  CHECK(r.makespan == 27.0);
}
