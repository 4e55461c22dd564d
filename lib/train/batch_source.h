// Where the trainer's micro-batches come from: Megatron's indexed datasets
// (DataPipeline, lib/train/data_pipeline.h) or another source that a front
// end hands the trainer (dschat's fine-tuning examples, lib/chat/sft.h).
#pragma once
#include <cstdint>
#include <memory>

#include "lib/core/tensor.h"
#include "lib/runtime/micro_batch.h"

namespace ds {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Micro-batch `micro` (0..grad_accum-1) of the global batch that starts at
  // training sample `consumed`, for data-parallel rank `dp_rank` of `dp`, in
  // host memory: (B, T) tokens and targets (a target < 0 is ignored). seqlen
  // (1..T; 0 = all): keep the first seqlen positions of every sample.
  virtual MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen = 0) = 0;
  // The sequence length a data curriculum gives micro-batch `micro` of the
  // global batch at `consumed` (1..T), or 0 when the data set none.
  virtual int64_t curriculum_seqlen(int64_t consumed, int micro, int dp) {
    (void)consumed, (void)micro, (void)dp;
    return 0;
  }
  // Validation micro-batch starting at validation sample first_sample.
  virtual MicroBatch valid_batch(int64_t first_sample, int dp_rank, int dp) = 0;
  virtual bool has_valid() const = 0;
  // Training samples per epoch (for the start-up log).
  virtual int64_t train_samples_per_epoch() const = 0;

  // A host micro-batch on the model's device; on a GPU through pinned
  // staging, without blocking the host.
  MicroBatch to_device(MicroBatch mb) const;

 protected:
  explicit BatchSource(Device dev) : dev_(dev) {}
  Device dev_;

 private:
  Tensor upload(const Tensor& host) const;  // host (B, L) -> the device, without blocking the host
};

// A source for runs that train no step (a conversion, an export of 0
// iterations): asking it for a batch is an internal error.
std::unique_ptr<BatchSource> no_training_data(Device dev);

}  // namespace ds
