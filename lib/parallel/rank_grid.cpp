// Megatron's group construction (initialize_model_parallel, order tp-dp-pp)
// read off an AxisGrid.
#include "lib/parallel/rank_grid.h"

#include "lib/core/error.h"

namespace ds {

RankGrid make_rank_grid(int world_size, int tp, int pp, int rank) {
  DS_USER_CHECK(world_size >= 1 && tp >= 1 && pp >= 1,
                "parallel sizes must be >= 1: world size {}, tensor-model-parallel-size {}, "
                "pipeline-model-parallel-size {}", world_size, tp, pp);
  DS_USER_CHECK(world_size % (tp * pp) == 0,
                "world size {} is not divisible by tensor-model-parallel-size {} x "
                "pipeline-model-parallel-size {} = {}", world_size, tp, pp, tp * pp);
  DS_CHECK(rank >= 0 && rank < world_size, "rank {} outside world size {}", rank, world_size);
  RankGrid g;
  g.axes = AxisGrid({Axis::TP, Axis::DP, Axis::PP}, {tp, world_size / (tp * pp), pp});
  const AxisGrid& a = g.axes;
  g.world = world_size;
  g.tp = tp;
  g.pp = pp;
  g.dp = a.size(Axis::DP);
  g.rank = rank;
  g.tp_rank = a.coord(rank, Axis::TP);
  g.dp_rank = a.coord(rank, Axis::DP);
  g.pp_rank = a.coord(rank, Axis::PP);
  g.tp_groups = a.groups({Axis::TP});
  g.dp_groups = a.groups({Axis::DP});
  g.pp_groups = a.groups({Axis::PP});
  g.mp_groups = a.groups({Axis::TP, Axis::PP});
  for (const std::vector<int>& grp : g.pp_groups)  // first and last stage of each pipeline
    g.embedding_groups.push_back(pp > 1 ? std::vector<int>{grp.front(), grp.back()}
                                        : std::vector<int>{grp.front()});
  g.tp_index = a.group_index(rank, {Axis::TP});
  g.dp_index = a.group_index(rank, {Axis::DP});
  g.pp_index = a.group_index(rank, {Axis::PP});
  g.mp_index = a.group_index(rank, {Axis::TP, Axis::PP});
  return g;
}

std::string RankGrid::describe() const {
  return fmt::format("rank {}: tp {}/{} dp {}/{} pp {}/{}", rank, tp_rank, tp, dp_rank, dp,
                     pp_rank, pp);
}

}  // namespace ds
