// Parameter groups: the unit of ownership of a model's parameters. Every
// parameter belongs to one group (ParamSpec::group, an index into
// ModelLayout::groups); a group says along which parallel axes its tensors are
// split, over which axes its gradients are summed (and ZeRO partitions its
// state: the same ranks), and which of its tensors take weight decay.
//
// A GPT model has the group "dense": every weight but the experts, split over
// tensor and pipeline ranks, reduced over the sequence-data-parallel ranks
// (Ulysses x DP). Mixture-of-Experts adds the "experts" group: split over the
// pipeline and the expert-parallel ranks, reduced over the expert-data-
// parallel ones. A group's flat layout, ZeRO partition, optimizer and storage
// tier hang off the group (docs/ops.md, "A new parameter group").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/tensor.h"

namespace ds {

// The parallel axes of a job (ParallelLayout's sizes).
// Expert: the expert-parallel ranks (EP consecutive data-parallel ranks);
// ExpertData: the data-parallel ranks holding the same experts (DP / EP of
// them; with EP = 1 the data-parallel ranks themselves).
enum class ParallelAxis : uint8_t { Tensor, Pipeline, Data, Ulysses, Expert, ExpertData };
const char* parallel_axis_name(ParallelAxis a);

// Which tensors of a group take weight decay.
//   Megatron: all but biases and 1-D tensors (norm weights); Megatron-LM's
//             and Megatron-DeepSpeed's no_weight_decay rule, and dstrain's.
//   MegatronBlockNorms: Megatron's, but the blocks' norm weights
//             (layers.N.norm1/norm2.weight) decay too: DeepSpeed-Chat's
//             no-decay names miss GPT-2's ln_1 / ln_2 (ModelConfig::
//             decay_block_norms).
//   All / None: every tensor / none.
enum class DecayRule : uint8_t { Megatron, All, None, MegatronBlockNorms };

struct ParamGroupSpec {
  std::string name;                   // "dense"
  std::vector<ParallelAxis> split;    // axes its tensors are split along
  std::vector<ParallelAxis> reduce;   // axes its gradients are summed over; ZeRO shards over them
  DecayRule decay = DecayRule::Megatron;

  // Does a tensor of this group named `name` with `shape` take weight decay?
  bool decays(const std::string& name, const Shape& shape) const;
  bool reduces_over(ParallelAxis a) const;
  bool splits_over(ParallelAxis a) const;
};

// The group every GPT weight belongs to, experts aside.
ParamGroupSpec dense_param_group();
// The experts of MoE layers: dim 0 of each stacked expert weight (the
// expert) is split over the expert-parallel ranks, gradients are summed over
// the expert-data-parallel ones; with tensor_split (expert tensor
// parallelism) each expert's matrix is split over the tensor-parallel ranks,
// else replicated over them.
ParamGroupSpec expert_param_group(bool tensor_split = false);

}  // namespace ds
