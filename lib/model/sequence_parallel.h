// Sequence parallelism (Megatron): outside the tensor-parallel regions each
// tp rank holds a shard of the sequence. A micro-batch (B, T, C) is sharded
// along T per sample: rank r holds rows (b, r*T/TP .. (r+1)*T/TP) for every b,
// laid out (B, T/TP, C). The Communicator's all_gather / reduce_scatter work
// on equal contiguous chunks, i.e. in (TP, B, T/TP, C) order, so these
// helpers permute through a scratch buffer of the full size:
//   sp_gather:         (B, T/TP, C) shard -> (B, T, C) full   (all-gather)
//   sp_reduce_scatter: (B, T, C) partial sums -> summed shard (reduce-scatter)
#pragma once
#include <cstdint>

#include "lib/model/tp_comm.h"

namespace ds {

// full, tmp: B*T*C elements; shard: B*T/TP*C elements (all f32, one device).
void sp_gather(const TpComm& tp, int64_t B, const Tensor& shard, const Tensor& full, const Tensor& tmp);
// full is not modified; tmp receives the permuted copy.
void sp_reduce_scatter(const TpComm& tp, int64_t B, const Tensor& full, const Tensor& shard, const Tensor& tmp);
// This rank's (B, T/TP, C) shard of a full (B, T, C) tensor that every tp
// rank holds the same (no communication).
void sp_take_shard(const TpComm& tp, int64_t B, const Tensor& full, const Tensor& shard);
// x: in-place sum over the tp ranks (gradients of replicated weights that
// differ per rank under sequence parallelism).
void sp_all_reduce(const TpComm& tp, const Tensor& x);

}  // namespace ds
