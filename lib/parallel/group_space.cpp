// Group spaces: a group's tensors packed in flat order (group_space.h).
#include "lib/parallel/group_space.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

std::vector<Range> merge_adjacent(std::vector<Range> ranges) {
  std::vector<Range> out;
  for (const Range& r : ranges) {
    DS_CHECK(r.begin <= r.end, "group space: range [{}, {}) is reversed", r.begin, r.end);
    if (r.size() == 0) continue;
    DS_CHECK(out.empty() || out.back().end <= r.begin, "group space: ranges overlap or are not sorted at {}",
             r.begin);
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  }
  return out;
}

GroupSpace::GroupSpace(std::vector<Range> ranges) : ranges_(merge_adjacent(std::move(ranges))) {
  for (const Range& r : ranges_) {
    DS_CHECK(r.begin >= 0, "group space: negative offset {}", r.begin);
    starts_.push_back(total_);
    total_ += r.size();
  }
}

GroupSpace GroupSpace::identity(int64_t total) {
  return GroupSpace(total > 0 ? std::vector<Range>{{0, total}} : std::vector<Range>{});
}

std::vector<GroupSpace::Piece> GroupSpace::pieces(Range g) const {
  std::vector<Piece> out;
  const int64_t lo = std::max<int64_t>(g.begin, 0), hi = std::min(g.end, total_);
  if (lo >= hi) return out;
  // The first range whose group-space end lies past lo.
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), lo) - starts_.begin()) - 1;
  for (; i < ranges_.size() && starts_[i] < hi; ++i) {
    const int64_t b = std::max(lo, starts_[i]), e = std::min(hi, starts_[i] + ranges_[i].size());
    if (b >= e) continue;
    out.push_back({{ranges_[i].begin + (b - starts_[i]), ranges_[i].begin + (e - starts_[i])}, b});
  }
  return out;
}

std::vector<GroupSpace::Piece> GroupSpace::within(Range f) const {
  std::vector<Piece> out;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), f.begin,
                             [](int64_t x, const Range& r) { return x < r.end; });
  for (size_t i = static_cast<size_t>(it - ranges_.begin()); i < ranges_.size() && ranges_[i].begin < f.end; ++i) {
    const int64_t b = std::max(f.begin, ranges_[i].begin), e = std::min(f.end, ranges_[i].end);
    if (b < e) out.push_back({{b, e}, starts_[i] + (b - ranges_[i].begin)});
  }
  return out;
}

int64_t GroupSpace::position(int64_t flat) const {
  const std::vector<Piece> p = within({flat, flat + 1});
  return p.empty() ? -1 : p[0].at;
}

}  // namespace ds
