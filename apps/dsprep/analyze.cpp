// dsprep --analyzing-task map|reduce: analyze_data.py's flags, the train
// dataset dstrain would build for them, and the call into lib/data's analysis.
#include "apps/dsprep/analyze.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "lib/core/error.h"
#include "lib/core/padded_vocab.h"
#include "lib/data/blended_dataset.h"
#include "lib/data/data_analysis.h"
#include "lib/data/indexed_dataset.h"

namespace ds::prep {

namespace {

constexpr const char* kGroup = "Data analysis (DeepSpeed Data Efficiency, analyze_data.py's flags)";
constexpr const char* kNoEffect = "Data analysis: accepted, no effect";

std::vector<std::string>& flag_names() {
  static std::vector<std::string> names;
  return names;
}

template <typename T>
CLI::Option* add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  flag_names().push_back(flag);
  return app.add_option(flag, value, help)->group(kGroup);
}

data::AnalysisOptions analysis_options(const AnalyzeArgs& a) {
  data::AnalysisOptions o;
  for (const std::string& m : a.metrics) o.metrics.push_back(data::parse_analysis_metric(m));
  o.save_path = a.save;
  o.num_workers = a.num_workers;
  o.worker_id = a.worker_id;
  o.num_threads = a.num_threads;
  o.specific_threads = a.specific_threads;
  o.num_threads_reduce = a.num_threads_reduce;
  return o;
}

// The flags the analysis needs, checked before any file is opened.
void check_args(const AnalyzeArgs& a, int64_t seq_length) {
  DS_USER_CHECK(a.data_type == "GPT", "--analyzing-data-type {}: dsprep analyzes GPT data only (give "
                "--analyzing-data-type GPT)", a.data_type.empty() ? std::string("missing") : a.data_type);
  DS_USER_CHECK(a.exact_num_epochs == -1 || a.exact_num_epochs == 1,
                "--train-data-exact-num-epochs {}: only 1 is supported. dsprep analyzes one epoch of the train "
                "split, dstrain's sample ids 0..N-1; Megatron's {}-epoch index numbers samples across epochs in an "
                "order dstrain's epoch-by-epoch sampling does not have, and the data sampler starts the one-epoch "
                "index over when an epoch ends", a.exact_num_epochs, a.exact_num_epochs);
  DS_USER_CHECK(!a.data_path.empty(), "--data-path is required: the dataset prefix (PREFIX.bin/.idx) to analyze");
  DS_USER_CHECK(seq_length > 0, "--seq-length is required for the data analysis (samples are seq_length + 1 "
                "tokens, as in training)");
  DS_USER_CHECK(!a.save.empty(), "--save is required: the directory the analysis writes to");
  DS_USER_CHECK(a.make_vocab_size_divisible_by > 0, "--make-vocab-size-divisible-by must be positive, got {}",
                a.make_vocab_size_divisible_by);
}

// The one --data-path prefix (a blend is refused: its sample ids mix datasets).
std::string data_prefix(const AnalyzeArgs& a) {
  const data::BlendSpec b = data::parse_blend(a.data_path, "--data-path");
  DS_USER_CHECK(b.prefixes.size() == 1, "--data-path: dsprep analyzes one dataset prefix, got a blend of {}; "
                "analyze and train on one prefix", b.prefixes.size());
  return b.prefixes.front();
}

int64_t vocab_size(const data::TokenizerSpec& spec) {
  if (spec.kind == data::TokenizerKind::GPT2BPE)
    DS_USER_CHECK(!spec.vocab_file.empty() && !spec.merge_file.empty(),
                  "--vocab-file and --merge-file are required for the map: the vocabulary size sets "
                  "total_vocab_freq's bins and bounds the token ids");
  else
    DS_USER_CHECK(!spec.model_path.empty(), "--tokenizer-type {} needs --tokenizer-model for the map",
                  data::tokenizer_kind_name(spec.kind));
  return data::tokenizer_info(spec).vocab_size;
}

}  // namespace

void add_analysis_options(CLI::App& app, AnalyzeArgs& a) {
  flag_names().clear();
  add(app, "--analyzing-task", a.task, "Run DeepSpeed's data analysis: map (this worker's share), then reduce")
      ->check(CLI::IsMember({"map", "reduce"}));
  add(app, "--analyzing-data-type", a.data_type, "GPT (BERT is not supported)")
      ->check(CLI::IsMember({"GPT", "BERT"}));
  add(app, "--analyzing-metric", a.metrics, "total_vocab_freq, then vocab_rarity (needs total_vocab_freq reduced)")
      ->expected(1, -1);
  add(app, "--analyzing-num-workers", a.num_workers, "Workers (nodes) the map is shared among");
  add(app, "--analyzing-worker-id", a.worker_id, "This worker, 0-based (map)");
  add(app, "--analyzing-num-threads", a.num_threads, "Parts per worker, each mapped on its own thread");
  add(app, "--analyzing-specific-threads", a.specific_threads, "Map only these parts (to redo failed ones)")
      ->expected(1, -1);
  add(app, "--analyzing-num-threads-reduce", a.num_threads_reduce,
      "Chunks of the reduce's merged files (their document index, as DeepSpeed's reduce threads)");
  add(app, "--data-path", a.data_path, "Dataset prefix (PREFIX.bin/.idx; one, not a blend)")->expected(1, -1);
  add(app, "--data-impl", a.data_impl, "mmap or infer (the .bin/.idx format)")->check(CLI::IsMember({"mmap", "infer"}));
  add(app, "--split", a.split, "Train/valid/test split; the train part is analyzed (default 949,50,1 as dstrain)");
  add(app, "--save", a.save, "Directory of the analysis results (Megatron's --save)");
  add(app, "--make-vocab-size-divisible-by", a.make_vocab_size_divisible_by,
      "Vocabulary padding: total_vocab_freq has padded size + 1 bins (default 128)");
  add(app, "--train-data-exact-num-epochs", a.exact_num_epochs, "Epochs of the train dataset: only 1");
  add(app, "--train-doc-idx-path", a.maps.doc_idx,
      "Megatron's index maps (all three, as dstrain's flags): analyze their samples; missing ones are written "
      "from the split's first epoch");
  add(app, "--train-sample-idx-path", a.maps.sample_idx, "See --train-doc-idx-path");
  add(app, "--train-shuffle-idx-path", a.maps.shuffle_idx, "See --train-doc-idx-path");
  add(app, "--micro-batch-size", a.micro_batch_size, kNoEffect);
  add(app, "--global-batch-size", a.global_batch_size, kNoEffect);
  add(app, "--max-position-embeddings", a.max_position_embeddings, kNoEffect);
  add(app, "--num-layers", a.num_layers, kNoEffect);
  add(app, "--hidden-size", a.hidden_size, kNoEffect);
  add(app, "--num-attention-heads", a.num_attention_heads, kNoEffect);
  add(app, "--save-interval", a.save_interval, kNoEffect);
  add(app, "--distributed-backend", a.distributed_backend, kNoEffect)
      ->check(CLI::IsMember({"nccl", "gloo", "ccl", "hccl"}));
  flag_names().push_back("--return-data-index");
  app.add_flag("--return-data-index", a.return_data_index,
               "Data analysis: accepted, no effect (sample ids are always the dataset's indices)")
      ->group(kGroup);
}

const std::vector<std::string>& analysis_flag_names() { return flag_names(); }

int run_analysis(const AnalyzeArgs& a, const data::TokenizerSpec& tokenizer, int64_t seq_length, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  check_args(a, seq_length);
  data::AnalysisOptions opt = analysis_options(a);
  const std::string prefix = data_prefix(a);
  if (a.task == "map") {
    opt.vocab_size = vocab_size(tokenizer);
    opt.padded_vocab_size = padded_vocab(static_cast<int>(opt.vocab_size), a.make_vocab_size_divisible_by, 1);
  }
  const data::IndexedDataset file = data::IndexedDataset::open(prefix);
  const int maps = !a.maps.doc_idx.empty() + !a.maps.sample_idx.empty() + !a.maps.shuffle_idx.empty();
  DS_USER_CHECK(maps == 0 || maps == 3, "--train-doc-idx-path, --train-sample-idx-path and --train-shuffle-idx-path "
                "go together (Megatron's three index maps): give all three or none");
  // With index maps the samples are theirs (dstrain reads the same files);
  // missing ones are written from the split's first epoch, as dstrain does.
  const bool from_maps = maps == 3 && data::index_maps_exist(a.maps, /*partial_is_error=*/true);
  const data::GptDataset train = from_maps ? data::GptDataset::from_index_maps(file, a.maps, seq_length,
                                                                               "train split of '" + prefix + "'")
                                           : data::train_split_dataset(file, prefix, a.split, seq_length, seed);
  if (maps == 3 && !from_maps && train.samples_per_epoch() > 0) {
    train.write_index_maps(a.maps);
    std::printf("dsprep: wrote the %s's first epoch as Megatron's index maps %s, %s, %s\n", train.name().c_str(),
                a.maps.doc_idx.c_str(), a.maps.sample_idx.c_str(), a.maps.shuffle_idx.c_str());
  }
  DS_USER_CHECK(train.samples_per_epoch() > 0,
                "dataset '{}': the {} ({} documents, {} tokens) is smaller than one sample of {} tokens", prefix,
                train.name(), train.range().size(), train.num_tokens(), seq_length + 1);
  const data::AnalysisSamples samples = data::epoch_samples(train);
  if (a.task == "map")
    data::run_analysis_map(samples, opt);
  else
    data::run_analysis_reduce(samples, opt);
  std::printf("dsprep: %s finished in %.1f s: the %s, %lld samples of %lld tokens (--split %s, --seed %llu)%s\n",
              a.task.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              train.name().c_str(), static_cast<long long>(samples.num_samples),
              static_cast<long long>(samples.sample_tokens), a.split.c_str(), static_cast<unsigned long long>(seed),
              a.task == "map" ? fmt::format(", vocabulary {} padded to {}", opt.vocab_size,
                                            opt.padded_vocab_size).c_str() : "");
  return 0;
}

}  // namespace ds::prep
