// Strict reading of the `autotuning` section (DeepSpeed's keys and defaults).
#include "launcher/autotune/autotune_config.h"

#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds::launch::autotune {
namespace {

template <class T>
std::vector<T> list_of(JsonSection& s, const std::string& key) {
  if (!s.has(key)) {
    s.mark(key);
    return {};
  }
  const nlohmann::json& v = s.raw().at(key);
  DS_USER_CHECK(v.is_array() && !v.empty(), "config: '{}' must be a non-empty list, got {}", s.full(key), v.dump());
  nlohmann::json wrap = nlohmann::json::object();
  std::vector<T> out;
  for (size_t i = 0; i < v.size(); ++i) {
    wrap[std::to_string(i)] = v[i];
  }
  JsonSection items(wrap, s.full(key));
  for (size_t i = 0; i < v.size(); ++i) out.push_back(items.get<T>(std::to_string(i), T{}));
  s.mark(key);
  return out;
}

TuningSpace read_space(JsonSection s) {
  TuningSpace t;
  DS_USER_CHECK(s.raw().is_object(), "config: 'autotuning.tuning_space' must be an object, got {}", s.raw().dump());
  t.zero_stage = list_of<int>(s, "zero_stage");
  for (int z : t.zero_stage)
    DS_USER_CHECK(z >= 0 && z <= 3, "config: 'autotuning.tuning_space.zero_stage' holds {}; stages are 0-3", z);
  t.micro_batch_size = list_of<int>(s, "micro_batch_size");
  t.tp = list_of<int>(s, "tensor_model_parallel_size");
  t.pp = list_of<int>(s, "pipeline_model_parallel_size");
  t.virtual_stages = list_of<int>(s, "virtual_pipeline_stages");
  for (const auto* v : {&t.micro_batch_size, &t.tp, &t.pp, &t.virtual_stages})
    for (int x : *v) DS_USER_CHECK(x >= 1, "config: 'autotuning.tuning_space' sizes must be >= 1, got {}", x);
  t.offload_optimizer = list_of<bool>(s, "offload_optimizer");
  t.sequence_parallel = list_of<bool>(s, "sequence_parallel");
  t.recompute = list_of<std::string>(s, "recompute_granularity");
  for (std::string& r : t.recompute) {
    if (r == "none") r = "";
    DS_USER_CHECK(r.empty() || r == "selective" || r == "full",
                  "config: 'autotuning.tuning_space.recompute_granularity' holds '{}'; use \"none\", \"selective\" "
                  "or \"full\"", r);
  }
  s.finish(UnknownKeys::Error);
  return t;
}

}  // namespace

AutotuneConfig parse_autotune_config(const nlohmann::json& config) {
  DS_USER_CHECK(config.is_object(), "config: the DeepSpeed config must be a JSON object");
  DS_USER_CHECK(config.contains("autotuning") && config.at("autotuning").is_object(),
                "config: dsrun --autotuning needs an 'autotuning' section (an object) in the DeepSpeed config");
  JsonSection s(config.at("autotuning"), "autotuning");
  AutotuneConfig c;
  c.enabled = s.get<bool>("enabled", c.enabled);
  DS_USER_CHECK(c.enabled, "config: dsrun --autotuning needs 'autotuning.enabled': true in the DeepSpeed config");
  c.fast = s.get<bool>("fast", c.fast);
  const std::string metric = s.get<std::string>("metric", "throughput");
  if (metric == "throughput") c.metric = Metric::Throughput;
  else if (metric == "latency") c.metric = Metric::Latency;
  else if (metric == "flops") c.metric = Metric::Flops;
  else DS_USER_ERROR("config: 'autotuning.metric' is '{}'; use throughput, latency or flops", metric);
  c.start_profile_step = s.get<int64_t>("start_profile_step", c.start_profile_step);
  c.end_profile_step = s.get<int64_t>("end_profile_step", c.end_profile_step);
  DS_USER_CHECK(c.start_profile_step >= 0 && c.end_profile_step > c.start_profile_step,
                "config: 'autotuning.end_profile_step' {} must be larger than 'autotuning.start_profile_step' {} (>= 0)",
                c.end_profile_step, c.start_profile_step);
  const std::string tuner = s.get<std::string>("tuner_type", "gridsearch");
  if (tuner == "gridsearch") c.tuner = TunerType::Grid;
  else if (tuner == "random") c.tuner = TunerType::Random;
  else if (tuner == "model_based") c.tuner = TunerType::ModelBased;
  else DS_USER_ERROR("config: 'autotuning.tuner_type' is '{}'; use gridsearch, random or model_based", tuner);
  c.tuner_early_stopping = s.get<int>("tuner_early_stopping", c.tuner_early_stopping);
  c.tuner_num_trials = s.get<int>("tuner_num_trials", c.tuner_num_trials);
  DS_USER_CHECK(c.tuner_early_stopping >= 0, "config: 'autotuning.tuner_early_stopping' must be >= 0, got {}",
                c.tuner_early_stopping);
  DS_USER_CHECK(c.tuner_num_trials >= 1, "config: 'autotuning.tuner_num_trials' must be >= 1, got {}",
                c.tuner_num_trials);
  if (s.has("max_train_batch_size")) c.max_train_batch_size = s.get<int64_t>("max_train_batch_size", 0);
  else s.mark("max_train_batch_size");
  c.min_train_batch_size = s.get<int64_t>("min_train_batch_size", c.min_train_batch_size);
  c.max_micro_batch = s.get<int>("max_train_micro_batch_size_per_gpu", c.max_micro_batch);
  c.min_micro_batch = s.get<int>("min_train_micro_batch_size_per_gpu", c.min_micro_batch);
  c.num_tuning_micro_batch_sizes = s.get<int>("num_tuning_micro_batch_sizes", c.num_tuning_micro_batch_sizes);
  DS_USER_CHECK(c.min_micro_batch >= 1 && c.max_micro_batch >= c.min_micro_batch,
                "config: 'autotuning.min_train_micro_batch_size_per_gpu' {} and 'max_train_micro_batch_size_per_gpu' "
                "{} must satisfy 1 <= min <= max", c.min_micro_batch, c.max_micro_batch);
  DS_USER_CHECK(c.min_train_batch_size >= 1 && (!c.max_train_batch_size || *c.max_train_batch_size >= c.min_train_batch_size),
                "config: 'autotuning.min_train_batch_size' {} and 'max_train_batch_size' must satisfy 1 <= min <= max",
                c.min_train_batch_size);
  DS_USER_CHECK(c.num_tuning_micro_batch_sizes >= 1, "config: 'autotuning.num_tuning_micro_batch_sizes' must be >= 1");
  c.results_dir = s.get<std::string>("results_dir", c.results_dir);
  c.exps_dir = s.get<std::string>("exps_dir", c.exps_dir);
  DS_USER_CHECK(!c.results_dir.empty() && !c.exps_dir.empty(),
                "config: 'autotuning.results_dir' and 'autotuning.exps_dir' must not be empty");
  c.overwrite = s.get<bool>("overwrite", c.overwrite);
  if (s.has("arg_mappings")) {
    const nlohmann::json& m = s.raw().at("arg_mappings");
    DS_USER_CHECK(m.is_object(), "config: 'autotuning.arg_mappings' must map config keys to flags, got {}", m.dump());
    for (auto it = m.begin(); it != m.end(); ++it) {
      DS_USER_CHECK(it.value().is_string() && it.value().get<std::string>().rfind("-", 0) == 0,
                    "config: 'autotuning.arg_mappings.{}' must be a flag such as \"--micro-batch-size\", got {}",
                    it.key(), it.value().dump());
      c.arg_mappings[it.key()] = it.value().get<std::string>();
    }
  }
  s.mark("arg_mappings");
  c.mp_size = s.get<int>("mp_size", c.mp_size);
  DS_USER_CHECK(c.mp_size >= 1, "config: 'autotuning.mp_size' must be >= 1, got {}", c.mp_size);
  s.mark("metric_path");
  s.mark("model_info");
  s.mark("model_info_path");
  c.memory_per_process_gb = s.get<double>("memory_per_process_gb", c.memory_per_process_gb);
  c.memory_overhead_gb = s.get<double>("memory_overhead_gb", c.memory_overhead_gb);
  c.experiment_timeout_s = s.get<double>("experiment_timeout_s", c.experiment_timeout_s);
  DS_USER_CHECK(c.memory_per_process_gb >= 0, "config: 'autotuning.memory_per_process_gb' must be >= 0");
  DS_USER_CHECK(c.experiment_timeout_s > 0, "config: 'autotuning.experiment_timeout_s' must be > 0");
  c.seed = s.get<uint64_t>("seed", c.seed);
  c.space = read_space(s.section("tuning_space"));
  s.finish(UnknownKeys::Error);
  return c;
}

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::Throughput: return "throughput";
    case Metric::Latency: return "latency";
    case Metric::Flops: return "flops";
  }
  return "?";
}

const char* tuner_name(TunerType t) {
  switch (t) {
    case TunerType::Grid: return "gridsearch";
    case TunerType::Random: return "random";
    case TunerType::ModelBased: return "model_based";
  }
  return "?";
}

}  // namespace ds::launch::autotune
