// DeepSpeed's data analysis (DataAnalyzer with analyze_data.py's GPT metrics):
// the map over this worker's thread parts, and the reduce that merges every
// part into the files DeepSpeed's data sampler reads. What DeepSpeed does that
// decides the bytes of the reduce outputs:
//   - dtypes: find_fit_int_dtype over the sample ids [0, N-1] and over the
//     metric values; the .idx dtype codes are DeepSpeed's table;
//   - every output is one builder closed once (doc_idx gains the item count at
//     the end); sample_to_metric, index_to_sample and index_to_metric are the
//     concatenation of one chunk per reduce thread (split_index over the map
//     parts, or over the sorted unique values), each chunk closed on its own,
//     so their doc_idx is 0, the running count after each chunk, the total;
//   - index_to_sample row v holds the samples whose value is the v-th smallest
//     one, worker-major, then by thread, then in the map's order, which is
//     sample id order since the parts are consecutive sample ranges;
//   - the percentile file merges max(1, U / 100) consecutive rows per item.
// DeepSpeed keeps value -> samples lists as CSV files per map part; here the
// reduce derives them from the map parts' sample_to_metric files, which hold
// the same pairs in the same order.
#include "lib/data/data_analysis.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/progress.h"

namespace ds::data {

namespace fs = std::filesystem;

AnalysisSamples epoch_samples(const GptDataset& ds) {
  AnalysisSamples s;
  s.num_samples = ds.samples_per_epoch();
  s.sample_tokens = ds.seq_length() + 1;
  s.get = [&ds](int64_t sample, int32_t* out) { ds.get(sample, out); };
  s.name = ds.name();
  return s;
}

const char* analysis_metric_name(AnalysisMetric m) {
  return m == AnalysisMetric::TotalVocabFreq ? "total_vocab_freq" : "vocab_rarity";
}

AnalysisMetric parse_analysis_metric(std::string_view name) {
  if (name == "total_vocab_freq") return AnalysisMetric::TotalVocabFreq;
  if (name == "vocab_rarity") return AnalysisMetric::VocabRarity;
  if (name == "seqlen" || name == "seqlen_vocab_rarity")
    DS_USER_ERROR("--analyzing-metric {}: GPT data has a fixed sequence length, so there is no {} to analyze "
                  "(as analyze_data.py refuses it); use total_vocab_freq, then vocab_rarity", name, name);
  DS_USER_ERROR("--analyzing-metric: unknown metric '{}' (GPT data: total_vocab_freq, vocab_rarity)", name);
}

std::vector<std::pair<int64_t, int64_t>> split_index(int64_t start, int64_t end, int parts) {
  DS_CHECK(parts >= 1 && end >= start, "split_index({}, {}, {})", start, end, parts);
  const double a = static_cast<double>(start);
  const double step = (static_cast<double>(end) - a) / static_cast<double>(parts);
  std::vector<int64_t> b(static_cast<size_t>(parts) + 1);
  for (int i = 0; i < parts; ++i) {
    volatile double at = static_cast<double>(i) * step;  // rounded on its own, as numpy does (no fused multiply-add)
    b[static_cast<size_t>(i)] = static_cast<int64_t>(at + a);
  }
  b.back() = end;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i + 1 < b.size(); ++i) out.emplace_back(b[i], b[i + 1]);
  return out;
}

TokenDType fit_int_dtype(int64_t lo, int64_t hi) {
  if (lo >= 0) {
    if (hi <= 255) return TokenDType::U8;
    if (hi <= 65535) return TokenDType::U16;
    if (hi <= 4294967295LL) return TokenDType::U32;
    return TokenDType::U64;
  }
  if (hi <= 127 && lo >= -128) return TokenDType::I8;
  if (hi <= 32767 && lo >= -32768) return TokenDType::I16;
  if (hi <= 2147483647LL && lo >= -2147483648LL) return TokenDType::I32;
  return TokenDType::I64;
}

double exact_sum(std::span<const double> x) {
  // Non-overlapping partials, smallest first, whose exact sum is the exact sum
  // of the values seen so far (Shewchuk 1997, "Adaptive precision
  // floating-point arithmetic"); then the partials are added from the largest
  // with a final half-way correction so the result is correctly rounded.
  std::vector<double> p;
  for (double v : x) {
    size_t n = 0;
    for (double q : p) {
      if (std::fabs(v) < std::fabs(q)) std::swap(v, q);
      const double hi = v + q;
      const double lo = q - (hi - v);
      if (lo != 0.0) p[n++] = lo;
      v = hi;
    }
    p.resize(n);
    p.push_back(v);
  }
  if (p.empty()) return 0.0;
  size_t n = p.size();
  double hi = p[--n], lo = 0.0;
  while (n > 0) {
    const double v = hi, q = p[--n];
    hi = v + q;
    lo = q - (hi - v);
    if (lo != 0.0) break;
  }
  // The rest below `lo` decides a tie: round away from hi when it has lo's sign.
  if (n > 0 && ((lo < 0 && p[n - 1] < 0) || (lo > 0 && p[n - 1] > 0))) {
    const double q = lo * 2, v = hi + q;
    if (q == v - hi) hi = v;
  }
  return hi;
}

namespace {

std::string metric_dir(const std::string& save, AnalysisMetric m) {
  return (fs::path(save) / analysis_metric_name(m)).string();
}

std::string part_dir(const std::string& save, AnalysisMetric m, int w, int t) {
  return (fs::path(metric_dir(save, m)) / fmt::format("worker{}_thread{}", w, t)).string();
}

std::string part_file(const std::string& save, AnalysisMetric m, int w, int t, std::string_view what) {
  return (fs::path(part_dir(save, m, w, t)) / fmt::format("{}_{}", analysis_metric_name(m), what)).string();
}

// What a map part covered, written after its results: the reduce checks it
// against the layout it expects.
struct PartRange {
  int64_t samples = 0, begin = 0, end = 0;
  int worker = 0, workers = 0, thread = 0, threads = 0;
  bool operator==(const PartRange&) const = default;
};

std::string range_text(const PartRange& r) {
  return fmt::format("dsprep data analysis map part\nsamples {}\nworker {} of {}\nthread {} of {}\nrange {} {}\n",
                     r.samples, r.worker, r.workers, r.thread, r.threads, r.begin, r.end);
}

std::string describe(const PartRange& r) {
  return fmt::format("samples {}..{} of {}, worker {} of {}, thread {} of {}", r.begin, r.end, r.samples, r.worker,
                     r.workers, r.thread, r.threads);
}

// Every (worker, thread) part in DeepSpeed's order with the range it must cover.
std::vector<PartRange> all_parts(int64_t n, int workers, int threads) {
  std::vector<PartRange> out;
  const auto ws = split_index(0, n, workers);
  for (int w = 0; w < workers; ++w) {
    const auto ts = split_index(ws[static_cast<size_t>(w)].first, ws[static_cast<size_t>(w)].second, threads);
    for (int t = 0; t < threads; ++t)
      out.push_back({n, ts[static_cast<size_t>(t)].first, ts[static_cast<size_t>(t)].second, w, workers, t, threads});
  }
  return out;
}

void check_options(const AnalysisSamples& s, const AnalysisOptions& o) {
  DS_USER_CHECK(!o.metrics.empty(), "--analyzing-metric: give the metrics to analyze (total_vocab_freq, vocab_rarity)");
  for (size_t i = 0; i < o.metrics.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      DS_USER_CHECK(o.metrics[i] != o.metrics[j], "--analyzing-metric: {} is given twice",
                    analysis_metric_name(o.metrics[i]));
  DS_USER_CHECK(!o.save_path.empty(), "--save is required: the directory the analysis writes to");
  DS_USER_CHECK(o.num_workers >= 1, "--analyzing-num-workers must be at least 1, got {}", o.num_workers);
  DS_USER_CHECK(o.worker_id >= 0 && o.worker_id < o.num_workers,
                "--analyzing-worker-id {} is outside 0..{} (--analyzing-num-workers {})", o.worker_id,
                o.num_workers - 1, o.num_workers);
  DS_USER_CHECK(o.num_threads >= 1, "--analyzing-num-threads must be at least 1, got {}", o.num_threads);
  DS_USER_CHECK(o.num_threads_reduce >= 1, "--analyzing-num-threads-reduce must be at least 1, got {}",
                o.num_threads_reduce);
  for (size_t i = 0; i < o.specific_threads.size(); ++i) {
    const int t = o.specific_threads[i];
    DS_USER_CHECK(t >= 0 && t < o.num_threads, "--analyzing-specific-threads: thread {} is outside 0..{} "
                  "(--analyzing-num-threads {})", t, o.num_threads - 1, o.num_threads);
    for (size_t j = 0; j < i; ++j)
      DS_USER_CHECK(o.specific_threads[j] != t, "--analyzing-specific-threads: thread {} is given twice", t);
  }
  DS_USER_CHECK(s.num_samples > 0 && s.sample_tokens > 0, "{} has no samples to analyze", s.name);
}

// Creates DIR (and parents) and checks that files can be made in it.
void make_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    DS_USER_ERROR("--save: cannot create the directory {}: {}", dir,
                  ec ? ec.message() : std::string("a file is in the way"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    DS_USER_ERROR("--save: the directory {} is not writable: {}", dir, std::strerror(errno));
}

void remove_prefix_files(const std::string& prefix) {
  std::error_code ec;
  for (const char* ext : {".bin", ".idx"}) fs::remove(prefix + ext, ec);
}

// The reduce outputs of one metric: written under DIR/.reduce.tmp.<pid>/ and
// renamed into DIR together by commit(); without commit the staging
// directory and everything in it is removed.
class StagedOutputs {
 public:
  explicit StagedOutputs(std::string dir) : dir_(std::move(dir)) {
    staging_ = (fs::path(dir_) / fmt::format(".reduce.tmp.{}", ::getpid())).string();
    std::error_code ec;
    fs::remove_all(staging_, ec);
    fs::create_directories(staging_, ec);
    if (ec) DS_USER_ERROR("--save: cannot create {}: {}", staging_, ec.message());
  }
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;
  ~StagedOutputs() {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
  // The staging prefix for output NAME (DIR/NAME once committed).
  std::string prefix(const std::string& name) {
    names_.push_back(name);
    return (fs::path(staging_) / name).string();
  }
  void commit() {
    for (const std::string& name : names_) {
      const std::string from = (fs::path(staging_) / name).string(), to = (fs::path(dir_) / name).string();
      std::error_code ec;
      fs::remove(to + ".idx", ec);  // never a new .bin under an old .idx
      for (const char* ext : {".bin", ".idx"})
        if (std::rename((from + ext).c_str(), (to + ext).c_str()) != 0)
          DS_USER_ERROR("cannot rename {}{} into place: {}", from, ext, std::strerror(errno));
      DS_LOG("dsprep: wrote {}.bin/.idx", to);
    }
  }

 private:
  std::string dir_, staging_;
  std::vector<std::string> names_;
};

// ---------------------------------------------------------------------------
// map

// -log(freq / sum(freq)) per token id from the reduced total_vocab_freq, zero
// counts taken as 1 (analyze_data.py's vocab_rarity table).
std::vector<double> rarity_table(const std::string& save) {
  const std::string prefix = analysis_output_prefix(save, AnalysisMetric::TotalVocabFreq, "metric_value");
  std::error_code ec;
  DS_USER_CHECK(fs::is_regular_file(prefix + ".bin", ec) && fs::is_regular_file(prefix + ".idx", ec),
                "vocab_rarity needs the reduced total_vocab_freq, but {}.bin/.idx is missing: run the map and "
                "the reduce with --analyzing-metric total_vocab_freq first", prefix);
  const IndexedDataset f = IndexedDataset::open(prefix, DTypeCodes::DeepSpeed);
  DS_USER_CHECK(f.num_sequences() >= 1 && f.sequence_length(0) > 0, "{}.idx holds no token counts", prefix);
  std::vector<int64_t> freq = f.values(0);
  int64_t sum = 0;
  for (int64_t& c : freq) {
    DS_USER_CHECK(c >= 0, "{}.bin holds a negative count {}", prefix, c);
    if (c == 0) c = 1;
    DS_USER_CHECK(!__builtin_add_overflow(sum, c, &sum), "{}.bin: the counts add up past int64", prefix);
  }
  std::vector<double> p(freq.size());
  for (size_t i = 0; i < freq.size(); ++i)
    p[i] = -std::log(static_cast<double>(freq[i]) / static_cast<double>(sum));
  return p;
}

struct MapContext {
  const AnalysisSamples& samples;
  const AnalysisOptions& opt;
  const std::vector<double>* rarity = nullptr;  // vocab_rarity's table, when analyzed
  std::atomic<int64_t> done{0};                 // samples finished, over all threads
};

// One thread's part: every metric over samples [r.begin, r.end), in order.
void map_part(MapContext& c, const PartRange& r) {
  const AnalysisOptions& o = c.opt;
  const std::string& save = o.save_path;
  for (AnalysisMetric m : o.metrics) {  // old results first, the marker before the data
    std::error_code ec;
    fs::remove(part_file(save, m, r.worker, r.thread, "map_range.txt"), ec);
    remove_prefix_files(part_file(save, m, r.worker, r.thread, "sample_to_metric"));
    remove_prefix_files(part_file(save, m, r.worker, r.thread, "metric_value"));
  }
  std::vector<int64_t> freq;
  std::unique_ptr<IndexedDatasetWriter> rarity;
  for (AnalysisMetric m : o.metrics) {
    if (m == AnalysisMetric::TotalVocabFreq) freq.assign(static_cast<size_t>(o.padded_vocab_size) + 1, 0);
    if (m == AnalysisMetric::VocabRarity)
      rarity = std::make_unique<IndexedDatasetWriter>(part_file(save, m, r.worker, r.thread, "sample_to_metric"),
                                                      TokenDType::I64, DTypeCodes::DeepSpeed);
  }
  const auto T1 = static_cast<size_t>(c.samples.sample_tokens);
  std::vector<int32_t> tok(T1);
  std::vector<double> p(T1);
  for (int64_t s = r.begin; s < r.end; ++s) {
    c.samples.get(s, tok.data());
    for (int32_t t : tok)
      if (t < 0 || t >= o.vocab_size)
        DS_USER_ERROR("{}: sample {} holds token id {} but the vocabulary has {} entries: the vocab file does not "
                      "match the dataset", c.samples.name, s, t, o.vocab_size);
    for (int32_t t : tok)
      if (!freq.empty()) freq[static_cast<size_t>(t)] += 1;
    if (rarity) {
      const std::vector<double>& table = *c.rarity;
      for (size_t k = 0; k < T1; ++k) {
        const auto t = static_cast<size_t>(tok[k]);
        DS_USER_CHECK(t < table.size(), "token id {} (sample {}) has no count in total_vocab_freq ({} bins): it "
                      "was made for another vocabulary; redo total_vocab_freq", t, s, table.size());
        p[k] = table[t];
      }
      const int64_t v = static_cast<int64_t>(exact_sum(p));  // Python's int(): toward zero
      rarity->add_sequence(std::span<const int64_t>(&v, 1));
    }
    c.done.fetch_add(1, std::memory_order_relaxed);
  }
  for (AnalysisMetric m : o.metrics) {
    if (m == AnalysisMetric::TotalVocabFreq) {
      IndexedDatasetWriter w(part_file(save, m, r.worker, r.thread, "metric_value"), TokenDType::I64,
                             DTypeCodes::DeepSpeed);
      w.add_sequence(std::span<const int64_t>(freq));
      w.end_document();
      w.finalize();
    } else {
      rarity->end_document();
      rarity->finalize();
    }
  }
  for (AnalysisMetric m : o.metrics)
    write_file_atomic(part_file(save, m, r.worker, r.thread, "map_range.txt"), range_text(r));
}

}  // namespace

std::string analysis_output_prefix(const std::string& save_path, AnalysisMetric m, std::string_view what) {
  return (fs::path(metric_dir(save_path, m)) / fmt::format("{}_{}", analysis_metric_name(m), what)).string();
}

void run_analysis_map(const AnalysisSamples& samples, const AnalysisOptions& opt) {
  check_options(samples, opt);
  std::vector<double> table;
  MapContext c{samples, opt};
  for (AnalysisMetric m : opt.metrics) {
    if (m == AnalysisMetric::VocabRarity) {
      table = rarity_table(opt.save_path);
      c.rarity = &table;
    }
    if (m == AnalysisMetric::TotalVocabFreq)
      DS_CHECK(opt.padded_vocab_size >= opt.vocab_size && opt.vocab_size > 0, "padded vocab {} for vocab {}",
               opt.padded_vocab_size, opt.vocab_size);
  }
  DS_CHECK(opt.vocab_size > 0, "run_analysis_map: vocab_size not set");
  std::vector<int> threads = opt.specific_threads;
  if (threads.empty())
    for (int t = 0; t < opt.num_threads; ++t) threads.push_back(t);
  for (AnalysisMetric m : opt.metrics)
    for (int t : threads) make_writable_dir(part_dir(opt.save_path, m, opt.worker_id, t));

  std::vector<PartRange> parts;
  int64_t total = 0;
  for (const PartRange& r : all_parts(samples.num_samples, opt.num_workers, opt.num_threads))
    if (r.worker == opt.worker_id && std::find(threads.begin(), threads.end(), r.thread) != threads.end()) {
      parts.push_back(r);
      total += r.end - r.begin;
    }
  std::vector<std::exception_ptr> errors(parts.size());
  std::atomic<size_t> finished{0};
  std::vector<std::thread> pool;
  try {
    for (size_t i = 0; i < parts.size(); ++i) {
      DS_LOG("dsprep: worker {} thread {}: samples {} to {}", parts[i].worker, parts[i].thread, parts[i].begin,
             parts[i].end);
      pool.emplace_back([&, i] {
        try {
          map_part(c, parts[i]);  // on an error its writers remove their temporaries
        } catch (...) {
          errors[i] = std::current_exception();
        }
        finished.fetch_add(1);
      });
    }
  } catch (const std::system_error& e) {
    for (std::thread& t : pool) t.join();
    DS_USER_ERROR("cannot start map thread {} of {}: {} (give fewer --analyzing-num-threads)", pool.size() + 1,
                  parts.size(), e.what());
  }
  {
    Progress progress({.label = fmt::format("dsprep: map worker {}", opt.worker_id), .unit = ProgressUnit::Count,
                       .count_name = "samples", .total = total, .quiet_s = 2});
    while (finished.load() < parts.size()) {
      progress.update(c.done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    progress.update(c.done.load());
    progress.finish();
  }
  for (std::thread& t : pool) t.join();
  const auto failed = static_cast<size_t>(std::count_if(errors.begin(), errors.end(), [](auto& e) { return e != nullptr; }));
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const UserError& e) {  // the first failed part's error, saying which part and how many failed
      DS_USER_ERROR("worker {} thread {}{}: {}", parts[i].worker, parts[i].thread,
                    failed > 1 ? fmt::format(" (and {} more of {} threads failed)", failed - 1, parts.size()) : "",
                    e.what());
    }
  }
  DS_LOG("dsprep: map of worker {} done: {} thread(s), {} samples, under {}", opt.worker_id, parts.size(), total,
         opt.save_path);
}

// ---------------------------------------------------------------------------
// reduce

namespace {

// Checks the marker of every map part of metric m (written last by the map)
// against the layout this reduce expects; all missing parts are named.
void check_map_parts(const std::vector<PartRange>& parts, const AnalysisOptions& o, AnalysisMetric m) {
  std::vector<std::string> missing;
  for (const PartRange& r : parts) {
    const std::string marker = part_file(o.save_path, m, r.worker, r.thread, "map_range.txt");
    std::ifstream in(marker);
    if (!in) {
      missing.push_back(fmt::format("worker {} thread {}", r.worker, r.thread));
      continue;
    }
    PartRange got;
    std::string head, key, of;
    std::getline(in, head);
    in >> key >> got.samples >> key >> got.worker >> of >> got.workers >> key >> got.thread >> of >> got.threads >>
        key >> got.begin >> got.end;
    DS_USER_CHECK(in && head == "dsprep data analysis map part", "{} is not a map result marker of dsprep",
                  marker);
    DS_USER_CHECK(got == r, "{}: the map part covers {}, but this reduce expects {}: give the map's "
                  "--data-path/--split/--seq-length/--seed and --analyzing-num-workers/--analyzing-num-threads",
                  marker, describe(got), describe(r));
  }
  if (!missing.empty())
    DS_USER_ERROR("{}: map results of {} of {} parts are missing or unfinished under {} (first: {}): run the map "
                  "for them (--analyzing-worker-id W, --analyzing-specific-threads T)", analysis_metric_name(m),
                  missing.size(), parts.size(), metric_dir(o.save_path, m), missing.front());
}

void reduce_total_vocab_freq(const std::vector<PartRange>& parts, const AnalysisOptions& o) {
  const AnalysisMetric m = AnalysisMetric::TotalVocabFreq;
  std::vector<int64_t> total;
  for (const PartRange& r : parts) {
    const std::string prefix = part_file(o.save_path, m, r.worker, r.thread, "metric_value");
    const IndexedDataset f = IndexedDataset::open(prefix, DTypeCodes::DeepSpeed);
    DS_USER_CHECK(f.num_sequences() == 1, "{}.idx holds {} rows, the map writes one", prefix, f.num_sequences());
    const std::vector<int64_t> v = f.values(0);
    DS_USER_CHECK(!v.empty(), "{}.idx holds no token counts", prefix);
    if (total.empty()) total.assign(v.size(), 0);
    DS_USER_CHECK(v.size() == total.size(), "{} has {} bins but the first part has {}: the map parts were made with "
                  "different vocabularies", prefix, v.size(), total.size());
    for (size_t i = 0; i < v.size(); ++i) total[i] += v[i];
  }
  const auto [lo, hi] = std::minmax_element(total.begin(), total.end());
  const TokenDType dt = fit_int_dtype(*lo, *hi);
  StagedOutputs out(metric_dir(o.save_path, m));
  IndexedDatasetWriter w(out.prefix("total_vocab_freq_metric_value"), dt, DTypeCodes::DeepSpeed);
  w.add_sequence(std::span<const int64_t>(total));
  w.end_document();
  w.finalize();
  DS_LOG("dsprep: total_vocab_freq: {} bins, counts between {} and {}, stored as {}", total.size(), *lo, *hi,
         token_dtype_name(dt));
  out.commit();
}

// DeepSpeed's percentile lines: after the values up to `key` hold at least
// p% of the samples, "Metric M p-th percentile: key", p = 5, 10, ... (one per value).
void log_percentiles(AnalysisMetric m, const std::vector<int64_t>& values, const std::vector<int64_t>& counts,
                     int64_t total) {
  DS_LOG("Checking the value percentiles of metric {}...", analysis_metric_name(m));
  int64_t seen = 0, pct = 5;
  for (size_t v = 0; v < values.size(); ++v) {
    seen += counts[v];
    if (static_cast<double>(seen) >= static_cast<double>(total * pct) / 100.0) {
      DS_LOG("Metric {} {}th percentile: {}", analysis_metric_name(m), pct, values[v]);
      pct += 5;
    }
  }
}

// A per-sample metric gathered from the map parts: the unique values with
// their sample counts, and the sample ids grouped by value (index_to_sample's
// rows back to back, each in sample order).
struct PerSample {
  std::vector<IndexedDataset> files;  // each part's sample_to_metric
  std::vector<int64_t> values;        // unique, ascending
  std::vector<int64_t> counts;        // samples per value
  std::vector<int64_t> row_begin;     // row v of `grouped` is [row_begin[v], row_begin[v + 1])
  std::vector<int64_t> grouped;
  int64_t value(size_t part, int64_t row) const {
    int64_t v = 0;
    files[part].read_values(row, 0, 1, &v);
    return v;
  }
};

PerSample gather_per_sample(const std::vector<PartRange>& parts, const AnalysisOptions& o, AnalysisMetric m,
                            int64_t n) {
  PerSample d;
  std::unordered_map<int64_t, int64_t> count;  // value -> samples, then value -> next free slot in `grouped`
  for (const PartRange& r : parts) {
    const std::string prefix = part_file(o.save_path, m, r.worker, r.thread, "sample_to_metric");
    d.files.push_back(IndexedDataset::open(prefix, DTypeCodes::DeepSpeed));
    const IndexedDataset& f = d.files.back();
    DS_USER_CHECK(f.num_sequences() == r.end - r.begin, "{}.idx holds {} samples, but its part covers {}", prefix,
                  f.num_sequences(), r.end - r.begin);
    for (int64_t i = 0; i < f.num_sequences(); ++i) {
      DS_USER_CHECK(f.sequence_length(i) == 1, "{}.idx: row {} has {} values, the map writes one", prefix, i,
                    f.sequence_length(i));
      count[d.value(d.files.size() - 1, i)] += 1;
    }
  }
  for (const auto& [v, k] : count) d.values.push_back(v);
  std::sort(d.values.begin(), d.values.end());
  d.counts.resize(d.values.size());
  d.row_begin.assign(d.values.size() + 1, 0);
  for (size_t v = 0; v < d.values.size(); ++v) {
    d.counts[v] = count[d.values[v]];
    d.row_begin[v + 1] = d.row_begin[v] + d.counts[v];
    count[d.values[v]] = d.row_begin[v];
  }
  d.grouped.resize(static_cast<size_t>(n));
  for (size_t k = 0; k < parts.size(); ++k)
    for (int64_t i = 0; i < d.files[k].num_sequences(); ++i)
      d.grouped[static_cast<size_t>(count[d.value(k, i)]++)] = parts[k].begin + i;
  return d;
}

// sample_to_metric: the map parts in order, one chunk (document) per reduce thread.
void write_sample_to_metric(const PerSample& d, size_t num_parts, int reduce_threads, const std::string& prefix,
                            TokenDType value_dt) {
  IndexedDatasetWriter w(prefix, value_dt, DTypeCodes::DeepSpeed);
  for (const auto& [a, b] : split_index(0, static_cast<int64_t>(num_parts), reduce_threads)) {
    for (auto k = static_cast<size_t>(a); k < static_cast<size_t>(b); ++k)
      for (int64_t i = 0; i < d.files[k].num_sequences(); ++i) {
        const int64_t v = d.value(k, i);
        w.add_sequence(std::span<const int64_t>(&v, 1));
      }
    w.end_document();
  }
  w.end_document();
  w.finalize();
}

// index_to_sample and index_to_metric: row v for the v-th smallest value, one chunk per reduce thread.
void write_index_files(const PerSample& d, int reduce_threads, const std::string& sample_prefix,
                       const std::string& metric_prefix, TokenDType sample_dt, TokenDType value_dt) {
  IndexedDatasetWriter ws(sample_prefix, sample_dt, DTypeCodes::DeepSpeed);
  IndexedDatasetWriter wm(metric_prefix, value_dt, DTypeCodes::DeepSpeed);
  for (const auto& [a, b] : split_index(0, static_cast<int64_t>(d.values.size()), reduce_threads)) {
    for (auto v = static_cast<size_t>(a); v < static_cast<size_t>(b); ++v) {
      ws.add_sequence(std::span<const int64_t>(d.grouped.data() + d.row_begin[v], static_cast<size_t>(d.counts[v])));
      wm.add_sequence(std::span<const int64_t>(&d.values[v], 1));
    }
    ws.end_document();
    wm.end_document();
  }
  ws.end_document();
  wm.end_document();
  ws.finalize();
  wm.finalize();
}

// index_to_sample_percentile_merged: max(1, U / 100) consecutive rows per item.
void write_percentile_merged(const PerSample& d, const std::string& prefix, TokenDType sample_dt) {
  IndexedDatasetWriter w(prefix, sample_dt, DTypeCodes::DeepSpeed);
  const auto U = d.values.size();
  const size_t step = std::max<size_t>(1, U / 100);
  for (size_t v = 0; v < U; v += step) {
    const size_t e = std::min(U, v + step);
    w.add_sequence(std::span<const int64_t>(d.grouped.data() + d.row_begin[v],
                                            static_cast<size_t>(d.row_begin[e] - d.row_begin[v])));
  }
  w.end_document();
  w.finalize();
}

void reduce_per_sample(const std::vector<PartRange>& parts, const AnalysisOptions& o, AnalysisMetric m, int64_t n) {
  const std::string name = analysis_metric_name(m);
  const TokenDType sample_dt = fit_int_dtype(0, n - 1);
  DS_LOG("dsprep: {}: {} samples, sample ids stored as {}", name, n, token_dtype_name(sample_dt));
  const PerSample d = gather_per_sample(parts, o, m, n);
  const TokenDType value_dt = fit_int_dtype(d.values.front(), d.values.back());
  DS_LOG("dsprep: {}: values between {} and {} ({} distinct), stored as {}", name, d.values.front(), d.values.back(),
         d.values.size(), token_dtype_name(value_dt));
  StagedOutputs out(metric_dir(o.save_path, m));
  write_sample_to_metric(d, parts.size(), o.num_threads_reduce, out.prefix(name + "_sample_to_metric"), value_dt);
  write_index_files(d, o.num_threads_reduce, out.prefix(name + "_index_to_sample"),
                    out.prefix(name + "_index_to_metric"), sample_dt, value_dt);
  write_percentile_merged(d, out.prefix(name + "_index_to_sample_percentile_merged"), sample_dt);
  log_percentiles(m, d.values, d.counts, n);
  out.commit();
}

}  // namespace

void run_analysis_reduce(const AnalysisSamples& samples, const AnalysisOptions& opt) {
  check_options(samples, opt);
  const std::vector<PartRange> parts = all_parts(samples.num_samples, opt.num_workers, opt.num_threads);
  for (AnalysisMetric m : opt.metrics) check_map_parts(parts, opt, m);
  for (AnalysisMetric m : opt.metrics) {
    make_writable_dir(metric_dir(opt.save_path, m));
    if (m == AnalysisMetric::TotalVocabFreq)
      reduce_total_vocab_freq(parts, opt);
    else
      reduce_per_sample(parts, opt, m, samples.num_samples);
  }
}

}  // namespace ds::data
