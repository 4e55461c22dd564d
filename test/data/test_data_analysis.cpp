// DeepSpeed's data analysis (lib/data/data_analysis.h) in process: the
// helpers against numpy's and DeepSpeed's values, and map + reduce over a
// synthetic sample source: what the files hold, what the worker/thread layout
// changes, and that every error is one line and leaves nothing behind.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "lib/core/error.h"
#include "lib/data/data_analysis.h"
#include "lib/data/indexed_dataset.h"
#include "test/data/test_util.h"

using namespace ds;
using namespace ds::data;
namespace fs = std::filesystem;

namespace {

std::vector<int64_t> boundaries(int64_t a, int64_t b, int parts) {
  std::vector<int64_t> out;
  for (const auto& [lo, hi] : split_index(a, b, parts)) out.push_back(lo);
  out.push_back(b);
  return out;
}

std::vector<int64_t> doc_idx(const IndexedDataset& f) { return f.doc_idx().to_vector(); }

// Every file under `dir` whose name contains `needle` (temporaries, outputs).
std::vector<std::string> files_with(const std::string& dir, const std::string& needle) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(needle) != std::string::npos) out.push_back(e.path().string());
  return out;
}

// A deterministic sample source: n samples of t1 tokens, skewed towards small ids.
struct Synthetic {
  int64_t n, t1, vocab;
  std::vector<int32_t> tokens;
  Synthetic(int64_t n_, int64_t t1_, int64_t vocab_) : n(n_), t1(t1_), vocab(vocab_) {
    std::mt19937_64 rng(5);
    tokens.resize(static_cast<size_t>(n * t1));
    for (int32_t& t : tokens) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      t = static_cast<int32_t>(std::min<double>(static_cast<double>(vocab - 1), std::floor(u * u * u * vocab)));
    }
  }
  AnalysisSamples samples() const {
    return {.num_samples = n, .sample_tokens = t1,
            .get = [this](int64_t s, int32_t* out) { std::copy_n(tokens.data() + s * t1, t1, out); },
            .name = "synthetic samples"};
  }
};

AnalysisOptions options(const std::string& save, AnalysisMetric m, int workers, int threads, int reduce) {
  AnalysisOptions o;
  o.metrics = {m};
  o.save_path = save;
  o.num_workers = workers;
  o.num_threads = threads;
  o.num_threads_reduce = reduce;
  o.vocab_size = 50;
  o.padded_vocab_size = 64;
  return o;
}

// Map of every worker, then the reduce, for one metric.
void map_reduce(const AnalysisSamples& s, AnalysisOptions o) {
  for (int w = 0; w < o.num_workers; ++w) {
    o.worker_id = w;
    run_analysis_map(s, o);
  }
  run_analysis_reduce(s, o);
}

void analyze(const AnalysisSamples& s, const std::string& save, int workers, int threads, int reduce) {
  map_reduce(s, options(save, AnalysisMetric::TotalVocabFreq, workers, threads, reduce));
  map_reduce(s, options(save, AnalysisMetric::VocabRarity, workers, threads, reduce));
}

std::string prefix_of(const std::string& save, const char* what) {
  return analysis_output_prefix(save, AnalysisMetric::VocabRarity, what);
}

}  // namespace

TEST_CASE("split_index is numpy's linspace(start, end, parts + 1, dtype=int)") {
  // Values from numpy 1.24; (0, 122, 14) rounds 7 * 122 / 14 = 61 down to 60 as numpy does.
  CHECK(boundaries(0, 10, 3) == std::vector<int64_t>{0, 3, 6, 10});
  CHECK(boundaries(0, 122, 14) ==
        std::vector<int64_t>{0, 8, 17, 26, 34, 43, 52, 60, 69, 78, 87, 95, 104, 113, 122});
  CHECK(boundaries(0, 294, 18) ==
        std::vector<int64_t>{0, 16, 32, 49, 65, 81, 98, 114, 130, 147, 163, 179, 196, 212, 228, 244, 261, 277, 294});
  CHECK(boundaries(5, 7, 4) == std::vector<int64_t>{5, 5, 6, 6, 7});
  CHECK(boundaries(0, 3, 4) == std::vector<int64_t>{0, 0, 1, 2, 3});
  CHECK(boundaries(17, 1000, 9) == std::vector<int64_t>{17, 126, 235, 344, 453, 563, 672, 781, 890, 1000});
  CHECK(boundaries(123456789, 987654321, 7) == std::vector<int64_t>{123456789, 246913579, 370370369, 493827159,
                                                                    617283950, 740740740, 864197530, 987654321});
  CHECK(boundaries(0, 1099511627779, 13) ==
        std::vector<int64_t>{0, 84577817521, 169155635042, 253733452564, 338311270085, 422889087607, 507466905128,
                             592044722650, 676622540171, 761200357693, 845778175214, 930355992736, 1014933810257,
                             1099511627779});
  CHECK(boundaries(4, 4, 3) == std::vector<int64_t>{4, 4, 4, 4});
}

TEST_CASE("fit_int_dtype is DeepSpeed's find_fit_int_dtype") {
  CHECK(fit_int_dtype(0, 255) == TokenDType::U8);
  CHECK(fit_int_dtype(0, 256) == TokenDType::U16);
  CHECK(fit_int_dtype(3, 65535) == TokenDType::U16);
  CHECK(fit_int_dtype(0, 65536) == TokenDType::U32);
  CHECK(fit_int_dtype(0, 4294967295LL) == TokenDType::U32);
  CHECK(fit_int_dtype(0, 4294967296LL) == TokenDType::U64);
  CHECK(fit_int_dtype(-1, 127) == TokenDType::I8);
  CHECK(fit_int_dtype(-129, 0) == TokenDType::I16);
  CHECK(fit_int_dtype(-1, 32768) == TokenDType::I32);
  CHECK(fit_int_dtype(-1, 2147483648LL) == TokenDType::I64);
}

TEST_CASE("exact_sum is the correctly rounded sum (Python's math.fsum)") {
  CHECK(exact_sum(std::vector<double>(10, 0.1)) == 1.0);  // a running sum gives 0.9999999999999999
  CHECK(exact_sum(std::vector<double>{1.0, std::ldexp(1.0, -53)}) == 1.0);  // a tie: to even
  CHECK(exact_sum(std::vector<double>{1.0, std::ldexp(1.0, -53), std::ldexp(1.0, -106)}) ==
        std::nextafter(1.0, 2.0));  // just above the tie
  CHECK(exact_sum(std::vector<double>{1e100, 1.0, -1e100, 1e-100, 1e50, -1.0, -1e50}) == 1e-100);
  CHECK(exact_sum(std::vector<double>{9007199254740992.0, 1.0, std::ldexp(1.0, -60)}) == 9007199254740994.0);
  CHECK(exact_sum(std::vector<double>{1.0, 1e-16, 1e-16, 1e-16, 1e-16}) == 1.0000000000000004);
  CHECK(exact_sum(std::vector<double>{}) == 0.0);
  // Independent of the order, as a rarity sum of 2049 -log(p) values must be.
  std::mt19937_64 rng(3);
  std::vector<double> x(2049);
  for (double& v : x) v = -std::log(std::uniform_real_distribution<double>(1e-9, 1)(rng));
  const double want = exact_sum(x);
  for (int k = 0; k < 5; ++k) {
    std::shuffle(x.begin(), x.end(), rng);
    CHECK(exact_sum(x) == want);
  }
}

TEST_CASE("analysis metric names; seqlen metrics are refused for GPT data") {
  CHECK(parse_analysis_metric("total_vocab_freq") == AnalysisMetric::TotalVocabFreq);
  CHECK(parse_analysis_metric("vocab_rarity") == AnalysisMetric::VocabRarity);
  CHECK_THAT(test::error_of([] { parse_analysis_metric("seqlen"); }),
             Catch::Contains("GPT data has a fixed sequence length"));
  CHECK_THAT(test::error_of([] { parse_analysis_metric("seqlen_vocab_rarity"); }),
             Catch::Contains("seqlen_vocab_rarity"));
  CHECK_THAT(test::error_of([] { parse_analysis_metric("rarity"); }), Catch::Contains("unknown metric 'rarity'"));
}

TEST_CASE("map and reduce: what the five files hold") {
  test::TempDir dir;
  const Synthetic data(333, 9, 50);
  const AnalysisSamples s = data.samples();
  analyze(s, dir.path(), 2, 3, 3);

  std::vector<int64_t> want_freq(65, 0);
  for (int32_t t : data.tokens) want_freq[static_cast<size_t>(t)] += 1;
  const IndexedDataset freq = IndexedDataset::open(
      analysis_output_prefix(dir.path(), AnalysisMetric::TotalVocabFreq, "metric_value"), DTypeCodes::DeepSpeed);
  CHECK(freq.num_sequences() == 1);
  CHECK(freq.dtype() == fit_int_dtype(0, *std::max_element(want_freq.begin(), want_freq.end())));
  CHECK(freq.values(0) == want_freq);
  CHECK(doc_idx(freq) == std::vector<int64_t>{0, 1});

  // vocab_rarity: int(exact sum of -log(f / sum f)), zero counts taken as 1.
  std::vector<double> p(65);
  const int64_t sum = std::accumulate(want_freq.begin(), want_freq.end(), int64_t{0},
                                      [](int64_t a, int64_t f) { return a + std::max<int64_t>(f, 1); });
  for (size_t i = 0; i < p.size(); ++i) p[i] = -std::log(static_cast<double>(std::max<int64_t>(want_freq[i], 1)) / sum);
  std::vector<int64_t> rarity(333);
  for (int64_t i = 0; i < 333; ++i) {
    std::vector<double> x;
    for (int64_t k = 0; k < 9; ++k) x.push_back(p[static_cast<size_t>(data.tokens[static_cast<size_t>(i * 9 + k)])]);
    rarity[static_cast<size_t>(i)] = static_cast<int64_t>(exact_sum(x));
  }
  const IndexedDataset s2m = IndexedDataset::open(prefix_of(dir.path(), "sample_to_metric"), DTypeCodes::DeepSpeed);
  REQUIRE(s2m.num_sequences() == 333);
  for (int64_t i = 0; i < 333; ++i) CHECK(s2m.values(i) == std::vector<int64_t>{rarity[static_cast<size_t>(i)]});
  // 6 map parts in 3 reduce chunks of 2 parts: the running counts at each chunk end.
  const auto parts = boundaries(0, 333, 2);  // workers, then 3 threads each
  const auto w0 = boundaries(parts[0], parts[1], 3), w1 = boundaries(parts[1], parts[2], 3);
  CHECK(doc_idx(s2m) == std::vector<int64_t>{0, w0[2], w1[1], 333, 333});

  std::vector<int64_t> values(rarity);
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const auto U = static_cast<int64_t>(values.size());
  const IndexedDataset i2m = IndexedDataset::open(prefix_of(dir.path(), "index_to_metric"), DTypeCodes::DeepSpeed);
  const IndexedDataset i2s = IndexedDataset::open(prefix_of(dir.path(), "index_to_sample"), DTypeCodes::DeepSpeed);
  REQUIRE(i2m.num_sequences() == U);
  REQUIRE(i2s.num_sequences() == U);
  CHECK(i2s.dtype() == TokenDType::U16);  // sample ids 0..332
  CHECK(i2m.dtype() == fit_int_dtype(values.front(), values.back()));
  const auto chunks = boundaries(0, U, 3);
  CHECK(doc_idx(i2s) == std::vector<int64_t>{0, chunks[1], chunks[2], U, U});
  CHECK(doc_idx(i2m) == doc_idx(i2s));
  std::vector<int64_t> all;
  for (int64_t v = 0; v < U; ++v) {
    CHECK(i2m.values(v) == std::vector<int64_t>{values[static_cast<size_t>(v)]});
    const std::vector<int64_t> ids = i2s.values(v);
    CHECK(std::is_sorted(ids.begin(), ids.end()));
    for (int64_t id : ids) CHECK(rarity[static_cast<size_t>(id)] == values[static_cast<size_t>(v)]);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  CHECK(static_cast<int64_t>(all.size()) == 333);
  const IndexedDataset merged =
      IndexedDataset::open(prefix_of(dir.path(), "index_to_sample_percentile_merged"), DTypeCodes::DeepSpeed);
  const int64_t step = std::max<int64_t>(1, U / 100);
  CHECK(merged.num_sequences() == (U + step - 1) / step);
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < merged.num_sequences(); ++i) {
    const auto row = merged.values(i);
    flat.insert(flat.end(), row.begin(), row.end());
  }
  CHECK(flat == all);
  CHECK(doc_idx(merged) == std::vector<int64_t>{0, merged.num_sequences()});
  CHECK(files_with(dir.path(), ".tmp").empty());
}

TEST_CASE("with one reduce chunk the worker/thread layout does not change the outputs") {
  test::TempDir a, b;
  const Synthetic data(257, 5, 50);
  analyze(data.samples(), a.path(), 1, 1, 1);
  analyze(data.samples(), b.path(), 3, 4, 1);
  for (const char* what : {"sample_to_metric", "index_to_sample", "index_to_metric", "index_to_sample_percentile_merged"})
    for (const char* ext : {".bin", ".idx"}) {
      INFO(what << ext);
      CHECK(test::slurp(prefix_of(a.path(), what) + ext) == test::slurp(prefix_of(b.path(), what) + ext));
    }
  const std::string freq = analysis_output_prefix(a.path(), AnalysisMetric::TotalVocabFreq, "metric_value");
  CHECK(test::slurp(freq + ".idx") ==
        test::slurp(analysis_output_prefix(b.path(), AnalysisMetric::TotalVocabFreq, "metric_value") + ".idx"));
  // More reduce chunks than values or parts (DeepSpeed's merge stops on an empty first chunk): the
  // same values, with the running counts of the empty chunks repeated in the document index.
  test::TempDir c;
  analyze(data.samples(), c.path(), 1, 2, 40);
  for (const char* what : {"index_to_sample", "index_to_metric"})
    CHECK(test::slurp(prefix_of(c.path(), what) + ".bin") == test::slurp(prefix_of(a.path(), what) + ".bin"));
  const auto di = doc_idx(IndexedDataset::open(prefix_of(c.path(), "sample_to_metric"), DTypeCodes::DeepSpeed));
  CHECK(di.size() == 42);
  CHECK(di[1] == 0);
  CHECK(di.back() == 257);
}

TEST_CASE("analysis errors: one line, nothing left behind") {
  test::TempDir dir;
  const Synthetic data(100, 7, 50);
  const AnalysisSamples s = data.samples();
  const std::string save = dir.path();
  auto one_line = [](const std::string& e) {
    INFO(e);
    CHECK(!e.empty());
    CHECK(e.find('\n') == std::string::npos);
    return e;
  };
  // vocab_rarity before total_vocab_freq: nothing is created.
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_map(s, options(save, AnalysisMetric::VocabRarity, 1, 2, 1)); })),
             Catch::Contains("vocab_rarity needs the reduced total_vocab_freq"));
  CHECK(!fs::exists(save + "/vocab_rarity"));
  // Reduce without the map, then with one part missing.
  auto o = options(save, AnalysisMetric::TotalVocabFreq, 2, 2, 1);
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_reduce(s, o); })),
             Catch::Contains("map results of 4 of 4 parts are missing or unfinished"));
  run_analysis_map(s, o);  // worker 0 only
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_reduce(s, o); })),
             Catch::Contains("map results of 2 of 4 parts are missing or unfinished") && Catch::Contains("first: worker 1 thread 0"));
  CHECK(!fs::exists(analysis_output_prefix(save, AnalysisMetric::TotalVocabFreq, "metric_value") + ".bin"));
  // A reduce with another layout than the map's.
  o.worker_id = 1;
  run_analysis_map(s, o);
  auto other = o;
  other.num_workers = 1;
  other.num_threads = 4;
  other.worker_id = 0;
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_reduce(s, other); })),
             Catch::Contains("worker 0 of 2, thread 0 of 2, but this reduce expects") && Catch::Contains("worker 0 of 1, thread 0 of 4"));
  auto fewer = o;
  fewer.num_threads = 1;
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_reduce(s, fewer); })),
             Catch::Contains("the map part covers samples 0..25 of 100, worker 0 of 2, thread 0 of 2, but this "
                             "reduce expects samples 0..50 of 100, worker 0 of 2, thread 0 of 1"));
  // A thread that fails (worker 1's thread 0 holds samples 50..74): its results are gone, the other
  // thread's are made, the error is the one it threw, naming the part; no temporaries.
  AnalysisSamples broken = s;
  broken.get = [&](int64_t i, int32_t* out) {
    if (i == 70) DS_USER_ERROR("sample {} cannot be read", i);
    s.get(i, out);
  };
  fs::remove(save + "/total_vocab_freq/worker1_thread1/total_vocab_freq_map_range.txt");
  CHECK(one_line(test::error_of([&] { run_analysis_map(broken, o); })) == "worker 1 thread 0: sample 70 cannot be read");
  CHECK(!fs::exists(save + "/total_vocab_freq/worker1_thread0/total_vocab_freq_map_range.txt"));
  CHECK(!fs::exists(save + "/total_vocab_freq/worker1_thread0/total_vocab_freq_metric_value.bin"));
  CHECK(fs::exists(save + "/total_vocab_freq/worker1_thread1/total_vocab_freq_map_range.txt"));
  CHECK(files_with(save, ".tmp").empty());
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_reduce(s, o); })),
             Catch::Contains("map results of 1 of 4 parts are missing") && Catch::Contains("first: worker 1 thread 0"));
  // Redo the failed thread alone, then the reduce works.
  o.specific_threads = {0};
  run_analysis_map(s, o);
  run_analysis_reduce(s, o);
  CHECK(fs::exists(analysis_output_prefix(save, AnalysisMetric::TotalVocabFreq, "metric_value") + ".idx"));
  // Tokens outside the vocabulary.
  auto small = options(save, AnalysisMetric::TotalVocabFreq, 1, 1, 1);
  small.vocab_size = 10;
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_map(s, small); })),
             Catch::Contains("synthetic samples: sample 0 holds token id") && Catch::Contains("the vocabulary has 10 entries"));
  // Option checks name the flag.
  auto bad = o;
  bad.worker_id = 2;
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_map(s, bad); })),
             Catch::Contains("--analyzing-worker-id 2 is outside 0..1"));
  bad = o;
  bad.specific_threads = {2};
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_map(s, bad); })),
             Catch::Contains("--analyzing-specific-threads: thread 2 is outside 0..1"));
  // A save path that cannot be made.
  test::spit(dir / "file", "x");
  CHECK_THAT(one_line(test::error_of([&] { run_analysis_map(s, options(dir / "file/sub", AnalysisMetric::TotalVocabFreq, 1, 1, 1)); })),
             Catch::Contains("--save: cannot create the directory"));
  CHECK(files_with(save, ".tmp").empty());
}
