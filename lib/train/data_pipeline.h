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
#include "lib/train/curriculum_sampler.h"

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
  // With the data-sampling curriculum (--data-efficiency-curriculum-learning)
  // the samples come from its stream (lib/train/curriculum_sampler.h): micro-step
  // (consumed / global batch) x gradient accumulation + micro.
  MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen = 0) override;
  int64_t curriculum_seqlen(int64_t consumed, int micro, int dp) override;
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
  // The train split of `prefix` through Megatron's index maps at `paths` (see the .cpp).
  const data::GptDataset* mapped_part(const data::IndexedDataset& file, const std::string& prefix,
                                      const std::string& split, const data::IndexMapPaths& paths);
  // B samples from `first` of `ds` (ids null), or samples ids[0..B) of the
  // single train dataset, as (B, seqlen) tokens and targets.
  MicroBatch fetch(const data::BlendedDataset& ds, int64_t first, int64_t seqlen, const int64_t* ids = nullptr);
  // The staged rows re-cut for seqlen_reshape at length L (see the .cpp).
  MicroBatch reshape(int64_t first, int64_t L);
  // The curriculum's chunk for a micro-step (the sampler is made on first use,
  // when the data-parallel size is known).
  CurriculumSampler::Chunk curriculum_chunk(int64_t consumed, int micro, int dp);

  int64_t B_, T_;
  uint64_t seed_;
  std::vector<std::pair<std::string, std::unique_ptr<data::IndexedDataset>>> files_;
  std::vector<std::unique_ptr<data::GptDataset>> parts_;
  std::unique_ptr<data::BlendedDataset> train_, valid_;
  int64_t max_token_ = -1;
  Tensor host_;  // (B, T+1) staging
  bool repeat_first_epoch_ = false;  // index maps not yet written: the first epoch repeats, as the maps' samples
  // The data-sampling curriculum, when active.
  DataSamplingConfig sampling_;
  int64_t global_batch_ = 0, grad_accum_ = 0;
  std::unique_ptr<CurriculumSampler> sampler_;
};

}  // namespace ds
