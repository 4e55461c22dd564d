// The bucketed all-gather of a flat buffer whose ZeRO-owned ranges were
// updated on their owners: after the optimizer step of stages 1 and 2 (the
// compute-dtype weights, or the f32 weights in fp32 training), and to
// assemble full f32 masters from their shards for a checkpoint or an export.
#pragma once
#include <cstdint>

#include "lib/comm/communicator.h"
#include "lib/core/tensor.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// `buf` has p.total elements (any dtype); rank r's owned_real(r) is current
// on rank r. Afterwards every rank holds every range. One all-gather per
// shard chunk (make_shard_chunks(p, bucket_elems)).
void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems);

}  // namespace ds
