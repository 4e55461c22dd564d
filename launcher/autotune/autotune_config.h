// The `autotuning` section of a DeepSpeed config as dsrun's autotuner reads it
// (DeepSpeed's keys and defaults, plus our own for the memory limit, the
// experiment timeout and the search space), and the search space it implies.
// Pure: parsing and validation only. See docs/autotuning.md.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::launch::autotune {

enum class Metric { Throughput, Latency, Flops };
enum class TunerType { Grid, Random, ModelBased };

// Explicit values for each dimension of the search space (empty: derived,
// see default_space in search_space.h). Recompute values: "" (none),
// "selective", "full".
struct TuningSpace {
  std::vector<int> zero_stage, micro_batch_size, tp, pp, virtual_stages;
  std::vector<bool> offload_optimizer, sequence_parallel;
  std::vector<std::string> recompute;
};

struct AutotuneConfig {
  bool enabled = false;
  bool fast = true;
  Metric metric = Metric::Throughput;
  int64_t start_profile_step = 3, end_profile_step = 5;
  TunerType tuner = TunerType::Grid;
  int tuner_early_stopping = 5, tuner_num_trials = 50;
  std::optional<int64_t> max_train_batch_size;
  int64_t min_train_batch_size = 1;
  int max_micro_batch = 1024, min_micro_batch = 1, num_tuning_micro_batch_sizes = 3;
  std::string results_dir = "autotuning_results", exps_dir = "autotuning_exps";
  bool overwrite = true;
  std::map<std::string, std::string> arg_mappings;  // ds_config key -> program flag
  int mp_size = 1;
  // Ours.
  double memory_per_process_gb = 0;    // 0: detected (host: MemAvailable / ranks per node)
  double memory_overhead_gb = -1;      // < 0: the measured default for the device
  double experiment_timeout_s = 600;
  uint64_t seed = 1234;                // random and model-based tuners
  TuningSpace space;
};

// Reads config["autotuning"]. Unknown keys and wrong types are UserErrors
// naming the key (DeepSpeed's metric_path, model_info and model_info_path are
// accepted: dsrun sets the metric file itself and needs no model profile).
AutotuneConfig parse_autotune_config(const nlohmann::json& config);

const char* metric_name(Metric m);  // "throughput" | "latency" | "flops"
const char* tuner_name(TunerType t);  // "gridsearch" | "random" | "model_based"

}  // namespace ds::launch::autotune
