// Data pipeline: dataset opening, split, vocabulary check and batch staging.
#include "lib/train/data_pipeline.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/core/log.h"

namespace ds {

namespace {

// The blend of `parts` (null: a dataset without samples here, left out with
// its weight), or null when none is left.
std::unique_ptr<data::BlendedDataset> blend(const std::vector<const data::GptDataset*>& parts,
                                            const std::vector<double>& weights) {
  std::vector<const data::GptDataset*> kept;
  std::vector<double> w;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i] || weights[i] <= 0) continue;
    kept.push_back(parts[i]);
    w.push_back(weights[i]);
  }
  if (kept.empty()) return nullptr;
  return std::make_unique<data::BlendedDataset>(std::move(kept), std::move(w));
}

}  // namespace

DataPipeline::DataPipeline(const TrainConfig& cfg, Device dev)
    : BatchSource(dev), B_(cfg.batch.micro_batch_size), T_(cfg.model.seq_length), seed_(cfg.seed) {
  const DataConfig& d = cfg.data;
  const int64_t V = cfg.model.vocab_size;
  DS_USER_CHECK(!d.data_path.empty() || !d.train_data_path.empty(),
                "no training data: give --data-path PREFIX (or data.data_path), or --train-data-path");
  std::vector<const data::GptDataset*> train, valid;
  data::BlendSpec tb, vb;
  if (!d.data_path.empty()) {  // one list of datasets, each split into train / valid / test
    tb = vb = data::parse_blend(d.data_path, "--data-path");
    for (const std::string& prefix : tb.prefixes) {
      const data::IndexedDataset& f = open(prefix, V);
      const data::SplitRanges sr = data::split_documents(d.split, f.num_sequences());
      parts_.push_back(std::make_unique<data::GptDataset>(data::train_split_dataset(f, prefix, d.split, T_, seed_)));
      train.push_back(parts_.back().get());
      valid.push_back(sr.valid.size() > 0 ? part(f, sr.valid, "valid split of '" + prefix + "'") : nullptr);
    }
  } else {  // Megatron's separate datasets: each is used whole
    tb = data::parse_blend(d.train_data_path, "--train-data-path");
    for (const std::string& prefix : tb.prefixes) {
      const data::IndexedDataset& f = open(prefix, V);
      train.push_back(part(f, {0, f.num_sequences()}, "train dataset '" + prefix + "'"));
    }
    if (!d.valid_data_path.empty()) {
      vb = data::parse_blend(d.valid_data_path, "--valid-data-path");
      for (const std::string& prefix : vb.prefixes) {
        const data::IndexedDataset& f = open(prefix, V);
        valid.push_back(part(f, {0, f.num_sequences()}, "valid dataset '" + prefix + "'"));
      }
    }
    // The test datasets are checked like the others; dstrain evaluates no test set.
    if (!d.test_data_path.empty())
      for (const std::string& prefix : data::parse_blend(d.test_data_path, "--test-data-path").prefixes) open(prefix, V);
  }
  for (size_t i = 0; i < train.size(); ++i)
    DS_USER_CHECK(tb.weights[i] <= 0 || train[i]->samples_per_epoch() > 0,
                  "dataset '{}': the {} ({} documents, {} tokens) is smaller than one sample of {} tokens",
                  tb.prefixes[i], train[i]->name(), train[i]->range().size(), train[i]->num_tokens(), T_ + 1);
  for (auto& v : valid)
    if (v && v->samples_per_epoch() == 0) v = nullptr;
  train_ = blend(train, tb.weights);
  valid_ = blend(valid, vb.weights);
  host_ = Tensor::empty({B_, T_ + 1}, DType::I32);
}

const data::IndexedDataset& DataPipeline::open(const std::string& prefix, int64_t vocab_size) {
  for (const auto& [p, f] : files_)
    if (p == prefix) return *f;
  auto f = std::make_unique<data::IndexedDataset>(data::IndexedDataset::open(prefix));
  const int64_t top = data::max_token_id(*f);
  DS_USER_CHECK(top < vocab_size,
                "dataset '{}' contains token id {} but the vocabulary has {} entries: the vocab file does not "
                "match the dataset",
                prefix, top, vocab_size);
  max_token_ = std::max(max_token_, top);
  files_.emplace_back(prefix, std::move(f));
  return *files_.back().second;
}

const data::GptDataset* DataPipeline::part(const data::IndexedDataset& file, data::DocRange range,
                                           const std::string& name) {
  parts_.push_back(std::make_unique<data::GptDataset>(file, range, T_, seed_, name));
  return parts_.back().get();
}

int64_t DataPipeline::train_samples_per_epoch() const {
  int64_t n = 0;
  for (size_t i = 0; i < train_->num_parts(); ++i) n += train_->part(i).samples_per_epoch();
  return n;
}

MicroBatch DataPipeline::fetch(const data::BlendedDataset& ds, int64_t first, int64_t seqlen) {
  DS_CHECK(seqlen >= 0 && seqlen <= T_, "train_batch: seqlen {} outside [0, {}]", seqlen, T_);
  const int64_t L = seqlen > 0 ? seqlen : T_;  // positions kept per sample
  for (int64_t b = 0; b < B_; ++b) ds.get(first + b, host_.data<int32_t>() + b * (T_ + 1));
  Tensor tok = Tensor::empty({B_, L}, DType::I32), tgt = Tensor::empty({B_, L}, DType::I32);
  for (int64_t b = 0; b < B_; ++b) {
    const int32_t* row = host_.data<int32_t>() + b * (T_ + 1);
    std::copy_n(row, L, tok.data<int32_t>() + b * L);
    std::copy_n(row + 1, L, tgt.data<int32_t>() + b * L);
  }
  return {.tokens = tok, .targets = tgt, .first_sample = first, .step_key = {}};
}

MicroBatch DataPipeline::train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen) {
  return fetch(*train_, consumed + (static_cast<int64_t>(micro) * dp + dp_rank) * B_, seqlen);
}

MicroBatch DataPipeline::valid_batch(int64_t first_sample, int dp_rank, int dp) {
  return fetch(*valid_, first_sample + static_cast<int64_t>(dp_rank) * B_, 0);
}

}  // namespace ds
