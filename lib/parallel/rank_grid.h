// RankGrid: Megatron-LM's placement of ranks into tensor-, data- and
// pipeline-parallel groups, as a pure function (no communication), so that the
// group lists can be unit tested and every rank derives the same answer.
// Built on AxisGrid (lib/parallel/axis_grid.h) with the order "tp-sp-ep-dp-pp":
// TP is innermost (consecutive ranks, i.e. one node's GPUs share the heaviest
// traffic), then DeepSpeed-Ulysses sequence parallelism (SP: two all-to-alls
// per layer), then data parallelism, PP outermost:
//   rank = tp_rank + TP * (sp_rank + SP * (dp_rank + DP * pp_rank)),
//   DP = world / (TP * SP * PP).
// Data parallelism is two axes, as DeepSpeed builds its MoE groups: expert
// parallelism (EP consecutive data-parallel ranks split each MoE layer's
// experts; all-to-alls of tokens) inside expert-data parallelism (EDP = DP /
// EP: the ranks holding the same experts), so dp_rank = ep_rank + EP * its
// (DP / EP) coordinate and every placement is the same as without EP. The
// AxisGrid's DP axis is that DP / EP one; the dp fields below are the whole
// EP x DP / EP. With DeepSpeed-Ulysses the expert-data-parallel group takes in
// the sequence axis as the sequence-data-parallel one does (every Ulysses rank
// runs its MoE layers on the whole sequence and holds a share of the experts'
// gradients): EDP = SP x DP / EP, edp_rank = sp_rank + SP * (dp_rank / EP),
// and an expert-parallel group is EP ranks of one dp group (same sp_rank).
// With TP = 1 this is Megatron-DeepSpeed's placement (sp groups of
// consecutive ranks, sequence-data groups of SP * DP consecutive ranks).
// The sequence-data-parallel (sdp) group, SP x DP, is where gradients are
// reduced and ZeRO partitions: its members hold the same weights and see
// different tokens. With SP = 1 it is the dp group.
// The named fields below are that grid's answers for the axes we have; a new
// axis is one more entry in the order and its fields here.
#pragma once
#include <string>
#include <vector>

#include "lib/parallel/axis_grid.h"
#include "lib/parallel/parallel_layout.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

struct RankGrid {
  AxisGrid axes;  // the generic layout the fields below are read from
  int world = 1, tp = 1, pp = 1, dp = 1, sp = 1;
  int rank = 0, tp_rank = 0, dp_rank = 0, pp_rank = 0, sp_rank = 0;
  int sdp = 1, sdp_rank = 0;  // SP x DP, and this rank's place in it (sp_rank + SP * dp_rank)
  // DP = EP x (DP / EP): dp_rank = ep_rank + EP * (dp_rank / EP). EDP = SP x
  // DP / EP, edp_rank = sp_rank + SP * (dp_rank / EP). EP = 1: edp is sdp.
  int ep = 1, edp = 1, ep_rank = 0, edp_rank = 0;

  // All groups of the job (every rank computes the same lists), each sorted.
  std::vector<std::vector<int>> tp_groups;   // world/TP groups of TP consecutive ranks
  std::vector<std::vector<int>> dp_groups;   // same tp_rank, sp_rank and pp_rank
  std::vector<std::vector<int>> ep_groups;   // EP consecutive members of a dp group
  std::vector<std::vector<int>> edp_groups;  // same ep_rank in an sdp group (hold the same experts)
  std::vector<std::vector<int>> sp_groups;   // same tp_rank, dp_rank and pp_rank
  std::vector<std::vector<int>> sdp_groups;  // same tp_rank and pp_rank (SP x DP)
  std::vector<std::vector<int>> pp_groups;   // same tp_rank, sp_rank and dp_rank, stage order
  std::vector<std::vector<int>> mp_groups;   // model parallel (TP x PP): same sp_rank and dp_rank
  // First and last stage of each pipeline (tied input/output embeddings);
  // with PP = 1 each is the single stage, as in Megatron.
  std::vector<std::vector<int>> embedding_groups;

  // Index of this rank's group in each list above.
  int tp_index = 0, dp_index = 0, pp_index = 0, mp_index = 0, sp_index = 0, sdp_index = 0;
  int ep_index = 0, edp_index = 0;

  const std::vector<int>& my_tp_group() const { return tp_groups[tp_index]; }
  const std::vector<int>& my_dp_group() const { return dp_groups[dp_index]; }
  const std::vector<int>& my_pp_group() const { return pp_groups[pp_index]; }
  const std::vector<int>& my_mp_group() const { return mp_groups[mp_index]; }
  const std::vector<int>& my_sp_group() const { return sp_groups[sp_index]; }
  const std::vector<int>& my_sdp_group() const { return sdp_groups[sdp_index]; }
  const std::vector<int>& my_ep_group() const { return ep_groups[ep_index]; }
  const std::vector<int>& my_edp_group() const { return edp_groups[edp_index]; }
  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
  // Whether this rank is in its pipeline's embedding group.
  bool in_embedding_group() const { return is_first_stage() || is_last_stage(); }
  int rank_of(int tp_r, int dp_r, int pp_r, int sp_r = 0) const {
    return axes.rank_of({tp_r, sp_r, dp_r % ep, dp_r / ep, pp_r});
  }
  // This rank's model shard; vp = model chunks per pipeline rank.
  ShardCoords shard_coords(int vp = 1) const { return {tp, tp_rank, pp, pp_rank, vp, ep, ep_rank}; }
  // "rank 5: tp 1/2 dp 0/2 pp 2/4" (+ " sp 0/2" with SP > 1, " ep 1/2" with EP > 1)
  std::string describe() const;
};

// Throws ds::UserError naming the numbers when world is not divisible by
// TP * SP * PP, EP does not divide DP or a size is < 1, and ds::Error when
// rank is outside the world.
RankGrid make_rank_grid(int world_size, int tp, int pp, int rank, int sp = 1, int ep = 1);
// The grid of a derived layout (its world, TP, PP, Ulysses and EP sizes).
RankGrid make_rank_grid(const ParallelLayout& layout, int rank);

}  // namespace ds
