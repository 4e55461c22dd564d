// Megatron's group construction (initialize_model_parallel, order tp-dp-pp)
// written as plain loops over the rank formula in rank_grid.h.
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
  g.world = world_size;
  g.tp = tp;
  g.pp = pp;
  g.dp = world_size / (tp * pp);
  g.rank = rank;
  g.tp_rank = rank % tp;
  g.dp_rank = (rank / tp) % g.dp;
  g.pp_rank = rank / (tp * g.dp);
  const int per_stage = tp * g.dp;  // ranks in one pipeline stage

  for (int i = 0; i < world_size / tp; ++i) {
    std::vector<int> grp;
    for (int t = 0; t < tp; ++t) grp.push_back(i * tp + t);
    g.tp_groups.push_back(grp);
  }
  for (int s = 0; s < pp; ++s)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> grp;
      for (int r = s * per_stage + t; r < (s + 1) * per_stage; r += tp) grp.push_back(r);
      g.dp_groups.push_back(grp);
    }
  for (int i = 0; i < per_stage; ++i) {
    std::vector<int> grp;
    for (int r = i; r < world_size; r += per_stage) grp.push_back(r);
    g.pp_groups.push_back(grp);
    g.embedding_groups.push_back(pp > 1 ? std::vector<int>{grp.front(), grp.back()}
                                        : std::vector<int>{grp.front()});
  }
  for (int d = 0; d < g.dp; ++d) {
    std::vector<int> grp;
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < tp; ++t) grp.push_back(g.rank_of(t, d, s));
    g.mp_groups.push_back(grp);
  }
  g.tp_index = rank / tp;
  g.dp_index = g.pp_rank * tp + g.tp_rank;
  g.pp_index = rank % per_stage;
  g.mp_index = g.dp_rank;
  return g;
}

std::string RankGrid::describe() const {
  return fmt::format("rank {}: tp {}/{} dp {}/{} pp {}/{}", rank, tp_rank, tp, dp_rank, dp,
                     pp_rank, pp);
}

}  // namespace ds
