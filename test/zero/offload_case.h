// One comparison shared by the CPU and CUDA offload tests: a layout of a few
// parameters (with and without weight decay, odd sizes), a rank's range inside
// it, seeded weights and 3 steps of gradients; AdamW applied by the blocking
// path (gradients to the host, AdamW::step on the whole range, weights back)
// and by OffloadPipeline with the copier of `dev`, compared bit for bit; and
// the host bytes the pipeline allocated against what the memory report says.
// compare_nvme_offload_step: the same with the Adam state in an NVMe tier
// under `dir` (OffloadPipeline::step_tier) against AdamW in memory.
#pragma once
#include <cstdint>
#include <string>

#include "lib/core/dtype.h"
#include "lib/runtime/offload_pipeline.h"

namespace ds {

struct OffloadCompare {
  bool params_equal = false, moments_equal = false, changed = false;
  // Host bytes the pipeline allocated, and OffloadPipeline::host_bytes_for (what is reported).
  int64_t host_bytes = 0, host_bytes_reported = 0;
};

// dev CPU with `deferred`: a copier that runs each copy only when its ticket
// (or a later one of the same direction) is waited for, or at finish, the two
// directions independent of each other, as two CUDA streams may: a missing
// wait reads a buffer before its copy landed or lets a copy read a buffer
// already refilled, and the bits differ.
// host_params: the parameters are the host master (offload_param cpu).
OffloadCompare compare_offload_step(Device dev, int64_t bucket, bool pinned, bool deferred = false,
                                    bool host_params = false);

struct NvmeOffloadCase {
  int64_t sub_group = 1000000000;
  int buffer_count = 4;
  bool pipelined = false;  // pipeline_read and pipeline_write
  bool pinned = false;
  bool deferred = false;  // as for compare_offload_step
  OffloadPipeline::ParamsAt params = OffloadPipeline::ParamsAt::Device;
};
OffloadCompare compare_nvme_offload_step(Device dev, const std::string& dir, const NvmeOffloadCase& c);

}  // namespace ds
