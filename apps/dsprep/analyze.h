// dsprep's data analysis mode: Megatron-DeepSpeed's analyze_data.py command
// line (DeepSpeed Data Efficiency's map and reduce over the one-epoch GPT
// train dataset), so that ds_analyze_gpt_data_map.sh / _reduce.sh run with
// `python ../analyze_data.py` replaced by `dsprep`. The analysis itself is
// lib/data/data_analysis.h; this file turns the flags into its inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/data/gpt_dataset.h"
#include "lib/data/tokenizer.h"

namespace CLI {
class App;
}

namespace ds::prep {

struct AnalyzeArgs {
  std::string task;       // --analyzing-task map | reduce; empty: not the analysis
  std::string data_type;  // --analyzing-data-type: GPT (BERT is refused)
  std::vector<std::string> metrics;
  int num_workers = 1, worker_id = 0, num_threads = 1, num_threads_reduce = 1;
  std::vector<int> specific_threads;
  std::vector<std::string> data_path;
  std::string data_impl = "infer", split = data::kDefaultSplit, save;
  int make_vocab_size_divisible_by = 128;
  int64_t exact_num_epochs = -1;  // --train-data-exact-num-epochs; -1: not given (one epoch)
  // Megatron's --train-{doc,sample,shuffle}-idx-path: the samples of those
  // index maps when they exist, else the split's first epoch, written there.
  data::IndexMapPaths maps;
  // Megatron flags the scripts pass that do not change the analysis.
  int64_t micro_batch_size = 0, global_batch_size = 0, max_position_embeddings = 0, num_layers = 0,
          hidden_size = 0, num_attention_heads = 0, save_interval = 0;
  std::string distributed_backend;
  bool return_data_index = false;
};

// Adds the analysis flags (--seq-length, --seed and the tokenizer flags are
// dsprep's shared ones).
void add_analysis_options(CLI::App& app, AnalyzeArgs& a);
// The flags add_analysis_options adds: given without --analyzing-task they are an error.
const std::vector<std::string>& analysis_flag_names();

// Runs the map or the reduce. The tokenizer is loaded for the map only (its
// vocabulary size gives total_vocab_freq's bins and bounds the token ids).
int run_analysis(const AnalyzeArgs& a, const data::TokenizerSpec& tokenizer, int64_t seq_length, uint64_t seed);

}  // namespace ds::prep
