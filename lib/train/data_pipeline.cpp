// Data pipeline: dataset opening, split, vocabulary check and batch staging.
#include "lib/train/data_pipeline.h"

#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/core/log.h"
#include "lib/data/bpe.h"

namespace ds {

int64_t vocab_size_from_file(const std::string& vocab_json) { return data::vocab_file_size(vocab_json); }

DataPipeline::DataPipeline(const TrainConfig& cfg, Device dev)
    : B_(cfg.batch.micro_batch_size), T_(cfg.model.seq_length), dev_(dev) {
  DS_USER_CHECK(!cfg.data.data_path.empty(), "no training data: give --data-path PREFIX (or data.data_path)");
  DS_USER_CHECK(cfg.data.data_path.size() == 1,
                "--data-path: blending several datasets is not supported yet; give one prefix (got {})",
                cfg.data.data_path.size());
  ds_ = std::make_unique<data::IndexedDataset>(data::IndexedDataset::open(cfg.data.data_path[0]));
  max_token_ = data::max_token_id(*ds_);
  DS_USER_CHECK(max_token_ < cfg.model.vocab_size,
                "dataset '{}' contains token id {} but the vocabulary has {} entries: the vocab file does not "
                "match the dataset",
                cfg.data.data_path[0], max_token_, cfg.model.vocab_size);
  data::SplitRanges sr = data::split_documents(cfg.data.split, ds_->num_sequences());
  train_ = std::make_unique<data::GptDataset>(*ds_, sr.train, T_, cfg.seed, "train");
  DS_USER_CHECK(train_->samples_per_epoch() > 0,
                "dataset '{}': the train split ({} documents, {} tokens) is smaller than one sample of {} tokens",
                cfg.data.data_path[0], sr.train.size(), train_->num_tokens(), T_ + 1);
  if (sr.valid.size() > 0) valid_ = std::make_unique<data::GptDataset>(*ds_, sr.valid, T_, cfg.seed, "valid");
  host_ = Tensor::empty({B_, T_ + 1}, DType::I32);
}

MicroBatch DataPipeline::fetch(const data::GptDataset& ds, int64_t first) {
  for (int64_t b = 0; b < B_; ++b) ds.get(first + b, host_.data<int32_t>() + b * (T_ + 1));
  Tensor tok = Tensor::empty({B_, T_}, DType::I32), tgt = Tensor::empty({B_, T_}, DType::I32);
  for (int64_t b = 0; b < B_; ++b) {
    const int32_t* row = host_.data<int32_t>() + b * (T_ + 1);
    std::copy_n(row, T_, tok.data<int32_t>() + b * T_);
    std::copy_n(row + 1, T_, tgt.data<int32_t>() + b * T_);
  }
  if (dev_.is_cpu()) return {tok, tgt};
  return {tok.to(dev_), tgt.to(dev_)};
}

MicroBatch DataPipeline::train_batch(int64_t consumed, int micro, int dp_rank, int dp) {
  return fetch(*train_, consumed + (static_cast<int64_t>(micro) * dp + dp_rank) * B_);
}

MicroBatch DataPipeline::valid_batch(int64_t first_sample, int dp_rank, int dp) {
  return fetch(*valid_, first_sample + static_cast<int64_t>(dp_rank) * B_);
}

}  // namespace ds
