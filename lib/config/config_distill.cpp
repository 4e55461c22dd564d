// Knowledge distillation in the config: Megatron-DeepSpeed's --kd / --mos
// flags (megatron/arguments.py's distillation group, with its defaults), the
// "training.distillation" section and the checks. Semantics: docs/distillation.md.
#include <CLI/CLI.hpp>
#include <cmath>

#include "lib/config/config_internal.h"

namespace ds {

using nlohmann::json;

void add_distill_flags(CLI::App& app, std::map<std::string, json>& out) {
  auto value = [&]<class T>(const char* name, const char* help, T) {
    app.add_option_function<T>(name, [&out, name](const T& v) { out[name] = v; }, help);
  };
  auto flag = [&](const char* name, const char* help) {
    app.add_flag_function(name, [&out, name](int64_t) { out[name] = true; }, help);
  };
  flag("--kd", "knowledge distillation from the teacher of --load-teacher");
  flag("--mos", "Mixture-of-Students: the same distillation loss, logged as \"mos loss\"");
  value("--kd-alpha-ce", "accepted; unused, as in Megatron-DeepSpeed (default 1)", double{});
  value("--kd-beta-ce", "weight of the distillation loss (default 1)", double{});
  value("--kd-temp", "softmax temperature of the distillation loss (default 1)", double{});
  value("--load-teacher", "the teacher: a dstrain checkpoint directory (any layout)", std::string{});
  value("--num-layers-teacher", "the teacher's layers (checked against its checkpoint)", int64_t{});
  value("--hidden-size-teacher", "the teacher's hidden size (checked against its checkpoint)", int64_t{});
  value("--num-attention-heads-teacher", "the teacher's attention heads (checked against its checkpoint)", int64_t{});
  app.add_option_function<std::vector<int64_t>>(
         "--num-experts-teacher", [&out](const std::vector<int64_t>& v) { out["--num-experts-teacher"] = v; },
         "the teacher's experts per MoE layer (checked against its checkpoint)")
      ->trigger_on_parse();
}

void apply_distill_flags(json& j, const std::map<std::string, json>& sp) {
  auto put = [&](const char* flag, const char* key, json v) {
    if (sp.count(flag)) set_at(j, std::string("/training/distillation/") + key, std::move(v), flag);
  };
  auto given = [&](const char* flag) { return sp.count(flag) ? sp.at(flag) : json(); };
  put("--kd", "enabled", true);
  put("--mos", "enabled", true);
  put("--mos", "mos", true);
  put("--kd-alpha-ce", "alpha_ce", given("--kd-alpha-ce"));
  put("--kd-beta-ce", "beta_ce", given("--kd-beta-ce"));
  put("--kd-temp", "temperature", given("--kd-temp"));
  put("--load-teacher", "load_teacher", given("--load-teacher"));
  put("--num-layers-teacher", "num_layers", given("--num-layers-teacher"));
  put("--hidden-size-teacher", "hidden_size", given("--hidden-size-teacher"));
  put("--num-attention-heads-teacher", "num_attention_heads", given("--num-attention-heads-teacher"));
  put("--num-experts-teacher", "num_experts", given("--num-experts-teacher"));
}

void read_distill_section(JsonSection s, DistillConfig& d) {
  d.enabled = s.get<bool>("enabled", d.enabled);
  d.mos = s.get<bool>("mos", d.mos);
  d.alpha_ce = s.get<float>("alpha_ce", d.alpha_ce);
  d.beta_ce = s.get<float>("beta_ce", d.beta_ce);
  d.temperature = s.get<float>("temperature", d.temperature);
  d.load_teacher = s.get<std::string>("load_teacher", d.load_teacher);
  d.num_layers = s.get<int>("num_layers", d.num_layers);
  d.hidden_size = s.get<int>("hidden_size", d.hidden_size);
  d.num_attention_heads = s.get<int>("num_attention_heads", d.num_attention_heads);
  read_expert_counts(s, "--num-experts-teacher", true, d.num_experts);  // []: not given
  s.finish(UnknownKeys::Error);
}

json distill_json(const DistillConfig& d) {
  auto num = shortest_decimal;
  return {{"enabled", d.enabled},
          {"mos", d.mos},
          {"alpha_ce", num(d.alpha_ce)},
          {"beta_ce", num(d.beta_ce)},
          {"temperature", num(d.temperature)},
          {"load_teacher", d.load_teacher},
          {"num_layers", d.num_layers},
          {"hidden_size", d.hidden_size},
          {"num_attention_heads", d.num_attention_heads},
          {"num_experts", d.num_experts}};
}

void validate_distill(const TrainConfig& cfg) {
  const DistillConfig& d = cfg.distill;
  if (!d.enabled) return;
  const char* what = d.mos ? "--mos" : "--kd";
  DS_USER_CHECK(!d.load_teacher.empty(), "{} needs --load-teacher (training.distillation.load_teacher): the "
                "teacher's dstrain checkpoint directory", what);
  DS_USER_CHECK(std::isfinite(d.temperature) && d.temperature > 0,
                "training.distillation.temperature (--kd-temp) must be a positive number, got {}", d.temperature);
  DS_USER_CHECK(std::isfinite(d.beta_ce), "training.distillation.beta_ce (--kd-beta-ce) must be finite, got {}",
                d.beta_ce);
  DS_USER_CHECK(std::isfinite(d.alpha_ce), "training.distillation.alpha_ce (--kd-alpha-ce) must be finite, got {}",
                d.alpha_ce);
  DS_USER_CHECK(d.num_layers >= 0 && d.hidden_size >= 0 && d.num_attention_heads >= 0,
                "training.distillation: the teacher's num_layers, hidden_size and num_attention_heads "
                "(--num-layers-teacher, --hidden-size-teacher, --num-attention-heads-teacher) must be positive");
  const ParallelConfig& p = cfg.parallel;
  DS_USER_CHECK(p.tp == 1, "{} with --tensor-model-parallel-size {}: distillation runs with tensor parallel size 1 "
                "(Megatron-DeepSpeed's KD softmax covers each rank's vocabulary shard only; its scripts use 1)",
                what, p.tp);
  DS_USER_CHECK(p.pp == 1, "{} with --pipeline-model-parallel-size {}: distillation runs without pipeline "
                "parallelism, as in Megatron-DeepSpeed (its KD loss is not in the pipeline engine; its scripts "
                "pass --no-pipeline-parallel)", what, p.pp);
  DS_USER_CHECK(p.sp == 1, "{} with DeepSpeed-Ulysses (ds_sequence_parallel_size {}) is not implemented", what,
                p.sp);
  DS_USER_CHECK(!cfg.cuda_graph, "{} with --cuda-graph is not implemented (the teacher's forward is not captured)",
                what);
}

}  // namespace ds
