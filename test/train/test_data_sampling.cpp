// DeepSpeed Data Efficiency's curriculum learning by data sampling in the
// trainer (--data-efficiency-curriculum-learning): the config section's
// parsing, round trip and refusals; a step trains on the samples the sampler
// draws (curriculum_sampler_ref.py checks that order against DeepSpeed's),
// truncated to the seqlen_truncate difficulty (or re-cut into rows of it by
// seqlen_reshape), with consumed tokens following it; a run resumed
// mid-curriculum continues bit for bit (the stream replays); Megatron's index
// maps are written when missing and read back.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lib/core/error.h"
#include "lib/train/curriculum_sampler.h"
#include "lib/train/data_pipeline.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
namespace fs = std::filesystem;

namespace {

// A DeepSpeed config whose data_efficiency section holds `metrics` (and
// `extra` top-level keys).
std::string sampling_config(const std::string& name, const std::string& metrics, const std::string& extra = "",
                            bool enabled = true) {
  const fs::path p = fixture().dir / (name + ".json");
  std::ofstream(p) << "{" << extra << (extra.empty() ? "" : ", ")
                   << R"("data_efficiency": {"enabled": true, "seed": 1234, "data_sampling": {"enabled": true,
                        "num_workers": 0, "curriculum_learning": {"enabled": )"
                   << (enabled ? "true" : "false") << R"(, "data_cluster_path": ")"
                   << (fixture().dir / "clusters").string() << R"(", "curriculum_metrics": )" << metrics
                   << "}}}}";
  return p.string();
}

const char* kSeqlen = R"({"seqlen_truncate": {"index_to_sample_path": "dummy", "index_to_metric_path": "dummy",
  "difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32,
  "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}})";

std::string parse_error(std::vector<std::string> extra) {
  try {
    make_config(std::move(extra));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the data_sampling section parses, round-trips and refuses bad values") {
  const std::string voc = R"({"voc": {"index_to_sample_path": "/a/voc_index_to_sample_percentile_merged",
    "index_to_metric_path": "/a/voc_index_to_metric", "difficulty_type": "percentile",
    "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 100, "schedule_type": "fixed_root",
    "schedule_config": {"total_curriculum_step": 110, "difficulty_step": 1, "root_degree": 2}},
    "seqlen_truncate": {"index_to_sample_path": "dummy", "index_to_metric_path": "dummy", "difficulty_type": "value",
    "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 110, "difficulty_step": 8, "root_degree": 1}}})";
  const std::string path = sampling_config("ds_pair", voc, R"("dataloader_drop_last": true)");
  TrainConfig cfg = make_config({"--deepspeed_config", path, "--data-efficiency-curriculum-learning"});
  const DataSamplingConfig& ds = cfg.data_sampling;
  REQUIRE(ds.active());
  CHECK(ds.drop_last);
  CHECK(ds.num_epochs == 1000);  // DeepSpeed's default
  REQUIRE(ds.metrics.size() == 2);
  const CurriculumMetricConfig& s = *ds.seqlen_metric();
  CHECK(s.single_cluster);
  CHECK(s.index_to_sample_path.empty());  // "dummy" is not read for a single cluster
  const CurriculumMetricConfig& v = ds.metrics[&s == &ds.metrics[0] ? 1 : 0];
  CHECK(v.name == "voc");
  CHECK(v.difficulty == CurriculumDifficulty::Percentile);
  CHECK_FALSE(v.single_cluster);
  CHECK(v.index_to_sample_path == "/a/voc_index_to_sample_percentile_merged");
  CHECK(v.index_to_metric_path.empty());  // read upstream only for value-based metrics
  CHECK(v.schedule.schedule == CurriculumSchedule::FixedRoot);
  CHECK(v.schedule.root_degree == 2);
  CHECK_FALSE(v.schedule.floor_at_min);
  // The resolved config (what a checkpoint saves) reads back to the same settings.
  const nlohmann::json resolved = config_to_json(cfg);
  const TrainConfig again = train_config_from_json(resolved, 1);
  CHECK(config_to_json(again).at("data_efficiency") == resolved.at("data_efficiency"));
  CHECK(again.data_sampling.active());
  CHECK(resolved.at("dataloader_drop_last") == true);

  // The section without the flag is inert; the flag without the section is refused.
  CHECK_FALSE(make_config({"--deepspeed_config", path}).data_sampling.active());
  const std::string off = sampling_config("ds_off", kSeqlen, "", false);
  CHECK_THAT(parse_error({"--deepspeed_config", off, "--data-efficiency-curriculum-learning"}),
             Catch::Contains("needs data_efficiency.data_sampling.curriculum_learning.enabled"));
  auto refused = [&](const std::string& metrics, const std::string& what, std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"--deepspeed_config", sampling_config("ds_bad", metrics),
                                  "--data-efficiency-curriculum-learning"};
    a.insert(a.end(), more.begin(), more.end());
    const std::string e = parse_error(a);
    INFO(e);
    CHECK_THAT(e, Catch::Contains(what));
  };
  refused(R"({"voc": {"clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 100,
    "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 1}}})",
          "difficulty_type' is required");
  refused(R"({"voc": {"difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 1,
    "max_difficulty": 100, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 1}}})", "index_to_sample_path' is required");
  refused(R"({"voc": {"difficulty_type": "rank", "clustering_type": "single_cluster", "min_difficulty": 1,
    "max_difficulty": 100, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 1}}})", "expected value or percentile");
  refused(R"({"seqlen_truncate": {"difficulty_type": "value", "clustering_type": "single_cluster",
    "min_difficulty": 4, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}})", "reaches sequence length 0");
  refused(R"({"seqlen_truncate": {"difficulty_type": "value", "clustering_type": "single_cluster",
    "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "custom", "schedule_config": {}}})",
          "custom schedule");
  refused(kSeqlen, "--rampup-batch-size",
          {"--rampup-batch-size", "4", "4", "16", "--train-samples", "64", "--lr-warmup-iters", "0"});
  {  // pipeline parallelism (a world of 2)
    std::vector<std::string> a = {"dstrain", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                                  "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "4",
                                  "--global-batch-size", "8", "--train-iters", "2", "--pipeline-model-parallel-size",
                                  "2", "--deepspeed_config", sampling_config("ds_pp", kSeqlen),
                                  "--data-efficiency-curriculum-learning", "--data-path", "/nonexistent/d"};
    std::vector<char*> argv;
    for (auto& x : a) argv.push_back(x.data());
    std::string e;
    try {
      parse_train_config(static_cast<int>(argv.size()), argv.data(), 2);
    } catch (const UserError& u) {
      e = u.what();
    }
    CHECK_THAT(e, Catch::Contains("pipeline parallelism"));
  }
  // Megatron's index maps: all three or none; BERT's is refused.
  CHECK_THAT(parse_error({"--train-doc-idx-path", "/x/doc.npy"}), Catch::Contains("go together"));
  CHECK_THAT(parse_error({"--train-idx-path", "/x/idx.npy"}), Catch::Contains("BERT"));
}

TEST_CASE("a data-sampling step trains on the sampler's samples, cut to the seqlen_truncate difficulty") {
  const std::string path = sampling_config("ds_first", kSeqlen, R"("dataloader_drop_last": true)");
  const std::vector<std::string> args = {"--deepspeed_config", path, "--data-efficiency-curriculum-learning",
                                         "--train-iters", "1", "--lr-warmup-iters", "0", "--hidden-dropout", "0",
                                         "--attention-dropout", "0", "--eval-iters", "0"};
  TrainConfig cfg = make_config(args);
  Trainer t(cfg, single_process());
  resolve_vocab(cfg);
  DataPipeline data(cfg, Device::cpu());
  // The sampler on its own: step 1 draws 8 samples (two micro-batches of 4), difficulty 8.
  const int64_t n = data.train_samples_per_epoch();
  std::vector<std::unique_ptr<MetricIndex>> none;
  none.push_back(nullptr);
  CurriculumSampler sampler(cfg.data_sampling, {.one_epoch_samples = n, .global_batch = 8, .chunk = 4, .drop_last = true},
                            std::move(none));
  CHECK(data.curriculum_seqlen(0, 0, 1) == 8);
  CHECK(data.curriculum_seqlen(0, 1, 1) == 8);
  double want = 0;
  bool reordered = false;
  for (int micro = 0; micro < 2; ++micro) {
    const CurriculumSampler::Chunk c = sampler.chunk(micro);
    REQUIRE(c.difficulties == std::vector<int64_t>{8});
    MicroBatch mb = data.train_batch(0, micro, 0, 1, 8);
    REQUIRE(mb.tokens.size(1) == 8);
    for (int64_t b = 0; b < 4; ++b) {
      CHECK(c.samples[b] < n);
      reordered = reordered || c.samples[b] != micro * 4 + b;
    }
    want += t.model().forward_loss(mb.tokens, mb.targets) / 2;
  }
  CHECK(reordered);  // not the plain order
  // The samples themselves: chunk 0's first sample is that dataset sample's first 8 tokens.
  {
    const CurriculumSampler::Chunk c = sampler.chunk(0);
    MicroBatch mb = data.train_batch(0, 0, 0, 1, 8);
    // Sample c.samples[0] itself: a plain pipeline with one-sample batches reads dataset sample s as the
    // batch that starts at s (epoch 0).
    TrainConfig one = make_config(
        {"--train-iters", "1", "--micro-batch-size", "1", "--global-batch-size", "1", "--lr-warmup-iters", "0"});
    resolve_vocab(one);
    DataPipeline p1(one, Device::cpu());
    MicroBatch ref = p1.train_batch(c.samples[0], 0, 0, 1, 8);
    for (int64_t i = 0; i < 8; ++i) {
      REQUIRE(mb.tokens.data<int32_t>()[i] == ref.tokens.data<int32_t>()[i]);
      REQUIRE(mb.targets.data<int32_t>()[i] == ref.targets.data<int32_t>()[i]);
    }
  }
  const std::vector<float> got = t.run();
  REQUIRE(got.size() == 1);
  INFO("step 1: " << got[0] << ", forward over the sampler's samples " << want);
  CHECK(std::abs(got[0] - want) <= 1e-6 * std::abs(want));
  CHECK(t.state().consumed_tokens == 8 * 8);
}

TEST_CASE("a run resumed mid-curriculum continues the sample stream bit for bit") {
  const std::string path = sampling_config("ds_resume", kSeqlen);
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), {"--deepspeed_config", path, "--data-efficiency-curriculum-learning"});
    return a;
  };
  const auto [full, tokens] = require_resume_equal(with({}), (fixture().dir / "ckpt_data_sampling").string());
  // Lengths 8, 16, 16, 24, 24, 32, 32, 32 (fixed_linear over 6 steps in multiples of 8).
  CHECK(tokens == 8 * (8 + 16 + 16 + 24 + 24 + 32 + 32 + 32));
  // The usual order gives another first step.
  const std::vector<float> plain = train({"--train-iters", "1", "--lr-warmup-iters", "0"});
  CHECK(plain[0] != full[0]);
}

TEST_CASE("Megatron's index maps: written from dstrain's order when missing, the same samples when read back") {
  const fs::path dir = fixture().dir / "maps";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> maps = {"--train-doc-idx-path", (dir / "doc_idx.npy").string(),
                                         "--train-sample-idx-path", (dir / "sample_idx.npy").string(),
                                         "--train-shuffle-idx-path", (dir / "shuffle_idx.npy").string()};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), maps.begin(), maps.end());
    return a;
  };
  const std::vector<std::string> base = {"--train-iters", "4", "--lr-warmup-iters", "0", "--eval-iters", "0"};
  const std::vector<float> plain = train(base);
  const std::vector<float> written = train(with(base));  // the files do not exist: written, same order
  CHECK(written == plain);
  REQUIRE(fs::exists(dir / "doc_idx.npy"));
  REQUIRE(fs::exists(dir / "sample_idx.npy"));
  REQUIRE(fs::exists(dir / "shuffle_idx.npy"));
  const std::vector<float> read = train(with(base));  // now read from the files
  CHECK(read == plain);
  // Past the first epoch the maps' samples repeat in order, read or computed alike.
  TrainConfig cfg = make_config(with(base));
  resolve_vocab(cfg);
  DataPipeline p(cfg, Device::cpu());
  const int64_t n = p.train_samples_per_epoch();
  MicroBatch a = p.train_batch(8, 0, 0, 1), b = p.train_batch(n + 8, 0, 0, 1);
  CHECK(std::equal(a.tokens.data<int32_t>(), a.tokens.data<int32_t>() + a.tokens.numel(), b.tokens.data<int32_t>()));
  // With the data-sampling curriculum the sample ids index the maps.
  const std::string path = sampling_config("ds_maps", kSeqlen);
  const std::vector<std::string> cl = {"--deepspeed_config", path, "--data-efficiency-curriculum-learning"};
  std::vector<std::string> a1 = base, a2 = with(base);
  a1.insert(a1.end(), cl.begin(), cl.end());
  a2.insert(a2.end(), cl.begin(), cl.end());
  CHECK(train(a1) == train(a2));
  // A partial set is refused with one line naming each file.
  fs::remove(dir / "shuffle_idx.npy");
  std::string e;
  try {
    train(with(base));
  } catch (const UserError& u) {
    e = u.what();
  }
  CHECK_THAT(e, Catch::Contains("shuffle_idx.npy (missing)") && Catch::Contains("doc_idx.npy (exists)"));
}

TEST_CASE("seqlen_reshape re-cuts each micro-batch into rows of the curriculum length, as data_post_process") {
  const std::string path = sampling_config("ds_reshape", R"({"seqlen_reshape": {"difficulty_type": "value",
    "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}})");
  const std::vector<std::string> args = {"--deepspeed_config", path, "--data-efficiency-curriculum-learning",
                                         "--train-iters", "1", "--lr-warmup-iters", "0", "--hidden-dropout", "0",
                                         "--attention-dropout", "0", "--eval-iters", "0"};
  TrainConfig cfg = make_config(args);
  REQUIRE(cfg.data_sampling.reshapes());
  Trainer t(cfg, single_process());
  resolve_vocab(cfg);
  DataPipeline data(cfg, Device::cpu());
  std::vector<std::unique_ptr<MetricIndex>> none;
  none.push_back(nullptr);
  CurriculumSampler sampler(cfg.data_sampling,
                            {.one_epoch_samples = data.train_samples_per_epoch(), .global_batch = 8, .chunk = 4,
                             .drop_last = false},
                            std::move(none));
  TrainConfig one = make_config(
      {"--train-iters", "1", "--micro-batch-size", "1", "--global-batch-size", "1", "--lr-warmup-iters", "0"});
  resolve_vocab(one);
  DataPipeline p1(one, Device::cpu());
  // Step 1 at length 8: 4 samples of 33 tokens give 3 pieces of 9 each and their last 9 tokens, 16 rows, of
  // which ceil(4 x 33 / 9) = 15 are kept, made even: 14.
  CHECK(seqlen_reshape_rows(4, 32, 8) == 14);
  CHECK(seqlen_reshape_rows(4, 32, 32) == 4);
  CHECK(seqlen_reshape_rows(4, 32, 16) == 8);  // 2 pieces of 17 and the tails: 12 rows, ceil(132 / 17) = 8
  CHECK(seqlen_reshape_rows(1, 32, 24) == 2);  // 1 piece and the tail: ceil(33 / 25) = 2
  double want = 0;
  for (int micro = 0; micro < 2; ++micro) {
    const CurriculumSampler::Chunk c = sampler.chunk(micro);
    // The pieces as torch's view(-1, 9) of the first 27 tokens, then each sample's last 9, the first 14 kept.
    std::vector<std::vector<int32_t>> rows, tails;
    for (int64_t b = 0; b < 4; ++b) {
      MicroBatch s = p1.train_batch(c.samples[b], 0, 0, 1);
      std::vector<int32_t> all(s.tokens.data<int32_t>(), s.tokens.data<int32_t>() + 32);
      all.push_back(s.targets.data<int32_t>()[31]);
      for (int j = 0; j < 3; ++j) rows.emplace_back(all.begin() + 9 * j, all.begin() + 9 * (j + 1));
      tails.emplace_back(all.end() - 9, all.end());
    }
    rows.insert(rows.end(), tails.begin(), tails.end());
    rows.resize(14);
    MicroBatch mb = data.train_batch(0, micro, 0, 1, 8);
    REQUIRE(mb.tokens.size(0) == 14);
    REQUIRE(mb.tokens.size(1) == 8);
    CHECK(mb.loss_weight_scale == Approx(4.0 / 14));
    for (int64_t r = 0; r < 14; ++r)
      for (int64_t i = 0; i < 8; ++i) {
        REQUIRE(mb.tokens.data<int32_t>()[r * 8 + i] == rows[r][i]);
        REQUIRE(mb.targets.data<int32_t>()[r * 8 + i] == rows[r][i + 1]);
      }
    want += t.model().forward_loss(mb.tokens, mb.targets) / 2;  // each micro-batch's mean, averaged
  }
  const std::vector<float> got = t.run();
  REQUIRE(got.size() == 1);
  INFO("step 1: " << got[0] << ", the micro-batches' mean losses over their rows " << want);
  CHECK(std::abs(got[0] - want) <= 1e-6 * std::abs(want));
  CHECK(t.state().consumed_tokens == 2 * 14 * 8);  // Megatron-DeepSpeed: micro-batches x rows x length
  CHECK(t.state().consumed_samples == 8);
}
