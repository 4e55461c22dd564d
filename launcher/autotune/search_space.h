// The autotuner's search space: one Point per candidate configuration (ZeRO
// stage and optimizer offload, micro batch with gradient accumulation holding
// the global batch, tensor/pipeline/virtual-pipeline sizes, recomputation,
// sequence parallelism), how a Point becomes an experiment's ds_config.json
// and PROGRAM arguments, and a FLOP/communication cost model's features.
// Pure; see docs/autotuning.md.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/autotune/autotune_config.h"

namespace ds::launch::autotune {

// What dstrain's estimator says about the model and the user's own settings
// (the JSON of DS_AUTOTUNING_ESTIMATE_PATH; lib/train/autotune_hooks.h).
struct ModelFacts {
  std::string device = "cpu";
  int world = 1;
  int64_t n_params = 0;
  int num_layers = 1, hidden = 1, heads = 1, seq = 1;
  double flops_per_token = 0;
  // The user's configuration as dstrain resolved it.
  int tp = 1, pp = 1, zero_stage = 0, mbs = 1, gas = 1, vp_layers = 0;
  int64_t tbs = 1;
  bool offload = false, sp = false;
  std::string recompute;
  // The configured row of the memory estimate.
  int64_t device_bytes = 0, host_bytes = 0;
};
ModelFacts model_facts_from_json(const nlohmann::json& j);

struct Point {
  int zero_stage = 0;
  bool offload = false;
  int mbs = 1, gas = 1;
  int64_t tbs = 1;
  int tp = 1, pp = 1;
  int vp = 1;              // virtual pipeline stages per rank (1: plain 1F1B)
  std::string recompute;   // "" (none) | "selective" | "full"
  bool sp = false;
  int dp(int world) const { return world / (tp * pp); }
  std::string name() const;  // e.g. z1_mbs4_gas2_tp1_pp1_vp1_rcnone_sp0_off0
  nlohmann::json to_json() const;
  bool operator==(const Point& o) const { return name() == o.name(); }
};

// How the global batch is set: fixed (train_batch_size or --global-batch-size
// given), or free ("auto"/absent: micro x gas x DP within the min/max bounds).
struct BatchRule {
  bool tbs_fixed = false;
  int64_t tbs = 0;  // when fixed
  int gas = 1;      // when free: the config's gradient_accumulation_steps, else 1
};

// The user's configuration as a Point (the "default" the best is compared with).
Point default_point(const ModelFacts& f, const BatchRule& b);

// What make_space() made of the tuning space: the candidates it produced
// (before removing those equal to the default or to each other) and the
// combinations it dropped, counted by reason.
struct SpaceReport {
  int candidates = 0;
  std::map<std::string, int> dropped;
  std::string dropped_text() const;  // "reason: N; reason: M" ("none" when empty)
};

// Every candidate, the default first, then in grid order (ZeRO stage outermost,
// then offload, TP, PP, virtual stages, recompute, SP, micro batch). mbs_upper
// bounds derived micro-batch sizes (the largest the memory estimate allows; 0: none).
std::vector<Point> make_space(const AutotuneConfig& c, const ModelFacts& f, const BatchRule& b, int mbs_upper,
                              SpaceReport* report = nullptr);

// The experiment's ds_config.json: the user's config without `autotuning`,
// with the point's batch triple, ZeRO stage/offload and `parallel` keys.
nlohmann::json experiment_config(const nlohmann::json& user, const Point& p, int num_layers);

// PROGRAM's arguments for an experiment: the config flag's value replaced by
// `config_path`, the Megatron flags a point sets removed (the config holds
// them), then each arg_mappings flag set to the point's value of its key.
// A missing --config/--deepspeed_config is a UserError.
std::vector<std::string> experiment_args(const std::vector<std::string>& args, const std::string& config_path,
                                         const Point& p, const std::map<std::string, std::string>& arg_mappings);
// The value of PROGRAM's --config/--deepspeed_config ("" when absent).
std::string config_arg(const std::vector<std::string>& args);
// Whether PROGRAM's arguments fix the global batch (--global-batch-size).
bool args_fix_global_batch(const std::vector<std::string>& args);

// Cost-model features of a point (see tuner.h): per-step compute, data-parallel
// and tensor-parallel communication, optimizer work, micro-steps, constant.
constexpr int kNumFeatures = 6;
std::vector<double> cost_features(const Point& p, const ModelFacts& f);

// The metric value of a step time (seconds) at point p.
double metric_of_time(Metric m, const Point& p, const ModelFacts& f, double seconds);
// true when a is better than b for the metric.
bool better(Metric m, double a, double b);

}  // namespace ds::launch::autotune
