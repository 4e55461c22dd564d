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
  // Multiplies the step's per-token loss weight (loss scale / (B x T x
  // micro-batches x dp)) for this micro-batch: B x T / (its targets >= 0)
  // makes its gradient that of the mean over the tokens it counts
  // (DeepSpeed-Chat's per-batch loss); 1 for pretraining data.
  float loss_weight_scale = 1.f;
  // (B) i32 or undefined: right padding, sample b's attention mask is
  // lengths[b] ones then zeros (GptModel::set_lengths; dschat's batches).
  Tensor lengths;
  // (B) i32 or undefined: with lengths, each sample's position shift
  // (GptModel::set_shifts; dschat ppo's left-padded sequences).
  Tensor shifts;
};

// Micro-batch m of the current step.
using MicroBatchFeed = std::function<MicroBatch(int m)>;

}  // namespace ds
