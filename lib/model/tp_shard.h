// Mapping between the FULL weights (the tp = 1 layout, single-process names
// and order) and one tensor-parallel rank's LOCAL shards (build_layout with
// tp > 1). Used to initialise (slice the full init), to load full checkpoints
// and HF weights, and to gather the full model for checkpoints and export.
// f32 buffers on any device (device ones are staged through host memory).
#pragma once
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/layout.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// local_out (local.total) <- this rank's slices of full_buf (full.total).
void slice_tp_params(const ModelLayout& local, const ModelLayout& full, const Tensor& full_buf,
                     const Tensor& local_out);
// Collective over tp (every member calls, unit by unit): full_out (full.total)
// <- all ranks' local_buf (local.total). full_out may be undefined on ranks
// that do not need the result. tp may be null when local.tp == 1.
// Places every tp rank's slice of weight p into the full weight `full`
// (host f32): rank r's slice (p.numel elements, local layout order) starts
// at all + r * stride.
void place_tp_slices(const ParamSpec& p, int tp, const float* all, int64_t stride, float* full);
void gather_tp_params(Communicator* tp, const ModelLayout& local, const ModelLayout& full, int num_layers,
                      const Tensor& local_buf, const Tensor& full_out);
// Flat ranges of this rank's weights that a lower tp rank holds too (every
// replicated weight on ranks > 0; a replicated kv part on all but the first
// rank of those sharing it): the gradient norm counts each weight once.
std::vector<Range> duplicate_ranges(const ModelLayout& local);

}  // namespace ds
