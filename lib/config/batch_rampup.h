// Megatron's batch-size ramp-up (--rampup-batch-size START INCREMENT SAMPLES,
// megatron/microbatches.py): the global batch starts at START and grows by
// INCREMENT every SAMPLES / ((GLOBAL - START) / INCREMENT) consumed samples
// until it reaches the configured global batch, which it keeps once more than
// SAMPLES samples were consumed. The number of micro-batches of a step
// follows (batch / (micro batch x data-parallel size)). Sample-based training
// only; the iteration count is what that schedule takes to consume the
// training samples, the partial last batch dropped (update_train_iters).
#pragma once
#include <cstdint>

namespace ds {

struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;  // start 0: no ramp-up
  bool enabled() const { return start > 0; }
  // The global batch of the step that begins after `consumed` samples.
  int64_t batch_at(int64_t consumed, int64_t global_batch) const;
  // Steps to train on train_samples samples (Megatron's update_train_iters).
  int64_t iterations(int64_t train_samples, int64_t global_batch) const;
};

// One clear error naming the flag where the ramp cannot run: START,
// INCREMENT > 0, START <= the global batch, the difference a multiple of
// INCREMENT, every batch on the way a multiple of micro batch x DP.
void check_batch_rampup(const BatchRampup& r, int64_t global_batch, int64_t micro_times_dp);

}  // namespace ds
