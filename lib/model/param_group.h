// Parameter groups: the unit of ownership of a model's parameters. Every
// parameter belongs to one group (ParamSpec::group, an index into
// ModelLayout::groups); a group says along which parallel axes its tensors are
// split, over which axes its gradients are summed (and ZeRO partitions its
// state: the same ranks), and which of its tensors take weight decay.
//
// Today a GPT model has one group, "dense": every weight, split over tensor
// and pipeline ranks, reduced over the sequence-data-parallel ranks (Ulysses x
// DP). Mixture-of-Experts adds an "experts" group split over the expert-
// parallel ranks and reduced over the expert-data-parallel ones; a group's
// flat layout, ZeRO partition, optimizer and storage tier hang off the group
// (docs/ops.md, "A new parameter group").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/tensor.h"

namespace ds {

// The parallel axes of a job (ParallelLayout's sizes).
enum class ParallelAxis : uint8_t { Tensor, Pipeline, Data, Ulysses };
const char* parallel_axis_name(ParallelAxis a);

// Which tensors of a group take weight decay.
//   Megatron: all but biases and 1-D tensors (norm weights); Megatron-LM's
//             and Megatron-DeepSpeed's no_weight_decay rule, and dstrain's.
//   All / None: every tensor / none.
enum class DecayRule : uint8_t { Megatron, All, None };

struct ParamGroupSpec {
  std::string name;                   // "dense"
  std::vector<ParallelAxis> split;    // axes its tensors are split along
  std::vector<ParallelAxis> reduce;   // axes its gradients are summed over; ZeRO shards over them
  DecayRule decay = DecayRule::Megatron;

  // Does a tensor of this group named `name` with `shape` take weight decay?
  bool decays(const std::string& name, const Shape& shape) const;
  bool reduces_over(ParallelAxis a) const;
};

// The group every GPT weight belongs to, experts aside.
ParamGroupSpec dense_param_group();
// The experts of MoE layers. With expert parallelism (not yet) they split
// over the expert-parallel ranks and reduce over the expert-data-parallel
// ones; today every rank holds every expert, so they reduce over the same
// ranks as the dense group, and are replicated over tensor-parallel ranks.
ParamGroupSpec expert_param_group();

}  // namespace ds
