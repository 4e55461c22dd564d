// Megatron's group construction (initialize_model_parallel, order tp-dp-pp,
// with Megatron-DeepSpeed's Ulysses sequence axis after tp and DeepSpeed's
// expert-parallel split of dp) read off an AxisGrid.
#include "lib/parallel/rank_grid.h"

#include "lib/core/error.h"

namespace ds {

RankGrid make_rank_grid(int world_size, int tp, int pp, int rank, int sp, int ep) {
  DS_USER_CHECK(world_size >= 1 && tp >= 1 && pp >= 1 && sp >= 1 && ep >= 1,
                "parallel sizes must be >= 1: world size {}, tensor-model-parallel-size {}, "
                "pipeline-model-parallel-size {}, ds-sequence-parallel-size {}, moe-expert-parallel-size {}",
                world_size, tp, pp, sp, ep);
  DS_USER_CHECK(world_size % (tp * pp * sp) == 0,
                "world size {} is not divisible by tensor-model-parallel-size {} x "
                "pipeline-model-parallel-size {} x ds-sequence-parallel-size {} = {}", world_size, tp, pp, sp,
                tp * pp * sp);
  const int dp = world_size / (tp * pp * sp);
  DS_USER_CHECK(dp % ep == 0,
                "moe-expert-parallel-size {} does not divide the data-parallel size {} (world size {} / "
                "(tensor-model-parallel-size {} x pipeline-model-parallel-size {} x ds-sequence-parallel-size {}))",
                ep, dp, world_size, tp, pp, sp);
  DS_CHECK(rank >= 0 && rank < world_size, "rank {} outside world size {}", rank, world_size);
  RankGrid g;
  // The DP axis is the expert-data-parallel one (DP / EP); EP sits inside it.
  g.axes = AxisGrid({Axis::TP, Axis::SP, Axis::EP, Axis::DP, Axis::PP}, {tp, sp, ep, dp / ep, pp});
  const AxisGrid& a = g.axes;
  g.world = world_size;
  g.tp = tp;
  g.pp = pp;
  g.dp = dp;
  g.sp = sp;
  g.sdp = sp * g.dp;
  g.ep = ep;
  g.edp = sp * (dp / ep);
  g.rank = rank;
  g.sp_rank = a.coord(rank, Axis::SP);
  g.tp_rank = a.coord(rank, Axis::TP);
  g.ep_rank = a.coord(rank, Axis::EP);
  g.dp_rank = g.ep_rank + ep * a.coord(rank, Axis::DP);
  g.edp_rank = g.sp_rank + sp * a.coord(rank, Axis::DP);
  g.pp_rank = a.coord(rank, Axis::PP);
  g.sdp_rank = g.sp_rank + sp * g.dp_rank;
  g.tp_groups = a.groups({Axis::TP});
  g.dp_groups = a.groups({Axis::EP, Axis::DP});
  g.ep_groups = a.groups({Axis::EP});
  g.edp_groups = a.groups({Axis::SP, Axis::DP});
  g.pp_groups = a.groups({Axis::PP});
  g.sp_groups = a.groups({Axis::SP});
  g.sdp_groups = a.groups({Axis::SP, Axis::EP, Axis::DP});
  g.mp_groups = a.groups({Axis::TP, Axis::PP});
  for (const std::vector<int>& grp : g.pp_groups)  // first and last stage of each pipeline
    g.embedding_groups.push_back(pp > 1 ? std::vector<int>{grp.front(), grp.back()}
                                        : std::vector<int>{grp.front()});
  g.tp_index = a.group_index(rank, {Axis::TP});
  g.dp_index = a.group_index(rank, {Axis::EP, Axis::DP});
  g.ep_index = a.group_index(rank, {Axis::EP});
  g.edp_index = a.group_index(rank, {Axis::SP, Axis::DP});
  g.pp_index = a.group_index(rank, {Axis::PP});
  g.mp_index = a.group_index(rank, {Axis::TP, Axis::PP});
  g.sp_index = a.group_index(rank, {Axis::SP});
  g.sdp_index = a.group_index(rank, {Axis::SP, Axis::EP, Axis::DP});
  return g;
}

RankGrid make_rank_grid(const ParallelLayout& l, int rank) {
  return make_rank_grid(l.world, l.tp, l.pp, rank, l.ulysses, l.ep);
}

std::string RankGrid::describe() const {
  return fmt::format("rank {}: tp {}/{} dp {}/{} pp {}/{}{}{}", rank, tp_rank, tp, dp_rank, dp, pp_rank, pp,
                     sp > 1 ? fmt::format(" sp {}/{}", sp_rank, sp) : std::string(),
                     ep > 1 ? fmt::format(" ep {}/{}", ep_rank, ep) : std::string());
}

}  // namespace ds
