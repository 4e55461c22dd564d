// One micro-batch of token ids and next-token targets, as the data pipeline
// hands it to the model's passes (lib/runtime/passes.h).
#pragma once
#include <functional>

#include "lib/core/tensor.h"

namespace ds {

struct MicroBatch {
  Tensor tokens;   // (B, T) i32 on the model device
  Tensor targets;  // (B, T) i32 on the model device
  int64_t first_sample = 0;  // global index of row 0's sample (keys the dropout masks)
  // A captured step's (2) i64 {iteration, first sample} on the device, which
  // the dropout and attention kernels read instead of the host's values
  // (DropoutKey::step; first_sample is then 0). Undefined otherwise.
  Tensor step_key;
};

// Micro-batch m of the current step.
using MicroBatchFeed = std::function<MicroBatch(int m)>;

}  // namespace ds
