// AxisGrid: ranks laid out on an ordered list of parallel axes, innermost
// first, as in Megatron-Core's order string "tp-cp-ep-dp-pp": the rank is the
// mixed-radix number whose digits are the coordinates along the axes,
//   rank = c0 + S0 * (c1 + S1 * (c2 + ...)).
// A group "over" some axes holds the ranks that agree on every other axis.
// Pure functions of (order, sizes): every rank derives the same lists, and a
// new axis (context or expert parallelism) is one more entry in the order.
// SP is DeepSpeed-Ulysses sequence parallelism (its own axis; Megatron's
// --sequence-parallel is not an axis: it reuses the tp group).
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

enum class Axis { TP, SP, CP, EP, DP, PP };

const char* axis_name(Axis a);  // "tp", "sp", "cp", "ep", "dp", "pp"
// "tp-dp-pp" -> {TP, DP, PP}. Throws UserError naming the string for an
// unknown or repeated axis.
std::vector<Axis> parse_axis_order(std::string_view order);

class AxisGrid {
 public:
  AxisGrid() = default;
  // sizes[i] is the size of order[i]; all >= 1. world() = their product.
  AxisGrid(std::vector<Axis> order, std::vector<int> sizes);

  int world() const { return world_; }
  const std::vector<Axis>& order() const { return order_; }
  int size(Axis a) const;               // 1 for an axis not in the order
  int coord(int rank, Axis a) const;    // 0 for an axis not in the order
  std::vector<int> coords(int rank) const;  // one per order entry
  int rank_of(const std::vector<int>& coords) const;

  // All groups whose members differ only along `over`: each group ascending
  // (inner axes vary fastest), the list sorted by first member.
  std::vector<std::vector<int>> groups(std::initializer_list<Axis> over) const;
  // Position of `rank`'s group in groups(over), and the group itself.
  int group_index(int rank, std::initializer_list<Axis> over) const;
  std::vector<int> group_of(int rank, std::initializer_list<Axis> over) const;
  std::string order_string() const;     // "tp-dp-pp"

 private:
  bool in(Axis a, std::initializer_list<Axis> over) const;
  int group_key(int rank, std::initializer_list<Axis> over) const;
  std::vector<Axis> order_;
  std::vector<int> sizes_;
  int world_ = 1;
};

}  // namespace ds
