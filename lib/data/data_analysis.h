// DeepSpeed Data Efficiency's offline data analysis for GPT data: what
// DeepSpeed's DataAnalyzer computes when Megatron-DeepSpeed's analyze_data.py
// drives it over the one-epoch train dataset, with the same files as result,
// so that DeepSpeed's curriculum data sampler (and dstrain's) can order
// training samples by difficulty.
//
// Metrics (analyze_data.py's, GPT data):
//   total_vocab_freq  accumulated over samples: how often each token id occurs
//                     in the samples' seq_length + 1 tokens (padded_vocab + 1 bins)
//   vocab_rarity      one value per sample: int(sum of -log(freq[t] / sum(freq))
//                     over its tokens), with the reduced total_vocab_freq (zeros as 1)
//
// map: worker w of W takes part w of the samples, cut into T thread parts
// (split_index); each part runs on its own thread and writes
//   SAVE/METRIC/worker{w}_thread{t}/METRIC_sample_to_metric.{bin,idx}  (vocab_rarity: int64, one row per sample)
//   SAVE/METRIC/worker{w}_thread{t}/METRIC_metric_value.{bin,idx}      (total_vocab_freq: int64, one row)
//   SAVE/METRIC/worker{w}_thread{t}/METRIC_map_range.txt               (the part's sample range; written last)
// reduce: merges every part into (DeepSpeed's dtype codes and layout, byte for byte)
//   SAVE/total_vocab_freq/total_vocab_freq_metric_value
//   SAVE/vocab_rarity/vocab_rarity_sample_to_metric
//   SAVE/vocab_rarity/vocab_rarity_index_to_sample
//   SAVE/vocab_rarity/vocab_rarity_index_to_metric
//   SAVE/vocab_rarity/vocab_rarity_index_to_sample_percentile_merged
// docs/data_efficiency.md ("Data analysis") describes the files and flags.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/data/gpt_dataset.h"
#include "lib/data/indexed_dataset.h"

namespace ds::data {

// The samples to analyze: sample s (0 <= s < num_samples) is get(s, out), which
// writes sample_tokens token ids. get must be thread-safe.
struct AnalysisSamples {
  int64_t num_samples = 0;
  int64_t sample_tokens = 0;  // seq_length + 1 for GPT samples
  std::function<void(int64_t sample, int32_t* out)> get;
  std::string name;  // names the data in errors ("train split of 'data/x'")
};
// Epoch 0 of a GptDataset (dstrain's sample ids 0 .. samples_per_epoch() - 1):
// Megatron's one-epoch train dataset (--train-data-exact-num-epochs 1).
// `ds` must outlive the result.
AnalysisSamples epoch_samples(const GptDataset& ds);

enum class AnalysisMetric { TotalVocabFreq, VocabRarity };
const char* analysis_metric_name(AnalysisMetric m);  // "total_vocab_freq" | "vocab_rarity"
// A --analyzing-metric value. seqlen and seqlen_vocab_rarity are refused as
// analyze_data.py refuses them for GPT data (every sample has the same length);
// other names are unknown. Both are one-line UserErrors.
AnalysisMetric parse_analysis_metric(std::string_view name);

struct AnalysisOptions {
  std::vector<AnalysisMetric> metrics;  // in the order given
  std::string save_path;                // --save
  int num_workers = 1;                  // --analyzing-num-workers
  int worker_id = 0;                    // --analyzing-worker-id (map)
  int num_threads = 1;                  // --analyzing-num-threads: parts (and threads) per worker
  std::vector<int> specific_threads;    // --analyzing-specific-threads (map): only these; empty: all
  int num_threads_reduce = 1;           // --analyzing-num-threads-reduce: chunks of the merged files
  int64_t vocab_size = 0;               // map: the tokenizer's; every token must be below it
  int64_t padded_vocab_size = 0;        // map: total_vocab_freq has padded_vocab_size + 1 bins
};

// DeepSpeed's split_index: [start, end) cut into `parts` parts at
// numpy.linspace(start, end, parts + 1, dtype=int) (i * step + start in
// double, truncated; the last boundary is end). Parts may be empty.
std::vector<std::pair<int64_t, int64_t>> split_index(int64_t start, int64_t end, int parts);
// DeepSpeed's find_fit_int_dtype: the smallest of u8/u16/u32/u64 that holds
// [lo, hi] when lo >= 0, else the smallest of i8/i16/i32/i64.
TokenDType fit_int_dtype(int64_t lo, int64_t hi);
// The sum of x correctly rounded to double (Shewchuk's exact partials, as
// Python's math.fsum): independent of the order of x.
double exact_sum(std::span<const double> x);

// SAVE/METRIC/METRIC_<what> (what: "sample_to_metric", "index_to_sample",
// "index_to_metric", "index_to_sample_percentile_merged", "metric_value"):
// the prefix of a reduce output, read with DTypeCodes::DeepSpeed.
std::string analysis_output_prefix(const std::string& save_path, AnalysisMetric m, std::string_view what);

// The map of worker opt.worker_id over its threads (all, or opt.specific_threads),
// running them concurrently. Each thread first removes its old results, then
// writes them whole (temporaries renamed at the end). Threads are independent,
// as DeepSpeed's map processes: one that fails leaves no results while the
// others finish theirs; then the first failure is thrown, naming its worker and
// thread, so that only the failed ones need --analyzing-specific-threads.
// vocab_rarity needs the reduced total_vocab_freq under opt.save_path.
void run_analysis_map(const AnalysisSamples& samples, const AnalysisOptions& opt);
// The reduce over every worker's and thread's map results. Missing or
// mismatched results are a UserError before anything is written; the outputs
// of a metric are written beside each other under temporary names and renamed
// into place together. Logs DeepSpeed's percentile lines for vocab_rarity.
void run_analysis_reduce(const AnalysisSamples& samples, const AnalysisOptions& opt);

}  // namespace ds::data
