// Comms: the communicators of one rank (world, tp, dp, pp, embedding),
// built once from the RankGrid and passed down; there are no global ones.
// Every group is valid; an axis of size 1 gives a group of this rank alone.
#pragma once
#include <memory>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/parallel/rank_grid.h"

namespace ds {

struct Comms {
  RankGrid grid;
  Communicator* world = nullptr;  // not owned: outlives this Comms
  Communicator* tp = nullptr;     // grid.my_tp_group()
  Communicator* dp = nullptr;     // grid.my_dp_group()
  Communicator* pp = nullptr;     // grid.my_pp_group(), group rank = stage
  // DeepSpeed-Ulysses: the sequence-parallel group (attention all-to-alls) and
  // the sequence-data-parallel group (SP x DP: gradient reduction, ZeRO).
  // With SP = 1, sp is this rank alone and sdp is the dp communicator.
  Communicator* sp = nullptr;     // grid.my_sp_group()
  Communicator* sdp = nullptr;    // grid.my_sdp_group()
  // This pipeline's first+last stage (tied embeddings) when PP > 1 and this
  // rank is on one of them; otherwise a group of this rank alone.
  Communicator* embedding = nullptr;
  // PP > 1: a second communicator over this pipeline's ranks, so that the
  // pipeline's gradient messages queue apart from its activations when
  // overlapping (PipelineExecutor); with PP = 1 it is `pp`.
  Communicator* pp_grad = nullptr;
  // Expert parallelism (DeepSpeed's MoE groups): ep holds the ranks that split
  // each MoE layer's experts (token all-to-alls), edp the ranks holding the
  // same experts (their gradient reduction). With EP = 1, ep is this rank
  // alone and edp is the dp communicator.
  Communicator* ep = nullptr;     // grid.my_ep_group()
  Communicator* edp = nullptr;    // grid.my_edp_group()
  std::vector<std::unique_ptr<Communicator>> owned;  // keeps the groups alive
};

// Every rank calls it once (collective over the world). Each rank creates only
// its own groups, in the fixed order tp, dp, pp, embedding, then (SP > 1)
// sp and sdp, then (PP > 1) pp-grad, then (EP > 1) ep and edp; group tags are
// "tp/<index>" etc. Checks that world's rank and size match the grid.
Comms build_comms(Communicator& world, const RankGrid& grid);

}  // namespace ds
