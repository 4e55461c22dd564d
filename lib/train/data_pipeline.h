// The trainer's view of the data: opens the indexed datasets, splits each into
// train/valid ranges (--split) or takes separate train/valid/test datasets
// (--train-data-path ...), blends several with Megatron's weights, and hands
// out micro-batches by global sample index with Megatron's data-parallel
// sampler semantics: a micro-step consumes micro_batch * dp consecutive
// samples and DP rank r takes the r-th block.
#pragma once
#include <cstdint>
#include <memory>

#include "lib/config/config.h"
#include "lib/core/tensor.h"
#include "lib/data/blended_dataset.h"
#include "lib/data/gpt_dataset.h"
#include "lib/data/indexed_dataset.h"
#include "lib/runtime/micro_batch.h"
#include "lib/train/batch_source.h"

namespace ds {


class DataPipeline final : public BatchSource {
 public:
  // Throws UserError for a missing/corrupt dataset, a split too small to hold
  // one sample, or tokens outside the vocabulary.
  DataPipeline(const TrainConfig& cfg, Device dev);

  // Micro-batch `micro` (0..grad_accum-1) of the global batch that starts at
  // training sample `consumed`, for data-parallel rank `dp_rank` of `dp`, in
  // host memory. seqlen (1..seq_length; 0 = all): keep the first seqlen
  // tokens and targets of every sample (a sequence-length curriculum, as
  // Megatron's get_batch).
  MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen = 0) override;
  // Validation batches are taken from the start of the valid split each time.
  MicroBatch valid_batch(int64_t first_sample, int dp_rank, int dp) override;
  bool has_valid() const override { return valid_ != nullptr; }
  // Samples per epoch summed over the blended training datasets.
  int64_t train_samples_per_epoch() const override;
  int64_t max_token() const { return max_token_; }

 private:
  // Opens `prefix` once (train and valid may share a file); checks its tokens.
  const data::IndexedDataset& open(const std::string& prefix, int64_t vocab_size);
  // A GptDataset over `range` of `file`, kept alive by this object.
  const data::GptDataset* part(const data::IndexedDataset& file, data::DocRange range, const std::string& name);
  MicroBatch fetch(const data::BlendedDataset& ds, int64_t first, int64_t seqlen);

  int64_t B_, T_;
  uint64_t seed_;
  std::vector<std::pair<std::string, std::unique_ptr<data::IndexedDataset>>> files_;
  std::vector<std::unique_ptr<data::GptDataset>> parts_;
  std::unique_ptr<data::BlendedDataset> train_, valid_;
  int64_t max_token_ = -1;
  Tensor host_;  // (B, T+1) staging
};

}  // namespace ds
