// DeepSpeed Data Efficiency's curriculum learning by data sampling: the
// training sample order of DeepSpeed's DeepSpeedDataSampler
// (runtime/data_pipeline/data_sampling/data_sampler.py) as Megatron-DeepSpeed
// drives it with --data-efficiency-curriculum-learning, draw for draw on
// numpy's default_rng (lib/data/numpy_random.h). docs/data_efficiency.md.
//
// The stream: before each global batch the curriculum step advances and
// every metric's scheduler gives its difficulty. When one changed, a new
// cluster of samples is formed from the data analysis' index files (the
// samples between the previous and the current difficulty, or, with two or
// more schedule_based metrics, those within every metric's difficulty and in
// no earlier cluster), shuffled, and kept. The global batch draws its count
// from each cluster by choice() weighted by the clusters' sizes, takes them
// in order from each cluster's position (a cluster run dry is reshuffled and
// restarts), and is shuffled. The stream is cut into chunks of
// micro_batch x DP samples (one micro-step); DP rank r takes
// [round(r n / dp), round((r+1) n / dp)) of a chunk. A chunk cut short at the
// end of a global batch is dropped with dataloader_drop_last, as upstream.
//
// Every rank computes the stream itself (upstream: global rank 0, broadcast),
// so nothing is exchanged. The state is a pure function of the config, the
// index files and the chunk index: a resumed run replays the stream up to its
// first chunk (upstream's checkpoint restores numpy's global generator
// instead of the sampler's, so its resume does not continue the same draws).
// Memory: the clusters hold each sample id of one epoch at most once, as
// uint32 (4 bytes per sample of the epoch); the index files stay mapped.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/data/numpy_random.h"

namespace ds {

// One metric's data analysis: rows of sample ids (index_to_sample, or its
// percentile_merged form) and, for value-based difficulty, each row's metric
// value (index_to_metric, ascending).
class MetricIndex {
 public:
  virtual ~MetricIndex() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t row_size(int64_t r) const = 0;
  // Appends samples [begin, end) of row r.
  virtual void append(int64_t r, int64_t begin, int64_t end, std::vector<uint32_t>& out) const = 0;
  virtual int64_t metric(int64_t r) const = 0;  // value-based metrics only
};

// An index held in memory (tests, and small analyses).
class MemoryMetricIndex final : public MetricIndex {
 public:
  MemoryMetricIndex(std::vector<std::vector<int64_t>> rows, std::vector<int64_t> metric)
      : rows_(std::move(rows)), metric_(std::move(metric)) {}
  int64_t rows() const override { return static_cast<int64_t>(rows_.size()); }
  int64_t row_size(int64_t r) const override { return static_cast<int64_t>(rows_[r].size()); }
  void append(int64_t r, int64_t begin, int64_t end, std::vector<uint32_t>& out) const override;
  int64_t metric(int64_t r) const override { return metric_.at(r); }

 private:
  std::vector<std::vector<int64_t>> rows_;
  std::vector<int64_t> metric_;
};

// The index files of `m` (schedule_based metrics; null for single_cluster),
// in DeepSpeed's flavour of the indexed format; sample ids must be below
// `one_epoch_samples`. UserError naming the file otherwise.
std::unique_ptr<MetricIndex> open_metric_index(const CurriculumMetricConfig& m, int64_t one_epoch_samples);

// Megatron-DeepSpeed's data_post_process for seqlen_reshape at length L < T:
// a micro-batch's B rows of T + 1 tokens are cut into rows of L + 1 (each
// row's whole (T+1) / (L+1) pieces in order, then every row's last L + 1
// tokens), of which the first ceil(B (T+1) / (L+1)) are kept, made even when
// more than one. The number of rows (B when L >= T).
int64_t seqlen_reshape_rows(int64_t B, int64_t T, int64_t L);

class CurriculumSampler {
 public:
  struct Shape {
    int64_t one_epoch_samples = 0;  // the train dataset's samples (one epoch)
    int64_t global_batch = 0;       // micro_batch x DP x gradient accumulation
    int64_t chunk = 0;              // micro_batch x DP: one micro-step
    bool drop_last = true;          // dataloader_drop_last
  };
  // `index[i]` belongs to cfg.metrics[i] (null for a single_cluster metric).
  CurriculumSampler(const DataSamplingConfig& cfg, Shape shape, std::vector<std::unique_ptr<MetricIndex>> index);

  struct Chunk {
    std::vector<int64_t> samples;       // `chunk` sample ids
    std::vector<int64_t> difficulties;  // per metric (cfg order), when its global batch was drawn
    int64_t curriculum_step = 0;        // that global batch's step (1-based)
  };
  // Chunk c (0-based micro-step of the whole run). Thread-safe; chunks are
  // asked for in order, an earlier one than the window replays from the start.
  Chunk chunk(int64_t c);
  // This rank's part of a chunk: DeepSpeed's get_start_end_idx.
  static std::pair<int64_t, int64_t> rank_part(int64_t n, int dp_rank, int dp);
  int64_t clusters() const { return static_cast<int64_t>(clusters_.size()); }

 private:
  struct Cluster {
    std::vector<uint32_t> ids;
    int64_t size = 0;  // its size when formed (the draw weight)
    int64_t pos = 0;
  };
  void reset();
  void produce();  // appends the next chunk to window_
  void next_global_batch();
  void form_cluster(const std::vector<int64_t>& previous, const std::vector<bool>& from_start);
  std::vector<uint32_t> by_value(size_t m, std::optional<int64_t> above, int64_t upto) const;
  std::vector<uint32_t> by_percentile(size_t m, int64_t from, int64_t to);
  void take(Cluster& c, int64_t n, std::vector<int64_t>& out);

  DataSamplingConfig cfg_;
  Shape shape_;
  std::vector<std::unique_ptr<MetricIndex>> index_;
  int64_t total_samples_;  // one epoch x num_epochs: the stream's end
  std::mutex mu_;
  // Stream state (reset() restores the start).
  std::unique_ptr<data::NumpyGenerator> rng_;
  std::vector<CurriculumScheduler> sched_;
  std::vector<int64_t> current_;
  bool started_ = false, quiet_ = false;
  int64_t step_ = 0, consumed_ = 0, produced_ = 0;
  std::optional<int64_t> epoch_size_;  // data_1epoch_size: rows of the first percentile metric asked
  std::vector<Cluster> clusters_;
  std::vector<int64_t> batch_;  // the rest of the current global batch
  size_t batch_pos_ = 0;
  std::deque<Chunk> window_;  // chunks [window_first_, produced_)
  int64_t window_first_ = 0;
};

}  // namespace ds
