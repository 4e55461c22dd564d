// A parameter group's own coordinate space. Where the groups of a layout are
// partitioned over different ranks (Mixture of Experts with expert
// parallelism: the dense weights over every data-parallel rank, the experts
// over the expert-data-parallel ones), each group's ZeRO partition is cut
// from its *group space*: the group's tensors packed in flat order, so that
// position g of the space is one element of the flat buffer and a range of
// the space is a list of flat pieces. The identity space ([0, total) as one
// range) is the one-group case, in which every group-space range is itself.
// Pure arithmetic, no communication; docs/zero.md.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/parallel/zero_partition.h"

namespace ds {

class GroupSpace {
 public:
  GroupSpace() = default;
  // `ranges`: flat ranges, sorted, disjoint, none empty (adjacent ones are merged).
  explicit GroupSpace(std::vector<Range> ranges);
  static GroupSpace identity(int64_t total);

  int64_t total() const { return total_; }
  const std::vector<Range>& ranges() const { return ranges_; }

  // A flat piece of a group-space range: flat elements [flat.begin,
  // flat.end) are group-space elements [at, at + flat.size()).
  struct Piece {
    Range flat;
    int64_t at = 0;
    bool operator==(const Piece&) const = default;
  };
  // The flat pieces of group-space range g (clipped to [0, total)), in order.
  std::vector<Piece> pieces(Range g) const;
  // The group-space ranges of flat range f's elements that belong to the
  // group, as pieces (flat part, group offset), in order.
  std::vector<Piece> within(Range f) const;
  // The group-space position of flat element x; -1 if the group lacks it.
  int64_t position(int64_t flat) const;

 private:
  std::vector<Range> ranges_;
  std::vector<int64_t> starts_;  // group-space offset of each range
  int64_t total_ = 0;
};

// Sorted, disjoint ranges with adjacent ones merged and empty ones dropped
// (tensor extents -> the ranges of a GroupSpace).
std::vector<Range> merge_adjacent(std::vector<Range> ranges);

}  // namespace ds
