// dsprep's data analysis mode end to end: the flags of Megatron-DeepSpeed's
// ds_analyze_gpt_data_map.sh / _reduce.sh with `python ../analyze_data.py`
// replaced by dsprep, map and reduce of both GPT metrics; and every user error
// is one line, exit 1, with nothing written under --save.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <random>
#include <sstream>

#include "lib/data/data_analysis.h"
#include "lib/data/indexed_dataset.h"
#include "test/data/test_util.h"

using namespace ds;
using namespace ds::data;
namespace fs = std::filesystem;

namespace {

struct Run {
  int code = -1;
  std::string output;  // stdout and stderr together
};

Run dsprep(const std::string& args) {
  const char* bin = std::getenv("DS_BINARY_DIR");
  const std::string cmd = std::string(bin ? bin : ".") + "/apps/dsprep/dsprep " + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// A 300-token vocabulary and a dataset of 60 documents of random tokens below 300.
struct Inputs {
  test::TempDir dir;
  std::string vocab = dir / "vocab.json", merges = dir / "merges.txt", data = dir / "data/corpus";
  Inputs() {
    test::write_byte_vocab(vocab, merges, 300);
    IndexedDatasetWriter w(data, TokenDType::U16);
    std::mt19937_64 rng(11);
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> doc(1 + rng() % 200);
      for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 2 ? rng() % 300 : rng() % 5);  // skewed
      w.add_document(doc);
    }
    w.finalize();
  }
  // The scripts' options (their values scaled down) for task/metric; a flag in
  // `extra` replaces the script's value of that flag or is added.
  std::string args(const std::string& task, const std::string& metric, const std::string& save,
                   const std::string& extra = "") const {
    std::vector<std::pair<std::string, std::string>> flags = {
        {"--analyzing-task", task}, {"--analyzing-data-type", "GPT"}, {"--analyzing-metric", metric},
        {"--analyzing-num-workers", "1"}, {"--analyzing-num-threads", "3"}, {"--vocab-file", vocab},
        {"--merge-file", merges}, {"--data-path", data}, {"--data-impl", "mmap"},
        {"--tokenizer-type", "GPT2BPETokenizer"}, {"--micro-batch-size", "10"}, {"--global-batch-size", "10"},
        {"--seq-length", "16"}, {"--max-position-embeddings", "16"}, {"--num-layers", "1"}, {"--hidden-size", "1"},
        {"--num-attention-heads", "1"}, {"--split", "949,50,1"}, {"--distributed-backend", "gloo"},
        {"--train-data-exact-num-epochs", "1"}, {"--return-data-index", ""}, {"--save-interval", "1"},
        {"--save", save}};
    std::istringstream in(extra);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
      for (size_t i = 0; i < words.size(); ++i) {
      const std::string flag = words[i];
      std::string value;
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) value += (value.empty() ? "" : " ") + words[++i];
      const auto at = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == flag; });
      if (at != flags.end())
        at->second = value;
      else
        flags.emplace_back(flag, value);
    }
    std::string out;
    for (const auto& [flag, value] : flags) out += " " + flag + (value.empty() ? "" : " " + value);
    return out;
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

// The run failed with exit 1 and one error line containing `needle`.
void expect_error(const Run& r, const std::string& needle) {
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("dsprep: error: ") == 0);
  CHECK(r.output.find('\n') == r.output.size() - 1);
  CHECK_THAT(r.output, Catch::Contains(needle));
}

bool empty_or_absent(const std::string& dir) { return !fs::exists(dir) || fs::is_empty(dir); }

}  // namespace

TEST_CASE("dsprep runs the map and reduce scripts' command lines") {
  const Inputs& in = inputs();
  const std::string save = in.dir / "analysis";
  Run r = dsprep(in.args("map", "total_vocab_freq", save, "--analyzing-worker-id 0"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("vocabulary 300 padded to 384"));
  CHECK_THAT(r.output, Catch::Contains("worker 0 thread 2: samples"));
  r = dsprep(in.args("reduce", "total_vocab_freq", save, "--analyzing-num-threads-reduce 2"));
  REQUIRE(r.code == 0);
  const IndexedDataset freq = IndexedDataset::open(save + "/total_vocab_freq/total_vocab_freq_metric_value",
                                                   DTypeCodes::DeepSpeed);
  CHECK(freq.sequence_length(0) == 385);
  r = dsprep(in.args("map", "vocab_rarity", save, "--analyzing-worker-id 0"));
  REQUIRE(r.code == 0);
  r = dsprep(in.args("reduce", "vocab_rarity", save, "--analyzing-num-threads-reduce 2"));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("Checking the value percentiles of metric vocab_rarity..."));
  CHECK_THAT(r.output, Catch::Contains("Metric vocab_rarity 5th percentile: "));
  CHECK_THAT(r.output, Catch::Contains("Metric vocab_rarity 100th percentile: "));
  for (const char* what : {"sample_to_metric", "index_to_sample", "index_to_metric", "index_to_sample_percentile_merged"}) {
    const IndexedDataset f =
        IndexedDataset::open(analysis_output_prefix(save, AnalysisMetric::VocabRarity, what), DTypeCodes::DeepSpeed);
    CHECK(f.num_sequences() > 0);
  }
  // No flag without effect changes anything: another batch size, backend and model shape.
  const std::string again = in.dir / "again";
  for (const char* m : {"total_vocab_freq", "vocab_rarity"}) {
    REQUIRE(dsprep(in.args("map", m, again, "--analyzing-worker-id 0 --global-batch-size 3 --micro-batch-size 1 "
                                             "--distributed-backend nccl --num-layers 24 --hidden-size 1024")).code == 0);
    REQUIRE(dsprep(in.args("reduce", m, again, "--analyzing-num-threads-reduce 2")).code == 0);
  }
  for (const char* what : {"sample_to_metric", "index_to_sample"})
    CHECK(test::slurp(analysis_output_prefix(save, AnalysisMetric::VocabRarity, what) + ".bin") ==
          test::slurp(analysis_output_prefix(again, AnalysisMetric::VocabRarity, what) + ".bin"));
  // --help names the flags that change nothing.
  r = dsprep("--help");
  CHECK_THAT(r.output, Catch::Contains("--global-batch-size"));
  CHECK_THAT(r.output, Catch::Contains("Data analysis: accepted, no effect"));
}

TEST_CASE("dsprep analysis errors: one line, exit 1, nothing written") {
  const Inputs& in = inputs();
  const std::string save = in.dir / "errors";
  expect_error(dsprep(in.args("map", "vocab_rarity", save, "--analyzing-worker-id 0")),
               "vocab_rarity needs the reduced total_vocab_freq");
  expect_error(dsprep(in.args("reduce", "total_vocab_freq", save)),
               "map results of 3 of 3 parts are missing or unfinished");
  expect_error(dsprep(in.args("map", "seqlen", save)), "GPT data has a fixed sequence length");
  expect_error(dsprep(in.args("map", "rarity", save)), "unknown metric 'rarity'");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--train-data-exact-num-epochs 2")),
               "--train-data-exact-num-epochs 2: only 1 is supported");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--analyzing-worker-id 1")),
               "--analyzing-worker-id 1 is outside 0..0");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--data-path 0.5 " + in.data + " 0.5 " + in.data)),
               "got a blend of 2");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--analyzing-data-type BERT")),
               "dsprep analyzes GPT data only");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--seq-length 100000")),
               "is smaller than one sample of 100001 tokens");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--data-path " + in.dir / "nothing")),
               "nothing.idx not found");
  CHECK(empty_or_absent(save));
  test::spit(in.dir / "a_file", "x");
  expect_error(dsprep(in.args("map", "total_vocab_freq", in.dir / "a_file/sub")), "--save: cannot create the directory");
  // Flags of one mode in the other.
  expect_error(dsprep("--data-path " + in.data + " --input x.txt --output-prefix y"),
               "--data-path belongs to the data analysis: give --analyzing-task map|reduce");
  expect_error(dsprep(in.args("map", "total_vocab_freq", save, "--input x.txt")),
               "--input does not go with --analyzing-task");
  expect_error(dsprep("--analyzing-task map --analyzing-data-type GPT --analyzing-metric total_vocab_freq --data-path " +
                      in.data + " --seq-length 16 --save " + save),
               "--vocab-file and --merge-file are required for the map");
  CHECK(empty_or_absent(save));
}
