// Sample ids of dsprep's data analysis mean the same samples in dstrain: the
// analysis's sample s (epoch 0 of train_split_dataset) is the sample dstrain's
// DataPipeline hands out as training sample s, for a --split, --seq-length and
// --seed other than the defaults; and dsprep's default --split is dstrain's.
#include <catch2/catch.hpp>

#include <random>

#include "lib/config/config.h"
#include "lib/data/data_analysis.h"
#include "lib/data/gpt_dataset.h"
#include "lib/train/data_pipeline.h"
#include "test/data/test_util.h"

using namespace ds;

TEST_CASE("the analysis numbers samples as dstrain's data pipeline does") {
  test::TempDir dir;
  const std::string vocab = dir / "vocab.json", merges = dir / "merges.txt", prefix = dir / "corpus";
  test::write_byte_vocab(vocab, merges, 300);
  {
    data::IndexedDatasetWriter w(prefix, data::TokenDType::U16);
    std::mt19937_64 rng(2);
    for (int d = 0; d < 80; ++d) {
      std::vector<int32_t> doc(1 + rng() % 90);
      for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 300);
      w.add_document(doc);
    }
    w.finalize();
  }
  std::vector<std::string> args = {"dstrain", "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
                                   "--seq-length", "24", "--max-position-embeddings", "24", "--micro-batch-size", "1",
                                   "--global-batch-size", "1", "--train-iters", "1", "--data-path", prefix,
                                   "--vocab-file", vocab, "--merge-file", merges, "--split", "80,15,5", "--seed", "77"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TrainConfig cfg = parse_train_config(static_cast<int>(argv.size()), argv.data(), 1);
  resolve_vocab(cfg);
  DataPipeline pipe(cfg, Device::cpu());

  const data::IndexedDataset file = data::IndexedDataset::open(prefix);
  const data::GptDataset train = data::train_split_dataset(file, prefix, "80,15,5", 24, 77);
  const data::AnalysisSamples samples = data::epoch_samples(train);
  REQUIRE(samples.num_samples == pipe.train_samples_per_epoch());
  REQUIRE(samples.num_samples > 20);
  std::vector<int32_t> ours(25);
  for (int64_t s = 0; s < samples.num_samples; ++s) {
    samples.get(s, ours.data());
    const MicroBatch mb = pipe.train_batch(s, 0, 0, 1);
    std::vector<int32_t> theirs(mb.tokens.data<int32_t>(), mb.tokens.data<int32_t>() + 24);
    theirs.push_back(mb.targets.data<int32_t>()[23]);
    INFO("sample " << s);
    REQUIRE(theirs == ours);
  }
  CHECK(TrainConfig{}.data.split == data::kDefaultSplit);
  CHECK(TrainConfig{}.seed == 1234);
}
