// Mapping between the FULL weights (the tp = 1 layout, single-process names
// and order) and one tensor-parallel rank's LOCAL shards (build_layout with
// tp > 1): slicing a full buffer for a rank (dsgen, the teacher, tests),
// placing the ranks' slices of one weight into the full weight (the
// streamed gather of checkpoints and exports), and the duplicated ranges the
// gradient norm skips.
// f32 buffers on any device (device ones are staged through host memory).
#pragma once
#include <vector>

#include "lib/model/layout.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// local_out (local.total) <- this rank's slices of full_buf (full.total).
void slice_tp_params(const ModelLayout& local, const ModelLayout& full, const Tensor& full_buf,
                     const Tensor& local_out);
// Places every tp rank's slice of weight p into the full weight `full`
// (host f32): rank r's slice (p.numel elements, local layout order) starts
// at all + r * stride.
void place_tp_slices(const ParamSpec& p, int tp, const float* all, int64_t stride, float* full);
// Flat ranges of this rank's weights that a lower tp rank holds too (every
// replicated weight on ranks > 0; a replicated kv part on all but the first
// rank of those sharing it): the gradient norm counts each weight once.
std::vector<Range> duplicate_ranges(const ModelLayout& local);

}  // namespace ds
