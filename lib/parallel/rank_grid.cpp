// Megatron's group construction (initialize_model_parallel, order tp-dp-pp,
// with Megatron-DeepSpeed's Ulysses sequence axis after tp) read off an AxisGrid.
#include "lib/parallel/rank_grid.h"

#include "lib/core/error.h"

namespace ds {

RankGrid make_rank_grid(int world_size, int tp, int pp, int rank, int sp) {
  DS_USER_CHECK(world_size >= 1 && tp >= 1 && pp >= 1 && sp >= 1,
                "parallel sizes must be >= 1: world size {}, tensor-model-parallel-size {}, "
                "pipeline-model-parallel-size {}, ds-sequence-parallel-size {}", world_size, tp, pp, sp);
  DS_USER_CHECK(world_size % (tp * pp * sp) == 0,
                "world size {} is not divisible by tensor-model-parallel-size {} x "
                "pipeline-model-parallel-size {} x ds-sequence-parallel-size {} = {}", world_size, tp, pp, sp,
                tp * pp * sp);
  DS_CHECK(rank >= 0 && rank < world_size, "rank {} outside world size {}", rank, world_size);
  RankGrid g;
  g.axes = AxisGrid({Axis::TP, Axis::SP, Axis::DP, Axis::PP}, {tp, sp, world_size / (tp * pp * sp), pp});
  const AxisGrid& a = g.axes;
  g.world = world_size;
  g.tp = tp;
  g.pp = pp;
  g.dp = a.size(Axis::DP);
  g.sp = sp;
  g.sdp = sp * g.dp;
  g.rank = rank;
  g.sp_rank = a.coord(rank, Axis::SP);
  g.tp_rank = a.coord(rank, Axis::TP);
  g.dp_rank = a.coord(rank, Axis::DP);
  g.pp_rank = a.coord(rank, Axis::PP);
  g.sdp_rank = g.sp_rank + sp * g.dp_rank;
  g.tp_groups = a.groups({Axis::TP});
  g.dp_groups = a.groups({Axis::DP});
  g.pp_groups = a.groups({Axis::PP});
  g.sp_groups = a.groups({Axis::SP});
  g.sdp_groups = a.groups({Axis::SP, Axis::DP});
  g.mp_groups = a.groups({Axis::TP, Axis::PP});
  for (const std::vector<int>& grp : g.pp_groups)  // first and last stage of each pipeline
    g.embedding_groups.push_back(pp > 1 ? std::vector<int>{grp.front(), grp.back()}
                                        : std::vector<int>{grp.front()});
  g.tp_index = a.group_index(rank, {Axis::TP});
  g.dp_index = a.group_index(rank, {Axis::DP});
  g.pp_index = a.group_index(rank, {Axis::PP});
  g.mp_index = a.group_index(rank, {Axis::TP, Axis::PP});
  g.sp_index = a.group_index(rank, {Axis::SP});
  g.sdp_index = a.group_index(rank, {Axis::SP, Axis::DP});
  return g;
}

RankGrid make_rank_grid(const ParallelLayout& l, int rank) {
  return make_rank_grid(l.world, l.tp, l.pp, rank, l.ulysses);
}

std::string RankGrid::describe() const {
  return fmt::format("rank {}: tp {}/{} dp {}/{} pp {}/{}{}", rank, tp_rank, tp, dp_rank, dp, pp_rank, pp,
                     sp > 1 ? fmt::format(" sp {}/{}", sp_rank, sp) : std::string());
}

}  // namespace ds
