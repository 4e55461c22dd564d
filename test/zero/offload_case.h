// One comparison shared by the CPU and CUDA offload tests: a layout of a few
// parameters (with and without weight decay, odd sizes), a rank's range inside
// it, seeded weights and 3 steps of gradients; AdamW applied by the blocking
// path (gradients to the host, AdamW::step on the whole range, weights back)
// and by OffloadPipeline with the copier of `dev`, compared bit for bit; and
// the host bytes the pipeline allocated against what the memory report says.
#pragma once
#include <cstdint>

#include "lib/core/dtype.h"

namespace ds {

struct OffloadCompare {
  bool params_equal = false, moments_equal = false, changed = false;
  // Host bytes the pipeline allocated, and OffloadPipeline::host_bytes_for (what is reported).
  int64_t host_bytes = 0, host_bytes_reported = 0;
};

OffloadCompare compare_offload_step(Device dev, int64_t bucket, bool pinned);

}  // namespace ds
