// Rank grid tests: the group lists Megatron-LM's initialize_model_parallel
// produces (its documented world 16 / TP 2 / PP 4 example, written out), plus
// properties checked for many shapes against a definition by coordinates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "lib/core/error.h"
#include "lib/parallel/rank_grid.h"

using namespace ds;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("rank grid: Megatron's world 16, TP 2, PP 4 example", "[rank_grid]") {
  RankGrid g = make_rank_grid(16, 2, 4, 5);
  CHECK(g.dp == 2);
  CHECK(g.tp_groups == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(g.dp_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(g.pp_groups == Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(g.mp_groups == Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}});
  CHECK(g.embedding_groups == Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  // rank 5 = tp 1, dp 0, stage 1
  CHECK(std::tie(g.tp_rank, g.dp_rank, g.pp_rank) == std::make_tuple(1, 0, 1));
  CHECK(g.my_tp_group() == std::vector<int>{4, 5});
  CHECK(g.my_dp_group() == std::vector<int>{5, 7});
  CHECK(g.my_pp_group() == std::vector<int>{1, 5, 9, 13});
  CHECK(g.my_mp_group() == std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13});
  CHECK_FALSE(g.in_embedding_group());
  CHECK(make_rank_grid(16, 2, 4, 13).in_embedding_group());
  CHECK(g.describe() == "rank 5: tp 1/2 dp 0/2 pp 1/4");
}

TEST_CASE("rank grid: small shapes written out", "[rank_grid]") {
  RankGrid a = make_rank_grid(8, 2, 2, 0);  // DP 2
  CHECK(a.tp_groups == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(a.dp_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(a.pp_groups == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  RankGrid b = make_rank_grid(4, 1, 1, 2);  // pure data parallel
  CHECK(b.dp_groups == Groups{{0, 1, 2, 3}});
  CHECK(b.tp_groups == Groups{{0}, {1}, {2}, {3}});
  CHECK(b.embedding_groups == Groups{{0}, {1}, {2}, {3}});
  CHECK(b.dp_rank == 2);
  RankGrid c = make_rank_grid(6, 3, 1, 4);  // TP 3, DP 2
  CHECK(c.tp_groups == Groups{{0, 1, 2}, {3, 4, 5}});
  CHECK(c.dp_groups == Groups{{0, 3}, {1, 4}, {2, 5}});
  CHECK(std::tie(c.tp_rank, c.dp_rank, c.pp_rank) == std::make_tuple(1, 1, 0));
  RankGrid d = make_rank_grid(4, 1, 4, 3);  // pure pipeline
  CHECK(d.pp_groups == Groups{{0, 1, 2, 3}});
  CHECK(d.embedding_groups == Groups{{0, 3}});
  CHECK(d.is_last_stage());
}

TEST_CASE("rank grid: DeepSpeed-Ulysses sequence axis (tp-sp-dp-pp)", "[rank_grid]") {
  // TP 1: Megatron-DeepSpeed's groups, sp of consecutive ranks, sdp of SP x DP consecutive ranks.
  RankGrid a = make_rank_grid(8, 1, 1, 5, 2);  // SP 2, DP 4
  CHECK(a.dp == 4);
  CHECK(a.sdp == 8);
  CHECK(a.sp_groups == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(a.dp_groups == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(a.sdp_groups == Groups{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(std::tie(a.sp_rank, a.dp_rank, a.sdp_rank) == std::make_tuple(1, 2, 5));
  CHECK(a.mp_groups == Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(a.describe() == "rank 5: tp 0/1 dp 2/4 pp 0/1 sp 1/2");
  // TP 2 x SP 2 x PP 2, DP 1: rank 6 = tp 0, sp 1, pp 1.
  RankGrid b = make_rank_grid(8, 2, 2, 6, 2);
  CHECK(b.tp_groups == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(b.sp_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(b.sdp_groups == b.sp_groups);  // DP 1
  CHECK(b.pp_groups == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(b.mp_groups == Groups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(std::tie(b.tp_rank, b.sp_rank, b.dp_rank, b.pp_rank) == std::make_tuple(0, 1, 0, 1));
  CHECK(b.my_sp_group() == std::vector<int>{4, 6});
  CHECK(b.rank_of(0, 0, 1, 1) == 6);
  // SP 1: the sdp group is the dp group.
  RankGrid c = make_rank_grid(8, 2, 1, 3);
  CHECK(c.sdp_groups == c.dp_groups);
  CHECK(c.sdp_rank == c.dp_rank);
  try {
    make_rank_grid(6, 1, 1, 0, 4);
    FAIL("expected an error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("world size 6") && Catch::Contains("ds-sequence-parallel-size 4"));
  }
}

TEST_CASE("rank grid: DeepSpeed's expert-parallel split of data parallelism (tp-sp-ep-dp-pp)", "[rank_grid]") {
  // World 8, TP 2, EP 2, DP 4: ep groups are EP consecutive members of a dp group,
  // edp groups the members at the same place in theirs.
  RankGrid a = make_rank_grid(8, 2, 1, 6, 1, 2);
  CHECK(std::tie(a.dp, a.ep, a.edp) == std::make_tuple(4, 2, 2));
  CHECK(a.dp_groups == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(a.ep_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(a.edp_groups == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(std::tie(a.tp_rank, a.ep_rank, a.edp_rank, a.dp_rank) == std::make_tuple(0, 1, 1, 3));
  CHECK(a.my_ep_group() == std::vector<int>{4, 6});
  CHECK(a.my_edp_group() == std::vector<int>{2, 6});
  CHECK(a.shard_coords() == ShardCoords{2, 0, 1, 0, 1, 2, 1});
  CHECK(a.describe() == "rank 6: tp 0/2 dp 3/4 pp 0/1 ep 1/2");
  // World 16, TP 2, PP 2, EP 2 (DP 4): rank 13 = tp 1, ep 0, edp 1, stage 1.
  RankGrid b = make_rank_grid(16, 2, 2, 13, 1, 2);
  CHECK(b.ep_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(b.edp_groups == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(std::tie(b.tp_rank, b.ep_rank, b.edp_rank, b.dp_rank, b.pp_rank) == std::make_tuple(1, 0, 1, 2, 1));
  CHECK(b.my_ep_group() == std::vector<int>{13, 15});
  CHECK(b.my_edp_group() == std::vector<int>{9, 13});
  CHECK(b.describe() == "rank 13: tp 1/2 dp 2/4 pp 1/2 ep 0/2");
  // Every rank keeps its dp/sdp/pp/mp placement; EP 1 makes ep groups of one rank.
  for (auto [world, tp, pp, ep] : {std::tuple{8, 2, 1, 2}, {16, 2, 2, 2}, {16, 1, 1, 4}, {24, 3, 2, 2}}) {
    INFO("world " << world << " tp " << tp << " pp " << pp << " ep " << ep);
    for (int r = 0; r < world; ++r) {
      const RankGrid e = make_rank_grid(world, tp, pp, r, 1, ep), d = make_rank_grid(world, tp, pp, r);
      CHECK(e.dp_groups == d.dp_groups);
      CHECK(e.sdp_groups == d.sdp_groups);
      CHECK(e.pp_groups == d.pp_groups);
      CHECK(e.mp_groups == d.mp_groups);
      CHECK(std::tie(e.tp_rank, e.dp_rank, e.pp_rank, e.dp_index) ==
            std::tie(d.tp_rank, d.dp_rank, d.pp_rank, d.dp_index));
      CHECK(e.rank_of(e.tp_rank, e.dp_rank, e.pp_rank) == r);
      CHECK(e.my_ep_group()[e.ep_rank] == r);
      CHECK(e.my_edp_group()[e.edp_rank] == r);
      CHECK(e.dp_rank == e.ep_rank + ep * e.edp_rank);
      CHECK(d.my_ep_group() == std::vector<int>{r});
      CHECK(d.my_edp_group() == d.my_dp_group());
    }
  }
  // With DeepSpeed-Ulysses (world 8, SP 2, EP 2, DP 4): an ep group is EP
  // ranks of one dp group (one sequence position); an edp group holds every
  // Ulysses rank of the ranks with the same experts: EDP = SP x DP / EP.
  RankGrid u = make_rank_grid(8, 1, 1, 5, 2, 2);
  CHECK(std::tie(u.dp, u.sp, u.ep, u.edp, u.sdp) == std::make_tuple(4, 2, 2, 4, 8));
  CHECK(u.ep_groups == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(u.edp_groups == Groups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(std::tie(u.sp_rank, u.ep_rank, u.dp_rank, u.edp_rank) == std::make_tuple(1, 0, 2, 3));
  CHECK(u.my_ep_group() == std::vector<int>{5, 7});
  CHECK(u.my_edp_group() == std::vector<int>{0, 1, 4, 5});
  for (auto [world, tp, sp, ep] : {std::tuple{8, 1, 2, 2}, {16, 2, 2, 2}, {16, 1, 2, 4}, {24, 1, 3, 2}}) {
    INFO("world " << world << " tp " << tp << " sp " << sp << " ep " << ep);
    for (int r = 0; r < world; ++r) {
      const RankGrid e = make_rank_grid(world, tp, 1, r, sp, ep), d = make_rank_grid(world, tp, 1, r, sp);
      CHECK(e.sdp_groups == d.sdp_groups);
      CHECK(std::tie(e.tp_rank, e.sp_rank, e.dp_rank, e.sdp_rank) == std::tie(d.tp_rank, d.sp_rank, d.dp_rank, d.sdp_rank));
      CHECK(e.edp == e.sdp / ep);
      CHECK(e.edp_rank == e.sp_rank + sp * (e.dp_rank / ep));
      CHECK(e.my_edp_group()[e.edp_rank] == r);
      CHECK(e.my_ep_group()[e.ep_rank] == r);
      for (int m : e.my_ep_group()) {  // one sequence position, one dp group
        const RankGrid o = make_rank_grid(world, tp, 1, m, sp, ep);
        CHECK(o.sp_rank == e.sp_rank);
        CHECK(o.dp_index == e.dp_index);
      }
      for (int m : e.my_edp_group()) {  // the same experts, one sdp group
        const RankGrid o = make_rank_grid(world, tp, 1, m, sp, ep);
        CHECK(o.ep_rank == e.ep_rank);
        CHECK(o.sdp_index == e.sdp_index);
      }
    }
  }
  CHECK_THROWS_WITH(make_rank_grid(8, 2, 1, 0, 1, 3),
                    Catch::Contains("moe-expert-parallel-size 3 does not divide the data-parallel size 4"));
  const ParallelLayout l = make_parallel_layout({.tp = 2, .ep = 2}, 8);
  CHECK(make_rank_grid(l, 6).describe() == a.describe());
}

// Groups defined by coordinates: members share every coordinate but `free`.
static Groups by_coordinates(const RankGrid& g, int free) {
  std::map<std::tuple<int, int>, std::vector<int>> m;
  for (int r = 0; r < g.world; ++r) {
    RankGrid x = make_rank_grid(g.world, g.tp, g.pp, r);
    int c[3] = {x.tp_rank, x.dp_rank, x.pp_rank};
    std::tuple<int, int> key = free == 0 ? std::make_tuple(c[1], c[2])
                               : free == 1 ? std::make_tuple(c[0], c[2])
                                           : std::make_tuple(c[0], c[1]);
    m[key].push_back(r);
  }
  Groups out;
  for (auto& [k, v] : m) out.push_back(v);
  std::sort(out.begin(), out.end());
  return out;
}

static Groups sorted(Groups g) {
  std::sort(g.begin(), g.end());
  return g;
}

TEST_CASE("rank grid: properties over many shapes", "[rank_grid]") {
  for (int world : {1, 2, 4, 6, 8, 12, 16, 24, 32})
    for (int tp : {1, 2, 3, 4, 8})
      for (int pp : {1, 2, 3, 4}) {
        if (world % (tp * pp) != 0) continue;
        INFO("world " << world << " tp " << tp << " pp " << pp);
        RankGrid g0 = make_rank_grid(world, tp, pp, 0);
        CHECK(sorted(g0.tp_groups) == by_coordinates(g0, 0));
        CHECK(sorted(g0.dp_groups) == by_coordinates(g0, 1));
        CHECK(sorted(g0.pp_groups) == by_coordinates(g0, 2));
        for (int r = 0; r < world; ++r) {
          RankGrid g = make_rank_grid(world, tp, pp, r);
          REQUIRE(g.rank_of(g.tp_rank, g.dp_rank, g.pp_rank) == r);
          CHECK(g.my_tp_group()[g.tp_rank] == r);
          CHECK(g.my_dp_group()[g.dp_rank] == r);
          CHECK(g.my_pp_group()[g.pp_rank] == r);
          CHECK(std::count(g.my_mp_group().begin(), g.my_mp_group().end(), r) == 1);
          CHECK(g.my_mp_group().size() == size_t(tp * pp));
          CHECK(g.tp_groups == g0.tp_groups);  // every rank derives the same lists
        }
      }
}

TEST_CASE("rank grid: errors name the numbers", "[rank_grid]") {
  try {
    make_rank_grid(6, 4, 1, 0);
    FAIL("expected an error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("world size 6") && Catch::Contains("4 x") &&
                             Catch::Contains("= 4"));
  }
  CHECK_THROWS_AS(make_rank_grid(8, 2, 3, 0), UserError);
  CHECK_THROWS_AS(make_rank_grid(8, 0, 1, 0), UserError);
  CHECK_THROWS_AS(make_rank_grid(8, 2, 2, 8), Error);
}

TEST_CASE("axis grid: a generic order (tp-cp-ep-dp-pp) gives groups by coordinates", "[rank_grid]") {
  const std::vector<Axis> order = parse_axis_order("tp-cp-ep-dp-pp");
  REQUIRE(order == std::vector<Axis>{Axis::TP, Axis::CP, Axis::EP, Axis::DP, Axis::PP});
  const AxisGrid a(order, {2, 2, 1, 3, 2});  // world 24
  REQUIRE(a.world() == 24);
  CHECK(a.order_string() == "tp-cp-ep-dp-pp");
  for (int r = 0; r < a.world(); ++r) REQUIRE(a.rank_of(a.coords(r)) == r);
  // rank 13 = tp 1, cp 0, ep 0, dp 0 (13 / 4 = 3 -> dp 0, pp 1)
  CHECK(a.coords(13) == std::vector<int>{1, 0, 0, 0, 1});
  CHECK(a.group_of(13, {Axis::CP}) == std::vector<int>{13, 15});
  CHECK(a.group_of(13, {Axis::DP}) == std::vector<int>{13, 17, 21});
  CHECK(a.group_of(13, {Axis::TP, Axis::CP}) == std::vector<int>{12, 13, 14, 15});
  for (Axis over : {Axis::TP, Axis::CP, Axis::DP, Axis::PP}) {
    const auto gs = a.groups({over});
    CHECK(gs.size() == size_t(a.world() / a.size(over)));
    std::vector<int> seen;
    for (size_t i = 0; i < gs.size(); ++i) {
      CHECK(gs[i].size() == size_t(a.size(over)));
      for (int r : gs[i]) {
        seen.push_back(r);
        CHECK(a.group_index(r, {over}) == int(i));
        for (Axis other : {Axis::TP, Axis::CP, Axis::DP, Axis::PP})  // members agree off `over`
          if (other != over) CHECK(a.coord(r, other) == a.coord(gs[i].front(), other));
      }
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen.size() == size_t(a.world()));
    CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  }
  CHECK_THROWS_AS(parse_axis_order("tp-xx-pp"), UserError);
  CHECK_THROWS_AS(parse_axis_order("tp-dp-tp"), UserError);
}
