// Builds a rank's group communicators from the rank grid by splitting the world.
#include "lib/parallel/comms.h"

#include "lib/core/error.h"

namespace ds {

Comms build_comms(Communicator& world, const RankGrid& grid) {
  DS_CHECK(world.size() == grid.world && world.rank() == grid.rank,
           "rank grid is for rank {} of {}, but the world communicator is rank {} of {}",
           grid.rank, grid.world, world.rank(), world.size());
  Comms c;
  c.grid = grid;
  c.world = &world;
  auto make = [&](const std::vector<int>& ranks, const std::string& kind, int index) {
    c.owned.push_back(world.split(ranks, kind + "/" + std::to_string(index)));
    return c.owned.back().get();
  };
  c.tp = make(grid.my_tp_group(), "tp", grid.tp_index);
  c.dp = make(grid.my_dp_group(), "dp", grid.dp_index);
  c.pp = make(grid.my_pp_group(), "pp", grid.pp_index);
  // Off the first and last stage (and with PP = 1, where both are this rank's
  // one stage) the group is this rank alone: nothing to synchronise.
  c.embedding = grid.pp > 1 && grid.in_embedding_group()
                    ? make(grid.embedding_groups[grid.pp_index], "embedding", grid.pp_index)
                    : make({grid.rank}, "embedding-self", grid.rank);
  if (grid.sp > 1) {
    c.sp = make(grid.my_sp_group(), "sp", grid.sp_index);
    c.sdp = make(grid.my_sdp_group(), "sdp", grid.sdp_index);
  } else {
    c.sp = make({grid.rank}, "sp-self", grid.rank);
    c.sdp = c.dp;
  }
  c.pp_grad = grid.pp > 1 ? make(grid.my_pp_group(), "pp-grad", grid.pp_index) : c.pp;
  // Last, so that the groups above keep their order and tags without EP.
  if (grid.ep > 1) {
    c.ep = make(grid.my_ep_group(), "ep", grid.ep_index);
    c.edp = make(grid.my_edp_group(), "edp", grid.edp_index);
  } else {
    c.ep = make({grid.rank}, "ep-self", grid.rank);
    c.edp = c.dp;
  }
  return c;
}

}  // namespace ds
