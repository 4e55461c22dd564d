// One micro-batch of token ids and next-token targets, as the data pipeline
// hands it to the model or the pipeline executor.
#pragma once
#include "lib/core/tensor.h"

namespace ds {

struct MicroBatch {
  Tensor tokens;   // (B, T) i32 on the model device
  Tensor targets;  // (B, T) i32 on the model device
  int64_t first_sample = 0;  // global index of row 0's sample (keys the dropout masks)
};

}  // namespace ds
