// Megatron's batch-size ramp-up (batch_rampup.h).
#include "lib/config/batch_rampup.h"

#include "lib/core/error.h"

namespace ds {

int64_t BatchRampup::batch_at(int64_t consumed, int64_t global_batch) const {
  if (!enabled() || consumed > samples || start >= global_batch) return global_batch;
  // Megatron: steps = int(consumed / (samples / increments)), in floating point.
  const double per_increment =
      static_cast<double>(samples) / static_cast<double>((global_batch - start) / increment);
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  const int64_t b = start + steps * increment;
  return b < global_batch ? b : global_batch;
}

int64_t BatchRampup::iterations(int64_t train_samples, int64_t global_batch) const {
  if (!enabled()) return train_samples / global_batch;
  int64_t iters = 0, consumed = 0;
  while (consumed <= samples) {  // the ramp, then the constant batch
    consumed += batch_at(consumed, global_batch);
    ++iters;
  }
  return iters + (train_samples > consumed ? (train_samples - consumed) / global_batch : 0);
}

void check_batch_rampup(const BatchRampup& r, int64_t global_batch, int64_t micro_times_dp) {
  DS_USER_CHECK(r.start > 0 && r.increment > 0 && r.samples >= 0,
                "training.rampup_batch_size (--rampup-batch-size) [{}, {}, {}]: the start batch and the increment must "
                "be positive and the ramp-up samples >= 0", r.start, r.increment, r.samples);
  DS_USER_CHECK(r.start <= global_batch && (global_batch - r.start) % r.increment == 0,
                "--rampup-batch-size: the global batch {} minus the start batch {} must be a non-negative multiple of "
                "the increment {}", global_batch, r.start, r.increment);
  DS_USER_CHECK(r.start % micro_times_dp == 0 && r.increment % micro_times_dp == 0,
                "--rampup-batch-size: the start batch {} and the increment {} must be multiples of the micro batch x "
                "data-parallel size {}, so that every step's batch is whole micro-batches", r.start, r.increment,
                micro_times_dp);
}

}  // namespace ds
