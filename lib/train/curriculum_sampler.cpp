// DeepSpeed's data-sampling curriculum (curriculum_sampler.h): clusters,
// draws and the chunked stream.
#include "lib/train/curriculum_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/data/indexed_dataset.h"

namespace ds {

void MemoryMetricIndex::append(int64_t r, int64_t begin, int64_t end, std::vector<uint32_t>& out) const {
  const std::vector<int64_t>& row = rows_.at(static_cast<size_t>(r));
  for (int64_t i = begin; i < end; ++i) out.push_back(static_cast<uint32_t>(row[static_cast<size_t>(i)]));
}

namespace {

// index_to_sample (and for value-based difficulty index_to_metric) in
// DeepSpeed's flavour of the indexed format, memory-mapped.
class FileMetricIndex final : public MetricIndex {
 public:
  FileMetricIndex(const CurriculumMetricConfig& m, int64_t one_epoch)
      : samples_(data::IndexedDataset::open(m.index_to_sample_path, data::DTypeCodes::DeepSpeed)),
        path_(m.index_to_sample_path),
        one_epoch_(one_epoch) {
    if (m.index_to_metric_path.empty()) return;
    metric_ = std::make_unique<data::IndexedDataset>(
        data::IndexedDataset::open(m.index_to_metric_path, data::DTypeCodes::DeepSpeed));
    DS_USER_CHECK(metric_->num_sequences() == samples_.num_sequences(),
                  "data-sampling curriculum: {} has {} rows but {} has {} (the index_to_metric and index_to_sample "
                  "files of one analysis have one row per metric value)", m.index_to_metric_path,
                  metric_->num_sequences(), path_, samples_.num_sequences());
    for (int64_t r = 0; r < metric_->num_sequences(); ++r) {
      DS_USER_CHECK(metric_->sequence_length(r) == 1, "data-sampling curriculum: {} row {} holds {} values, not one",
                    m.index_to_metric_path, r, metric_->sequence_length(r));
      int64_t v = 0;
      metric_->read_values(r, 0, 1, &v);
      DS_USER_CHECK(r == 0 || v > values_.back(), "data-sampling curriculum: {} is not in ascending order at row {} "
                    "({} after {}); use the reduce's index_to_metric file", m.index_to_metric_path, r, v,
                    values_.back());
      values_.push_back(v);
    }
  }
  int64_t rows() const override { return samples_.num_sequences(); }
  int64_t row_size(int64_t r) const override { return samples_.sequence_length(r); }
  void append(int64_t r, int64_t begin, int64_t end, std::vector<uint32_t>& out) const override {
    std::vector<int64_t> buf(static_cast<size_t>(std::min<int64_t>(end - begin, 1 << 16)));
    for (int64_t at = begin; at < end;) {
      const int64_t n = std::min<int64_t>(end - at, static_cast<int64_t>(buf.size()));
      samples_.read_values(r, at, n, buf.data());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = buf[static_cast<size_t>(i)];
        DS_USER_CHECK(id >= 0 && id < one_epoch_, "data-sampling curriculum: {} row {} names sample {}, but the train "
                      "dataset has {} samples per epoch (an analysis of other data, --split, --seq-length or --seed)",
                      path_, r, id, one_epoch_);
        out.push_back(static_cast<uint32_t>(id));
      }
      at += n;
    }
  }
  int64_t metric(int64_t r) const override { return values_.at(static_cast<size_t>(r)); }

 private:
  data::IndexedDataset samples_;
  std::string path_;
  int64_t one_epoch_;
  std::unique_ptr<data::IndexedDataset> metric_;
  std::vector<int64_t> values_;
};

}  // namespace

std::unique_ptr<MetricIndex> open_metric_index(const CurriculumMetricConfig& m, int64_t one_epoch_samples) {
  return std::make_unique<FileMetricIndex>(m, one_epoch_samples);
}

int64_t seqlen_reshape_rows(int64_t B, int64_t T, int64_t L) {
  if (L >= T) return B;
  const int64_t w = L + 1, pieces = (T + 1) / w;
  int64_t rows = std::min((B * (T + 1) + w - 1) / w, B * pieces + B);
  if (rows > 1 && rows % 2 != 0) rows -= 1;
  return rows;
}

CurriculumSampler::CurriculumSampler(const DataSamplingConfig& cfg, Shape shape,
                                     std::vector<std::unique_ptr<MetricIndex>> index)
    : cfg_(cfg), shape_(shape), index_(std::move(index)) {
  DS_CHECK(index_.size() == cfg_.metrics.size(), "curriculum sampler: {} indexes for {} metrics", index_.size(),
           cfg_.metrics.size());
  DS_CHECK(shape_.chunk > 0 && shape_.global_batch % shape_.chunk == 0, "curriculum sampler: global batch {} chunk {}",
           shape_.global_batch, shape_.chunk);
  DS_USER_CHECK(shape_.one_epoch_samples > 0 && shape_.one_epoch_samples <= int64_t{0xffffffff},
                "data-sampling curriculum: the train dataset has {} samples per epoch; dstrain's sampler handles "
                "1 to 2^32-1", shape_.one_epoch_samples);
  for (size_t m = 0; m < cfg_.metrics.size(); ++m)
    DS_CHECK(cfg_.metrics[m].single_cluster == (index_[m] == nullptr), "curriculum sampler: metric {} index",
             cfg_.metrics[m].name);
  DS_USER_CHECK(cfg_.num_epochs >= 1 && cfg_.num_epochs <= std::numeric_limits<int64_t>::max() / shape_.one_epoch_samples,
                "data_efficiency.data_sampling.num_epochs {} is out of range for {} samples per epoch",
                cfg_.num_epochs, shape_.one_epoch_samples);
  total_samples_ = shape_.one_epoch_samples * cfg_.num_epochs;
  reset();
}

void CurriculumSampler::reset() {
  rng_ = std::make_unique<data::NumpyGenerator>(cfg_.seed);
  sched_.clear();
  for (const CurriculumMetricConfig& m : cfg_.metrics) sched_.emplace_back(m.schedule);
  current_.assign(cfg_.metrics.size(), 0);
  started_ = false;
  step_ = consumed_ = produced_ = 0;
  epoch_size_.reset();
  clusters_.clear();
  batch_.clear();
  batch_pos_ = 0;
  window_.clear();
  window_first_ = 0;
}

std::pair<int64_t, int64_t> CurriculumSampler::rank_part(int64_t n, int dp_rank, int dp) {
  // Python's round(r * n / dp): round half to even of the true quotient.
  auto start = [&](int64_t r) {
    return static_cast<int64_t>(std::nearbyint(static_cast<double>(r * n) / static_cast<double>(dp)));
  };
  return {start(dp_rank), start(dp_rank + 1)};
}

// Rows whose metric value v satisfies above < v <= upto (above absent: -inf),
// concatenated in index order (get_sample_based_on_metric_value).
std::vector<uint32_t> CurriculumSampler::by_value(size_t m, std::optional<int64_t> above, int64_t upto) const {
  const MetricIndex& ix = *index_[m];
  std::vector<uint32_t> out;
  for (int64_t r = 0; r < ix.rows(); ++r) {
    const int64_t v = ix.metric(r);
    if (v <= upto && (!above || v > *above)) ix.append(r, 0, ix.row_size(r), out);
  }
  return out;
}

// The samples from percentile `from` to `to` of the rows in order
// (get_sample_based_on_metric_percentile): max_difficulty percentile steps of
// size // max samples each, the last one taking the remainder.
std::vector<uint32_t> CurriculumSampler::by_percentile(size_t m, int64_t from, int64_t to) {
  const MetricIndex& ix = *index_[m];
  if (!epoch_size_) {  // upstream computes it once, from the first metric that asks
    int64_t n = 0;
    for (int64_t r = 0; r < ix.rows(); ++r) n += ix.row_size(r);
    epoch_size_ = n;
  }
  const int64_t size = *epoch_size_, max_pct = cfg_.metrics[m].schedule.max_difficulty;
  const int64_t per = size / max_pct;
  const int64_t begin = per * from, end = to == max_pct ? size : per * to;
  std::vector<uint32_t> out;
  int64_t seen = 0;
  for (int64_t r = 0; r < ix.rows(); ++r) {
    const int64_t rs = ix.row_size(r);
    if (seen + rs > begin) {
      const int64_t lo = std::max<int64_t>(0, begin - seen);
      const int64_t hi = seen + rs <= end ? rs : end - seen;
      if (hi > lo) ix.append(r, lo, hi, out);
    }
    seen += rs;
    if (seen >= end) break;
  }
  return out;
}

// get_new_cluster: previous[m] is the metric's difficulty before this step;
// from_start[m] marks a metric without one (value: -inf, percentile: 0).
void CurriculumSampler::form_cluster(const std::vector<int64_t>& previous, const std::vector<bool>& from_start) {
  const size_t M = cfg_.metrics.size();
  size_t clustered = 0;
  for (const CurriculumMetricConfig& m : cfg_.metrics) clustered += m.single_cluster ? 0 : 1;
  std::vector<uint32_t> fresh;
  bool any = false;
  if (clustered > 1) {
    // The samples within every metric's current difficulty (np.intersect1d:
    // sorted), less those in earlier clusters (np.setdiff1d keeps the order).
    const uint32_t N = static_cast<uint32_t>(shape_.one_epoch_samples);
    std::vector<uint8_t> hits(N, 0);
    for (size_t m = 0; m < M; ++m) {
      if (cfg_.metrics[m].single_cluster) {
        for (uint32_t s = 0; s < N; ++s) hits[s] += 1;
        continue;
      }
      const std::vector<uint32_t> ids = cfg_.metrics[m].difficulty == CurriculumDifficulty::Value
                                            ? by_value(m, std::nullopt, current_[m])
                                            : by_percentile(m, 0, current_[m]);
      for (uint32_t s : ids) hits[s] += 1;
    }
    for (const Cluster& c : clusters_)
      for (uint32_t s : c.ids) hits[s] = 0;
    for (uint32_t s = 0; s < N; ++s)
      if (hits[s] == M) fresh.push_back(s);
    any = true;
  } else {
    if (clusters_.empty()) {
      fresh.resize(static_cast<size_t>(shape_.one_epoch_samples));
      for (size_t s = 0; s < fresh.size(); ++s) fresh[s] = static_cast<uint32_t>(s);
      any = true;
    }
    for (size_t m = 0; m < M; ++m) {
      if (cfg_.metrics[m].single_cluster) continue;
      fresh = cfg_.metrics[m].difficulty == CurriculumDifficulty::Value
                  ? by_value(m, from_start[m] ? std::nullopt : std::optional<int64_t>(previous[m]), current_[m])
                  : by_percentile(m, from_start[m] ? 0 : previous[m], current_[m]);
      any = true;
    }
  }
  std::string diffs;
  for (size_t m = 0; m < M; ++m) diffs += fmt::format("{}{} {}", m ? ", " : "", cfg_.metrics[m].name, current_[m]);
  if (!any || fresh.empty()) return;  // no sample newly within the difficulties: no cluster (as upstream)
  rng_->shuffle(fresh);
  Cluster c;
  c.size = static_cast<int64_t>(fresh.size());
  c.ids = std::move(fresh);
  if (!quiet_)
    DS_LOG("data-sampling curriculum: step {}: new cluster {} of {} samples (difficulties {})", step_,
           clusters_.size(), c.size, diffs);
  clusters_.push_back(std::move(c));
}

// get_sample_from_cluster: n samples from the cluster's position; a cluster
// run dry is reshuffled (its current order, shuffled again) and restarts.
void CurriculumSampler::take(Cluster& c, int64_t n, std::vector<int64_t>& out) {
  const int64_t size = static_cast<int64_t>(c.ids.size());
  const int64_t begin = std::min(c.pos, size), end = std::min(c.pos + n, size);
  for (int64_t i = begin; i < end; ++i) out.push_back(c.ids[static_cast<size_t>(i)]);
  c.pos += n;
  const int64_t got = end - begin;
  if (got < n) {
    rng_->shuffle(c.ids);
    const int64_t rest = std::min(n - got, size);
    for (int64_t i = 0; i < rest; ++i) out.push_back(c.ids[static_cast<size_t>(i)]);
    c.pos = n - got;
  }
}

// get_next_global_batch.
void CurriculumSampler::next_global_batch() {
  step_ += 1;
  const size_t M = cfg_.metrics.size();
  bool changed = false;
  std::vector<int64_t> previous(M, 0);
  std::vector<bool> from_start(M, false);
  for (size_t m = 0; m < M; ++m) {
    const int64_t next = sched_[m].update(step_);
    if (!started_ || next != current_[m]) changed = true;
    previous[m] = current_[m];
    from_start[m] = !started_;
    current_[m] = next;
  }
  started_ = true;
  if (changed) form_cluster(previous, from_start);
  DS_USER_CHECK(!clusters_.empty(), "data-sampling curriculum: no sample is within the difficulties of step {} (the "
                "index files hold none up to the schedule's first difficulty); lower min_difficulty", step_);
  int64_t total = 0;
  for (const Cluster& c : clusters_) total += c.size;
  std::vector<double> p;
  for (const Cluster& c : clusters_) p.push_back(static_cast<double>(c.size) / static_cast<double>(total));
  std::vector<int64_t> count(clusters_.size(), 0);
  for (int64_t k : rng_->choice(p, shape_.global_batch)) count[static_cast<size_t>(k)] += 1;
  batch_.clear();
  batch_pos_ = 0;
  for (size_t k = 0; k < clusters_.size(); ++k) take(clusters_[k], count[k], batch_);
  rng_->shuffle(batch_);
}

void CurriculumSampler::produce() {
  for (;;) {
    DS_USER_CHECK(consumed_ <= total_samples_, "data-sampling curriculum: the stream of {} samples ({} epochs of {}) "
                  "is used up; raise data_efficiency.data_sampling.num_epochs", total_samples_, cfg_.num_epochs,
                  shape_.one_epoch_samples);
    bool fresh = false;
    if (batch_pos_ == batch_.size()) {
      next_global_batch();
      fresh = true;
    }
    const int64_t left = static_cast<int64_t>(batch_.size() - batch_pos_);
    const int64_t k = std::min(shape_.chunk, left);
    if (k == shape_.chunk) {
      Chunk c;
      c.samples.assign(batch_.begin() + static_cast<std::ptrdiff_t>(batch_pos_),
                       batch_.begin() + static_cast<std::ptrdiff_t>(batch_pos_ + k));
      c.difficulties = current_;
      c.curriculum_step = step_;
      batch_pos_ += static_cast<size_t>(k);
      consumed_ += k;
      produced_ += 1;
      window_.push_back(std::move(c));
      return;
    }
    DS_USER_CHECK(shape_.drop_last && !fresh,
                  "data-sampling curriculum: step {} drew a global batch of {} samples ({} left over), fewer than "
                  "the {} of a micro-step (a cluster smaller than its share of the batch); {}",
                  step_, batch_.size(), left, shape_.chunk,
                  shape_.drop_last ? "its clusters are too small for this batch size"
                                   : "set dataloader_drop_last true to drop the short remainder, as upstream");
    batch_pos_ = batch_.size();  // dropped, as DeepSpeed's sampler with drop_last
  }
}

CurriculumSampler::Chunk CurriculumSampler::chunk(int64_t c) {
  std::lock_guard<std::mutex> lock(mu_);
  DS_CHECK(c >= 0, "curriculum sampler: chunk {}", c);
  if (c < window_first_) reset();  // a replay from the start
  const int64_t keep = 2 * shape_.global_batch / shape_.chunk;
  quiet_ = c > produced_ + keep;  // a resumed run replays quietly
  if (quiet_) DS_LOG("data-sampling curriculum: replaying the sample stream up to micro-step {}", c);
  while (produced_ <= c) produce();
  quiet_ = false;
  // Keep the chunks of the last two global batches' worth for repeated asks.
  while (window_first_ + keep < c && !window_.empty()) {
    window_.pop_front();
    window_first_ += 1;
  }
  return window_.at(static_cast<size_t>(c - window_first_));
}

}  // namespace ds
