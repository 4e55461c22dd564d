// ParallelLayout: the one value that says how a job of `world` processes is
// split, derived once from the configured sizes and the world size:
//   world = TP x Ulysses x DP x PP,
// with DP split again into EP x EDP for the experts of MoE layers (DeepSpeed:
// expert-parallel groups of EP consecutive data-parallel ranks),
// Megatron's sequence parallelism (inside TP), virtual pipeline stages, the
// sequence-data-parallel group (Ulysses x DP: where gradients are reduced and
// ZeRO partitions) and the positions each rank holds (T / Ulysses).
// The config checks, the rank grid, the memory estimate, dsgen, dsconvert and
// the checkpoint code read their sizes from it instead of dividing the world
// themselves. Pure: no communication, no config parsing (lib/train fills the
// request from its config).
#pragma once
#include <cstdint>
#include <string>

#include "lib/parallel/shard_coords.h"

namespace ds {

// The sizes a job asks for (the config's parallel section).
struct ParallelRequest {
  int tp = 1, pp = 1;
  int ulysses = 1;                    // ds_sequence_parallel_size (DeepSpeed-Ulysses)
  bool sequence_parallel = false;     // Megatron's --sequence-parallel (dropped when tp == 1)
  int layers_per_virtual_stage = 0;   // 0: no virtual pipeline stages
  int ep = 1;                         // model.moe.expert_parallel_size (1 for a dense model)
};

struct ParallelLayout {
  int world = 1;
  int tp = 1, pp = 1, ulysses = 1, dp = 1;
  bool sequence_parallel = false;  // Megatron SP: activations outside TP regions split over the tp ranks
  int vp = 1;                      // model chunks (virtual stages) per pipeline rank
  int layers_per_virtual_stage = 0;
  int64_t seq_length = 0;          // the model's T
  // Expert parallelism: each MoE layer's experts split over ep data-parallel
  // ranks; divides dp.
  int ep = 1;

  // The sequence-data-parallel size: ranks holding the same weights (they
  // reduce gradients and share ZeRO partitions). dp when ulysses == 1.
  int sdp() const { return ulysses * dp; }
  // Expert-data-parallel size: ranks holding the same experts (sdp when ep ==
  // 1; with Ulysses every sequence rank of them too, lib/parallel/rank_grid.h).
  int edp() const { return sdp() / ep; }
  // Ranks of one model replica (tp x ulysses x pp).
  int replica() const { return tp * ulysses * pp; }
  // Positions of every sample a rank holds between Ulysses all-to-alls.
  int64_t local_seq() const { return seq_length / ulysses; }
  // Positions of one tensor-parallel rank's activations outside TP regions
  // (local_seq split again over TP with sequence parallelism).
  int64_t local_seq_sp() const { return sequence_parallel ? local_seq() / tp : local_seq(); }
  // The model shard a rank at (tp_rank, pp_rank) holds (ep_rank 0).
  ShardCoords shard(int tp_rank = 0, int pp_rank = 0) const { return {tp, tp_rank, pp, pp_rank, vp, ep, 0}; }
  // "TP=2 PP=1 DP=1" plus " Ulysses=2" / " SP" / " VP=2" / " EP=2" where they apply.
  std::string describe() const;
  // The request this layout answers (to derive the same layout for another world).
  ParallelRequest request() const {
    return {tp, pp, ulysses, sequence_parallel, layers_per_virtual_stage, ep};
  }
  bool operator==(const ParallelLayout&) const = default;
};

// Derives the layout. UserError naming the sizes (config key and flag) when a
// size is < 1 or too large, or world is not divisible by TP x PP x Ulysses;
// and, with num_layers > 0, when the layers do not split into the pipeline
// (virtual) stages, or with seq_length > 0, when T does not split over the
// Ulysses ranks; and when EP < 1 or does not divide DP. Megatron's sequence
// parallelism is dropped when TP is 1.
ParallelLayout make_parallel_layout(const ParallelRequest& r, int world, int num_layers = 0, int64_t seq_length = 0);

}  // namespace ds
