// ShardCoords: which shard of the model a rank, a parameter layout or a
// checkpoint file is, as one value: its place along the model-parallel axes
// (tensor, pipeline, virtual pipeline, expert). Derived from the rank grid
// (RankGrid::shard_coords) and passed down instead of five loose integers, so
// a new model-parallel axis is one more field here. Header-only, no deps.
#pragma once

namespace ds {

struct ShardCoords {
  int tp = 1, tp_rank = 0;  // tensor-parallel size and this shard's rank
  int pp = 1, pp_rank = 0;  // pipeline stages and this stage
  int vp = 1;               // model chunks (virtual stages) per pipeline rank
  // Expert parallelism: the experts of each MoE layer are split over ep
  // ranks (ep_rank holds the ep_rank-th block of E / ep of them); the dense
  // weights do not depend on it.
  int ep = 1, ep_rank = 0;

  // The same sizes at another (tp_rank, pp_rank).
  ShardCoords at(int tp_r, int pp_r) const {
    ShardCoords c = *this;
    c.tp_rank = tp_r;
    c.pp_rank = pp_r;
    return c;
  }
  // The same sizes at expert-parallel rank ep_r.
  ShardCoords at_ep(int ep_r) const {
    ShardCoords c = *this;
    c.ep_rank = ep_r;
    return c;
  }
  // This pipeline stage with the tensor- and expert-parallel shards gathered
  // (tp = 1, ep = 1).
  ShardCoords tp_gathered() const {
    ShardCoords c = *this;
    c.tp = 1;
    c.tp_rank = 0;
    c.ep = 1;
    c.ep_rank = 0;
    return c;
  }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  bool operator==(const ShardCoords&) const = default;
};

}  // namespace ds
