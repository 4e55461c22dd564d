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
    : BatchSource(dev),
      B_(cfg.batch.micro_batch_size),
      T_(cfg.model.seq_length),
      seed_(cfg.seed),
      global_batch_(cfg.batch.train_batch_size),
      grad_accum_(cfg.batch.grad_accum_steps) {
  if (cfg.data_sampling.active()) sampling_ = cfg.data_sampling;
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
      if (!d.train_doc_idx_path.empty()) {
        train.push_back(
            mapped_part(f, prefix, d.split, {d.train_doc_idx_path, d.train_sample_idx_path, d.train_shuffle_idx_path}));
      } else {
        parts_.push_back(std::make_unique<data::GptDataset>(data::train_split_dataset(f, prefix, d.split, T_, seed_)));
        train.push_back(parts_.back().get());
      }
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

// Megatron's --train-{doc,sample,shuffle}-idx-path. Upstream loads the three
// maps when they exist and otherwise builds them and saves them there. Here:
// all three present: the samples are the maps' (checked against the dataset
// and the sequence length); none present: dstrain's own first epoch, written
// there by rank 0 (so a later run or dsprep's analysis reads the same order),
// and repeated as the maps' samples repeat. Since the written maps give
// exactly that epoch, a rank that finds them half-written by rank 0 (some
// files renamed into place, not all) computes the same samples itself.
const data::GptDataset* DataPipeline::mapped_part(const data::IndexedDataset& file, const std::string& prefix,
                                                  const std::string& split, const data::IndexMapPaths& paths) {
  if (data::index_maps_exist(paths, /*partial_is_error=*/log_rank() == 0)) {
    parts_.push_back(std::make_unique<data::GptDataset>(
        data::GptDataset::from_index_maps(file, paths, T_, "train split of '" + prefix + "'")));
    DS_LOG("{}: {} samples from Megatron's index maps {}, {}, {}", parts_.back()->name(),
           parts_.back()->samples_per_epoch(), paths.doc_idx, paths.sample_idx, paths.shuffle_idx);
    return parts_.back().get();
  }
  parts_.push_back(std::make_unique<data::GptDataset>(data::train_split_dataset(file, prefix, split, T_, seed_)));
  const data::GptDataset* p = parts_.back().get();
  repeat_first_epoch_ = true;
  if (log_rank() == 0 && p->samples_per_epoch() > 0) {
    p->write_index_maps(paths);
    DS_LOG("{}: wrote its first epoch ({} samples) as Megatron's index maps {}, {}, {}", p->name(),
           p->samples_per_epoch(), paths.doc_idx, paths.sample_idx, paths.shuffle_idx);
  }
  return p;
}

int64_t DataPipeline::train_samples_per_epoch() const {
  int64_t n = 0;
  for (size_t i = 0; i < train_->num_parts(); ++i) n += train_->part(i).samples_per_epoch();
  return n;
}

MicroBatch DataPipeline::fetch(const data::BlendedDataset& ds, int64_t first, int64_t seqlen, const int64_t* ids) {
  DS_CHECK(seqlen >= 0 && seqlen <= T_, "train_batch: seqlen {} outside [0, {}]", seqlen, T_);
  const int64_t L = seqlen > 0 ? seqlen : T_;  // positions kept per sample
  for (int64_t b = 0; b < B_; ++b) {
    int32_t* row = host_.data<int32_t>() + b * (T_ + 1);
    if (ids)
      ds.part(0).get(ids[b], row);  // a sample id of the one dataset's first epoch
    else if (repeat_first_epoch_ && &ds == train_.get())  // index maps: their samples repeat in order
      ds.part(0).get((first + b) % ds.part(0).samples_per_epoch(), row);
    else
      ds.get(first + b, row);
  }
  if (ids && sampling_.reshapes() && L < T_) return reshape(first, L);
  Tensor tok = Tensor::empty({B_, L}, DType::I32), tgt = Tensor::empty({B_, L}, DType::I32);
  for (int64_t b = 0; b < B_; ++b) {
    const int32_t* row = host_.data<int32_t>() + b * (T_ + 1);
    std::copy_n(row, L, tok.data<int32_t>() + b * L);
    std::copy_n(row + 1, L, tgt.data<int32_t>() + b * L);
  }
  return {.tokens = tok, .targets = tgt, .first_sample = first, .step_key = {}};
}

// seqlen_reshape (seqlen_reshape_rows): the staged (B, T+1) rows re-cut into
// rows of L + 1 tokens. Each micro-batch's loss is the mean over its own
// tokens, as Megatron's, so its weight is scaled by B / rows. Rows are not
// samples: the dropout keys take row r of the micro-batch at sample index
// first x (T+1) + r, which no other row of the run shares (a micro-batch has
// at most B (T+1) rows and the next one starts B samples later).
MicroBatch DataPipeline::reshape(int64_t first, int64_t L) {
  const int64_t w = L + 1, pieces = (T_ + 1) / w, rows = seqlen_reshape_rows(B_, T_, L);
  Tensor tok = Tensor::empty({rows, L}, DType::I32), tgt = Tensor::empty({rows, L}, DType::I32);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* src = r < B_ * pieces ? host_.data<int32_t>() + (r / pieces) * (T_ + 1) + (r % pieces) * w
                                         : host_.data<int32_t>() + (r - B_ * pieces) * (T_ + 1) + (T_ + 1 - w);
    std::copy_n(src, L, tok.data<int32_t>() + r * L);
    std::copy_n(src + 1, L, tgt.data<int32_t>() + r * L);
  }
  return {.tokens = tok,
          .targets = tgt,
          .first_sample = first * (T_ + 1),
          .step_key = {},
          .loss_weight_scale = static_cast<float>(static_cast<double>(B_) / static_cast<double>(rows))};
}

CurriculumSampler::Chunk DataPipeline::curriculum_chunk(int64_t consumed, int micro, int dp) {
  if (!sampler_) {
    DS_CHECK(train_->num_parts() == 1, "data-sampling curriculum over {} blended datasets", train_->num_parts());
    const data::GptDataset& ds = train_->part(0);
    std::vector<std::unique_ptr<MetricIndex>> index;
    for (const CurriculumMetricConfig& m : sampling_.metrics)
      index.push_back(m.single_cluster ? nullptr : open_metric_index(m, ds.samples_per_epoch()));
    sampler_ = std::make_unique<CurriculumSampler>(
        sampling_,
        CurriculumSampler::Shape{.one_epoch_samples = ds.samples_per_epoch(),
                                 .global_batch = global_batch_,
                                 .chunk = B_ * dp,
                                 .drop_last = sampling_.drop_last},
        std::move(index));
    std::string metrics;
    for (const CurriculumMetricConfig& m : sampling_.metrics)
      metrics += fmt::format("{}{} ({} {}, {} from {} to {})", metrics.empty() ? "" : ", ", m.name,
                             m.difficulty == CurriculumDifficulty::Value ? "value" : "percentile",
                             m.single_cluster ? "single_cluster" : "schedule_based",
                             curriculum_schedule_name(m.schedule.schedule), m.schedule.min_difficulty,
                             m.schedule.max_difficulty);
    DS_LOG("data-sampling curriculum: {} over the {} samples of the train dataset's first epoch (seed {}, {} "
           "epochs){}", metrics, ds.samples_per_epoch(), sampling_.seed, sampling_.num_epochs,
           sampling_.seqlen_metric() ? "; seqlen_truncate keeps the first difficulty tokens of every sample" : "");
  }
  return sampler_->chunk(consumed / global_batch_ * grad_accum_ + micro);
}

int64_t DataPipeline::curriculum_seqlen(int64_t consumed, int micro, int dp) {
  if (!sampling_.active()) return 0;
  const CurriculumMetricConfig* m = sampling_.seqlen_metric();
  if (!m) return T_;
  const CurriculumSampler::Chunk c = curriculum_chunk(consumed, micro, dp);
  // Megatron-DeepSpeed's data_post_process: keep (or re-cut into) current_seqlen + 1 tokens when shorter.
  return std::min(c.difficulties[static_cast<size_t>(m - sampling_.metrics.data())], T_);
}

MicroBatch DataPipeline::train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen) {
  const int64_t first = consumed + (static_cast<int64_t>(micro) * dp + dp_rank) * B_;
  if (!sampling_.active()) return fetch(*train_, first, seqlen);
  const CurriculumSampler::Chunk c = curriculum_chunk(consumed, micro, dp);
  const auto [lo, hi] = CurriculumSampler::rank_part(static_cast<int64_t>(c.samples.size()), dp_rank, dp);
  DS_CHECK(hi - lo == B_, "curriculum chunk part [{}, {}) for micro batch {}", lo, hi, B_);
  return fetch(*train_, first, seqlen, c.samples.data() + lo);
}

MicroBatch DataPipeline::valid_batch(int64_t first_sample, int dp_rank, int dp) {
  return fetch(*valid_, first_sample + static_cast<int64_t>(dp_rank) * B_, 0);
}

}  // namespace ds
