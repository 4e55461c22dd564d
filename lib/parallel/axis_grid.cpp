// AxisGrid: coordinates and groups of a mixed-radix rank layout.
#include "lib/parallel/axis_grid.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

namespace {
constexpr Axis kAllAxes[] = {Axis::TP, Axis::SP, Axis::CP, Axis::EP, Axis::DP, Axis::PP};
}  // namespace

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::TP: return "tp";
    case Axis::SP: return "sp";
    case Axis::CP: return "cp";
    case Axis::EP: return "ep";
    case Axis::DP: return "dp";
    case Axis::PP: return "pp";
  }
  return "?";
}

std::vector<Axis> parse_axis_order(std::string_view order) {
  std::vector<Axis> out;
  size_t at = 0;
  while (at <= order.size()) {
    const size_t dash = std::min(order.find('-', at), order.size());
    const std::string_view name = order.substr(at, dash - at);
    const Axis* hit = std::find_if(std::begin(kAllAxes), std::end(kAllAxes),
                                   [&](Axis a) { return name == axis_name(a); });
    DS_USER_CHECK(hit != std::end(kAllAxes), "parallel order '{}': unknown axis '{}' (use tp, sp, cp, ep, dp, pp)",
                  order, name);
    DS_USER_CHECK(std::find(out.begin(), out.end(), *hit) == out.end(), "parallel order '{}': axis '{}' twice",
                  order, name);
    out.push_back(*hit);
    at = dash + 1;
  }
  return out;
}

AxisGrid::AxisGrid(std::vector<Axis> order, std::vector<int> sizes)
    : order_(std::move(order)), sizes_(std::move(sizes)) {
  DS_CHECK(order_.size() == sizes_.size(), "AxisGrid: {} axes but {} sizes", order_.size(), sizes_.size());
  for (size_t i = 0; i < sizes_.size(); ++i) {
    DS_CHECK(sizes_[i] >= 1, "AxisGrid: axis {} has size {}", axis_name(order_[i]), sizes_[i]);
    world_ *= sizes_[i];
  }
}

int AxisGrid::size(Axis a) const {
  for (size_t i = 0; i < order_.size(); ++i)
    if (order_[i] == a) return sizes_[i];
  return 1;
}

std::vector<int> AxisGrid::coords(int rank) const {
  DS_CHECK(rank >= 0 && rank < world_, "rank {} outside world size {}", rank, world_);
  std::vector<int> c(order_.size());
  for (size_t i = 0; i < order_.size(); ++i) {
    c[i] = rank % sizes_[i];
    rank /= sizes_[i];
  }
  return c;
}

int AxisGrid::coord(int rank, Axis a) const {
  const std::vector<int> c = coords(rank);
  for (size_t i = 0; i < order_.size(); ++i)
    if (order_[i] == a) return c[i];
  return 0;
}

int AxisGrid::rank_of(const std::vector<int>& c) const {
  DS_CHECK(c.size() == order_.size(), "AxisGrid::rank_of: {} coordinates for {} axes", c.size(), order_.size());
  int r = 0;
  for (size_t i = order_.size(); i-- > 0;) {
    DS_CHECK(c[i] >= 0 && c[i] < sizes_[i], "AxisGrid::rank_of: {} coordinate {} outside [0, {})",
             axis_name(order_[i]), c[i], sizes_[i]);
    r = r * sizes_[i] + c[i];
  }
  return r;
}

bool AxisGrid::in(Axis a, std::initializer_list<Axis> over) const {
  return std::find(over.begin(), over.end(), a) != over.end();
}

// The rank with its coordinates along `over` set to 0: equal for exactly the
// members of one group.
int AxisGrid::group_key(int rank, std::initializer_list<Axis> over) const {
  int key = 0, stride = 1, rest = rank;
  for (size_t i = 0; i < order_.size(); ++i) {
    if (!in(order_[i], over)) key += (rest % sizes_[i]) * stride;
    rest /= sizes_[i];
    stride *= sizes_[i];
  }
  return key;
}

std::vector<int> AxisGrid::group_of(int rank, std::initializer_list<Axis> over) const {
  DS_CHECK(rank >= 0 && rank < world_, "rank {} outside world size {}", rank, world_);
  const int key = group_key(rank, over);
  std::vector<int> g;  // ascending: ranks are visited in order
  for (int r = 0; r < world_; ++r)
    if (group_key(r, over) == key) g.push_back(r);
  return g;
}

std::vector<std::vector<int>> AxisGrid::groups(std::initializer_list<Axis> over) const {
  // Groups in order of their first member, each filled in ascending rank order.
  std::vector<int> slot(static_cast<size_t>(world_), -1);  // key -> position in `out`
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    int& pos = slot[static_cast<size_t>(group_key(r, over))];
    if (pos < 0) {
      pos = static_cast<int>(out.size());
      out.emplace_back();
    }
    out[static_cast<size_t>(pos)].push_back(r);
  }
  return out;
}

int AxisGrid::group_index(int rank, std::initializer_list<Axis> over) const {
  DS_CHECK(rank >= 0 && rank < world_, "rank {} outside world size {}", rank, world_);
  const int key = group_key(rank, over);
  std::vector<bool> seen(static_cast<size_t>(world_), false);
  int index = 0;  // groups whose first member comes before this group's
  for (int r = 0; r < world_; ++r) {
    const int k = group_key(r, over);
    if (k == key) return index;
    if (!seen[static_cast<size_t>(k)]) {
      seen[static_cast<size_t>(k)] = true;
      ++index;
    }
  }
  DS_THROW("AxisGrid: rank {} is in no group", rank);
}

std::string AxisGrid::order_string() const {
  std::string s;
  for (Axis a : order_) s += (s.empty() ? "" : "-") + std::string(axis_name(a));
  return s;
}

}  // namespace ds
