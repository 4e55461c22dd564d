// Group spaces (lib/parallel/group_space.h) against an element-by-element
// reference: the group's flat elements listed one by one.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "lib/parallel/group_space.h"

using namespace ds;

namespace {

std::vector<int64_t> elements(const std::vector<Range>& ranges) {
  std::vector<int64_t> e;
  for (const Range& r : ranges)
    for (int64_t x = r.begin; x < r.end; ++x) e.push_back(x);
  return e;
}

}  // namespace

TEST_CASE("group space: pieces and positions match the element list", "[zero]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Random sorted disjoint ranges (some adjacent, some empty) in [0, 200).
    std::vector<Range> ranges;
    int64_t at = 0;
    while (at < 200) {
      const int64_t gap = rng() % 3 == 0 ? 0 : rng() % 20, len = rng() % 25;
      if (at + gap + len > 200) break;
      ranges.push_back({at + gap, at + gap + len});
      at += gap + len;
    }
    const GroupSpace g(ranges);
    const std::vector<int64_t> el = elements(ranges);
    CAPTURE(trial);
    REQUIRE(g.total() == static_cast<int64_t>(el.size()));
    for (size_t i = 1; i < g.ranges().size(); ++i) CHECK(g.ranges()[i - 1].end < g.ranges()[i].begin);  // merged
    for (int64_t x = 0; x < 200; ++x) {
      const auto it = std::find(el.begin(), el.end(), x);
      CHECK(g.position(x) == (it == el.end() ? -1 : it - el.begin()));
    }
    for (int q = 0; q < 30; ++q) {
      const int64_t b = static_cast<int64_t>(rng() % (el.size() + 3)) - 1, e = b + static_cast<int64_t>(rng() % 40);
      std::vector<int64_t> got;
      int64_t next = std::max<int64_t>(b, 0);
      for (const GroupSpace::Piece& p : g.pieces({b, e})) {
        CHECK(p.flat.size() > 0);
        CHECK(p.at == next);  // in order, no gap
        next += p.flat.size();
        for (int64_t x = p.flat.begin; x < p.flat.end; ++x) got.push_back(x);
      }
      std::vector<int64_t> want;
      for (int64_t i = std::max<int64_t>(b, 0); i < std::min<int64_t>(e, el.size()); ++i) want.push_back(el[i]);
      CHECK(got == want);
      // within(flat range): the group's elements inside it, with their positions.
      const Range f{static_cast<int64_t>(rng() % 200), 0};
      const Range ff{f.begin, f.begin + static_cast<int64_t>(rng() % 60)};
      for (const GroupSpace::Piece& p : g.within(ff)) {
        CHECK(p.flat.begin >= ff.begin);
        CHECK(p.flat.end <= ff.end);
        CHECK(g.position(p.flat.begin) == p.at);
        CHECK(g.position(p.flat.end - 1) == p.at + p.flat.size() - 1);
      }
      int64_t count = 0;
      for (const GroupSpace::Piece& p : g.within(ff)) count += p.flat.size();
      int64_t want_count = 0;
      for (int64_t x : el) want_count += x >= ff.begin && x < ff.end;
      CHECK(count == want_count);
    }
  }
}

TEST_CASE("group space: the identity space is flat space", "[zero]") {
  const GroupSpace g = GroupSpace::identity(1000);
  REQUIRE(g.ranges().size() == 1);
  CHECK(g.ranges()[0] == Range{0, 1000});
  CHECK(g.total() == 1000);
  const auto p = g.pieces({100, 300});
  REQUIRE(p.size() == 1);
  CHECK(p[0] == GroupSpace::Piece{{100, 300}, 100});
  CHECK(GroupSpace::identity(0).total() == 0);
  CHECK(GroupSpace::identity(0).pieces({0, 10}).empty());
  CHECK(GroupSpace({{5, 10}}).pieces({0, 5})[0] == GroupSpace::Piece{{5, 10}, 0});
}
