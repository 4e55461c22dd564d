// The initial weights of any model shard, computed where they live (sharded
// initialization, DeepSpeed's zero.Init idea for TP and PP): element i of a
// full weight is a function of (seed, the weight's name, i) only, so a rank
// fills exactly its own slices (TP), its own stage (PP) or any sub-range
// with the values the single-process model has, bit for bit, without
// building the full model.
//   Normal:       std * N(0, 1)
//   ScaledNormal: std / sqrt(2 L) * N(0, 1)   (output projections, GPT-2's rule)
//   Zeros / Ones: biases, norm weights
#pragma once
#include <cstdint>

#include "lib/model/layout.h"
#include "lib/model/model_config.h"

namespace ds {

// Fills out[begin, end) of layout `local`'s flat buffer (host f32; out points
// at element `begin`) for the full model of `cfg`. local may be any shard
// (build_layout(cfg, shard)); [begin, end) defaults to the whole buffer.
void init_params(const ModelConfig& cfg, const ModelLayout& local, uint64_t seed, float std, float* out,
                 int64_t begin = 0, int64_t end = -1);

}  // namespace ds
