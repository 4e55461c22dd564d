// DeepSpeed Data Efficiency's random-LTD in the config (docs/data_efficiency.md):
// the data_efficiency.data_routing.random_ltd section with DeepSpeed's keys
// (runtime/data_pipeline/config.py, constants.py), Megatron-DeepSpeed's
// --random-ltd (training.random_ltd), the resolved form and the checks.
// Upstream: the engine builds the scheduler when random_ltd.enabled is true
// (whatever data_routing.enabled says); Megatron-DeepSpeed wraps its layers
// only with --random-ltd, and then asserts that the section is enabled.
#include <algorithm>

#include "lib/config/config_internal.h"

namespace ds {

using nlohmann::json;

namespace {

// A required key of an enabled random_ltd section (upstream: a KeyError).
const json& required(DsSection& s, const std::string& key) {
  s.mark(key);
  DS_USER_CHECK(s.has(key), "config: '{}' is required when random-LTD is enabled", s.full(key));
  return s.raw().at(key);
}

int64_t positive(DsSection& s, const std::string& key) {
  const json& v = required(s, key);
  DS_USER_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, "config: '{}' must be a positive integer, got {}",
                s.full(key), v.dump());
  return v.get<int64_t>();
}

// A string key whose only meaningful value for Megatron's GPT layer is `ours`.
void fixed(DsSection& s, const std::string& key, const char* ours, const char* why) {
  const json& v = required(s, key);
  DS_USER_CHECK(v == ours, "config: '{}' is {}: Megatron-DeepSpeed's GPT layers need \"{}\" ({})", s.full(key),
                v.dump(), ours, why);
}

}  // namespace

void read_random_ltd(DsSection& routing, RandomLtdConfig& r) {
  if (!routing.raw().is_object()) return;
  routing.mark("enabled");  // data_routing.enabled: upstream reads it and acts on random_ltd.enabled alone
  DsSection s = routing.section("random_ltd");
  r.enabled = s.raw().is_object() && s.get<bool>("enabled", false);
  if (!r.enabled) return;
  const json& ids = required(s, "random_ltd_layer_id");
  DS_USER_CHECK(ids.is_array() && !ids.empty(), "config: '{}' must be a non-empty list of layer indices, got {}",
                s.full("random_ltd_layer_id"), ids.dump());
  for (const json& v : ids) {
    DS_USER_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 20),
                  "config: '{}' must hold 0-based layer indices, got {}", s.full("random_ltd_layer_id"), v.dump());
    r.layer_ids.push_back(v.get<int>());
  }
  std::sort(r.layer_ids.begin(), r.layer_ids.end());  // upstream walks them sorted
  DS_USER_CHECK(std::adjacent_find(r.layer_ids.begin(), r.layer_ids.end()) == r.layer_ids.end(),
                "config: '{}' lists a layer twice: {}", s.full("random_ltd_layer_id"), ids.dump());
  const int64_t n = positive(s, "random_ltd_layer_num");
  DS_USER_CHECK(n == static_cast<int64_t>(r.layer_ids.size()),
                "config: '{}' is {} but random_ltd_layer_id lists {} layers (DeepSpeed requires them equal)",
                s.full("random_ltd_layer_num"), n, r.layer_ids.size());
  positive(s, "total_layer_num");  // upstream counts layer tokens with it (logging only)
  fixed(s, "model_mask_name", "attention_mask", "the keyword its layers take the mask by");
  fixed(s, "model_type", "decoder", "causal GPT layers; \"encoder\" is BERT's");
  fixed(s, "hidden_state_order", "seq_batch_dim", "its layers take (sequence, batch, hidden)");
  s.mark("micro_batch_size");  // set by the engine
  s.mark("global_batch_size");
  DsSection sched = s.section("random_ltd_schedule");
  DS_USER_CHECK(sched.raw().is_object(), "config: '{}' is required when random-LTD is enabled",
                s.full("random_ltd_schedule"));
  const json& type = required(sched, "schedule_type");
  DS_USER_CHECK(type == "fixed_linear", "config: '{}' is {}; DeepSpeed's random-LTD supports only \"fixed_linear\"",
                sched.full("schedule_type"), type.dump());
  r.schedule.min_value = positive(sched, "min_value");
  r.schedule.max_value = positive(sched, "max_value");
  DsSection sc = sched.section("schedule_config");
  DS_USER_CHECK(sc.raw().is_object(), "config: '{}' is required when random-LTD is enabled",
                sched.full("schedule_config"));
  r.schedule.require_steps = positive(sc, "require_steps");
  r.schedule.seq_per_step = positive(sc, "seq_per_step");
  DsSection lr = s.section("layer_token_lr_schedule");
  DS_USER_CHECK(!(lr.raw().is_object() && lr.get<bool>("enabled", false)),
                "config: '{}' is true: DeepSpeed's layer-token learning-rate schedule for random-LTD is not "
                "implemented upstream either (NotImplementedError)", lr.full("enabled"));
  if (lr.raw().is_object())
    for (const char* k : {"total_layer_tokens", "warmup_type", "warmup_layer_tokens"}) lr.mark(k);
}

json random_ltd_json(const RandomLtdConfig& r) {
  const RandomLtdSchedule& s = r.schedule;
  return {{"enabled", true},
          {"data_routing",
           {{"enabled", true},
            {"random_ltd",
             {{"enabled", true},
              {"total_layer_num", r.layer_ids.back() + 1},
              {"random_ltd_layer_num", r.layer_ids.size()},
              {"random_ltd_layer_id", r.layer_ids},
              {"model_mask_name", "attention_mask"},
              {"model_type", "decoder"},
              {"hidden_state_order", "seq_batch_dim"},
              {"random_ltd_schedule",
               {{"min_value", s.min_value},
                {"max_value", s.max_value},
                {"schedule_type", "fixed_linear"},
                {"schedule_config", {{"require_steps", s.require_steps}, {"seq_per_step", s.seq_per_step}}}}}}}}}};
}

void validate_random_ltd(const TrainConfig& cfg, Warnings& w) {
  const RandomLtdConfig& r = cfg.random_ltd;
  DS_USER_CHECK(!r.layers_converted || r.enabled,
                "--random-ltd needs data_efficiency.data_routing.random_ltd.enabled true in the DeepSpeed config "
                "(Megatron-DeepSpeed asserts that the engine has random-LTD enabled)");
  if (!r.enabled) return;
  if (!r.layers_converted) {
    add_warning(w, "config: 'data_efficiency.data_routing.random_ltd' is enabled without --random-ltd: no layer "
                   "drops tokens (as upstream, where only --random-ltd converts the layers)");
    return;
  }
  const int L = cfg.model.num_layers;
  DS_USER_CHECK(r.layer_ids.back() < L, "config: data_efficiency.data_routing.random_ltd.random_ltd_layer_id names "
                "layer {}, but the model has {} layers (0-based indices)", r.layer_ids.back(), L);
  const ParallelConfig& p = cfg.parallel;
  DS_USER_CHECK(p.pp == 1, "--random-ltd with --pipeline-model-parallel-size {}: random-LTD is not compatible with "
                "pipeline parallelism (as in Megatron-DeepSpeed's data efficiency scripts); use "
                "--no-pipeline-parallel", p.pp);
  DS_USER_CHECK(!p.sequence_parallel, "--random-ltd with --sequence-parallel: each rank holds a part of the "
                "sequence, from which the kept positions cannot be gathered; drop one of them");
  DS_USER_CHECK(p.sp == 1, "--random-ltd with DeepSpeed-Ulysses (ds_sequence_parallel_size {}) is not implemented",
                p.sp);
  DS_USER_CHECK(cfg.model.position == PositionKind::Learned,
                "--random-ltd with rotary position embeddings: upstream rotates the kept positions by their "
                "rank among the kept ones, not by their place in the sequence; use learned absolute positions");
  DS_USER_CHECK(!cfg.cuda_graph, "--random-ltd with --cuda-graph: the kept positions and their number change every "
                "step");
}

}  // namespace ds
