// One micro-batch of token ids and next-token targets, as the data pipeline
// hands it to the model or the pipeline executor.
#pragma once
#include "lib/core/tensor.h"

namespace ds {

struct MicroBatch {
  Tensor tokens;   // (B, T) i32 on the model device
  Tensor targets;  // (B, T) i32 on the model device
  int64_t first_sample = 0;  // global index of row 0's sample (keys the dropout masks)
  // (B, T) i32 host copy of `targets` (the loss's mask and range check read it
  // without a device-to-host copy); undefined where a caller has none.
  Tensor targets_host;
};

}  // namespace ds
