// Mixture of Experts in the config: the "model.moe" section, Megatron-
// DeepSpeed's MoE flags (megatron/arguments.py, with its defaults) and the
// checks. Semantics and what is not implemented yet: docs/moe.md.
#include <CLI/CLI.hpp>
#include <algorithm>

#include "lib/config/config_internal.h"

namespace ds {

using nlohmann::json;

namespace {

constexpr Choice<NoisyGatePolicy> kNoisyPolicies[] = {
    {"none", NoisyGatePolicy::None}, {"jitter", NoisyGatePolicy::Jitter}, {"rsample", NoisyGatePolicy::RSample}};

const char* policy_name(NoisyGatePolicy p) {
  return p == NoisyGatePolicy::Jitter ? "Jitter" : p == NoisyGatePolicy::RSample ? "RSample" : "none";
}

}  // namespace

void add_moe_flags(CLI::App& app, std::map<std::string, json>& out) {
  auto value = [&]<class T>(const char* name, const char* help, T) {
    app.add_option_function<T>(name, [&out, name](const T& v) { out[name] = v; }, help);
  };
  auto flag = [&](const char* name, const char* help) {
    app.add_flag_function(name, [&out, name](int64_t) { out[name] = true; }, help);
  };
  app.add_option_function<std::vector<int64_t>>(
         "--num-experts", [&out](const std::vector<int64_t>& v) { out["--num-experts"] = v; },
         "experts per MoE layer: one value, or one per MoE layer (PR-MoE); 1 = dense (default)")
      ->trigger_on_parse();  // given twice: the last list wins (argparse's nargs='+')
  app.add_option_function<std::string>(
         "--mlp-type", [&out](const std::string& v) { out["--mlp-type"] = v; },
         "standard (experts only) or residual (PR-MoE: a dense MLP plus the experts)")
      ->check(CLI::IsMember({"standard", "residual"}));
  value("--topk", "experts per token (default 1)", int64_t{});
  value("--expert-interval", "MoE on every layer whose 1-based index is a multiple of this (default 2)", int64_t{});
  value("--moe-expert-parallel-size", "expert-parallel ranks (default 1)", int64_t{});
  value("--moe-train-capacity-factor", "expert capacity factor in training (default 1.0)", double{});
  value("--moe-eval-capacity-factor", "expert capacity factor in evaluation (default 1.0)", double{});
  value("--moe-min-capacity", "minimum tokens per expert regardless of the factor (default 4)", int64_t{});
  value("--moe-loss-coeff", "weight of the load-balancing loss (default 0.1)", double{});
  flag("--disable-moe-token-dropping", "no capacity limit: every token reaches its experts");
  flag("--disable-moe-top2-2nd-expert-sampling", "top-2: the second expert by argmax, without Gumbel noise");
  flag("--create-moe-param-group", "accepted: expert weights always form their own parameter group in dstrain");
  flag("--enable-expert-tensor-parallelism", "split each expert over the tensor-parallel ranks");
  flag("--use-tutel", "accepted with a warning: Tutel is a kernel choice; dstrain uses its own MoE kernels");
  app.add_option_function<std::string>(
         "--noisy-gate-policy", [&out](const std::string& v) { out["--noisy-gate-policy"] = v; },
         "DeepSpeed MoE's noisy_gate_policy: None, Jitter or RSample (training only; DeepSpeed-MoE examples' flag)")
      ->check(CLI::IsMember({"None", "Jitter", "RSample"}, CLI::ignore_case));
}

void apply_moe_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  auto put = [&](const char* flag, const char* key, json v) {
    if (sp.count(flag)) set_at(j, std::string("/model/moe/") + key, std::move(v), flag);
  };
  auto given = [&](const char* flag) { return sp.count(flag) ? sp.at(flag) : json(); };
  put("--num-experts", "num_experts", given("--num-experts"));
  put("--mlp-type", "mlp_type", given("--mlp-type"));
  put("--topk", "topk", given("--topk"));
  put("--expert-interval", "expert_interval", given("--expert-interval"));
  put("--moe-expert-parallel-size", "expert_parallel_size", given("--moe-expert-parallel-size"));
  put("--moe-train-capacity-factor", "train_capacity_factor", given("--moe-train-capacity-factor"));
  put("--moe-eval-capacity-factor", "eval_capacity_factor", given("--moe-eval-capacity-factor"));
  put("--moe-min-capacity", "min_capacity", given("--moe-min-capacity"));
  put("--moe-loss-coeff", "loss_coeff", given("--moe-loss-coeff"));
  put("--disable-moe-token-dropping", "drop_tokens", false);
  put("--disable-moe-top2-2nd-expert-sampling", "top2_2nd_expert_sampling", false);
  put("--enable-expert-tensor-parallelism", "expert_tensor_parallelism", true);
  put("--noisy-gate-policy", "noisy_gate_policy", given("--noisy-gate-policy"));
  if (sp.count("--use-tutel"))
    add_warning(w, "--use-tutel: Tutel is a choice of MoE kernels; dstrain runs its own (same gating and results)");
  // The MoE flags on a model without MoE layers change nothing, as in
  // Megatron-DeepSpeed (its dense MoE scripts pass them with --num-experts 1):
  // said once, naming them.
  const json* experts = nullptr;
  if (j.contains("model") && j["model"].contains("moe") && j["model"]["moe"].contains("num_experts"))
    experts = &j["model"]["moe"]["num_experts"];
  bool dense = true;
  if (experts && experts->is_array())
    for (const json& e : *experts) dense = dense && e.is_number_integer() && e.get<int64_t>() <= 1;
  else if (experts)
    dense = experts->is_number_integer() && experts->get<int64_t>() <= 1;
  std::vector<std::string> moot;
  for (const char* f : {"--mlp-type", "--topk", "--expert-interval", "--moe-expert-parallel-size",
                        "--moe-train-capacity-factor", "--moe-eval-capacity-factor", "--moe-min-capacity",
                        "--moe-loss-coeff", "--disable-moe-token-dropping", "--disable-moe-top2-2nd-expert-sampling",
                        "--enable-expert-tensor-parallelism", "--noisy-gate-policy"})
    if (sp.count(f)) moot.emplace_back(f);
  if (dense && !moot.empty())
    add_warning(w, fmt::format("{}: the model has no Mixture-of-Experts layers (--num-experts 1), so {} nothing "
                               "(as in Megatron-DeepSpeed)",
                               fmt::join(moot, ", "), moot.size() == 1 ? "this changes" : "these change"));
}

void read_expert_counts(JsonSection& s, const char* flag, bool allow_empty, std::vector<int>& out) {
  s.mark("num_experts");
  if (!s.has("num_experts")) return;
  const json& v = s.raw().at("num_experts");
  const json list = v.is_array() ? v : json::array({v});
  DS_USER_CHECK(allow_empty || !list.empty(), "config: '{}' is an empty list", s.full("num_experts"));
  out.clear();
  for (const json& e : list) {
    DS_USER_CHECK(e.is_number_integer() && e.get<int64_t>() >= 1 && e.get<int64_t>() <= kMaxExperts,
                  "config: '{}' must be an integer or a list of integers in [1, {}] ({}), got {}",
                  s.full("num_experts"), kMaxExperts, flag, v.dump());
    out.push_back(static_cast<int>(e.get<int64_t>()));
  }
}

void read_moe_section(JsonSection s, MoeConfig& m) {
  read_expert_counts(s, "--num-experts", false, m.num_experts);
  const std::string mlp = lower(s.get<std::string>("mlp_type", m.residual ? "residual" : "standard"));
  DS_USER_CHECK(mlp == "standard" || mlp == "residual", "config: '{}' is \"{}\"; expected standard or residual",
                s.full("mlp_type"), mlp);
  m.residual = mlp == "residual";
  m.expert_interval = s.get<int>("expert_interval", m.expert_interval);
  m.topk = s.get<int>("topk", m.topk);
  m.expert_parallel_size = s.get<int>("expert_parallel_size", m.expert_parallel_size);
  m.train_capacity_factor = s.get<float>("train_capacity_factor", m.train_capacity_factor);
  m.eval_capacity_factor = s.get<float>("eval_capacity_factor", m.eval_capacity_factor);
  m.min_capacity = s.get<int>("min_capacity", m.min_capacity);
  m.loss_coeff = s.get<float>("loss_coeff", m.loss_coeff);
  m.drop_tokens = s.get<bool>("drop_tokens", m.drop_tokens);
  m.top2_2nd_expert_sampling = s.get<bool>("top2_2nd_expert_sampling", m.top2_2nd_expert_sampling);
  m.use_rts = s.get<bool>("use_rts", m.use_rts);
  m.noisy_gate_policy = read_choice(s, "noisy_gate_policy", kNoisyPolicies, m.noisy_gate_policy);
  m.expert_tensor_parallelism = s.get<bool>("expert_tensor_parallelism", m.expert_tensor_parallelism);
  s.finish(UnknownKeys::Error);
}

json moe_json(const MoeConfig& m) {
  auto num = shortest_decimal;
  return {{"num_experts", m.num_experts},
          {"mlp_type", m.residual ? "residual" : "standard"},
          {"expert_interval", m.expert_interval},
          {"topk", m.topk},
          {"expert_parallel_size", m.expert_parallel_size},
          {"train_capacity_factor", num(m.train_capacity_factor)},
          {"eval_capacity_factor", num(m.eval_capacity_factor)},
          {"min_capacity", m.min_capacity},
          {"loss_coeff", num(m.loss_coeff)},
          {"drop_tokens", m.drop_tokens},
          {"top2_2nd_expert_sampling", m.top2_2nd_expert_sampling},
          {"use_rts", m.use_rts},
          {"noisy_gate_policy", policy_name(m.noisy_gate_policy)},
          {"expert_tensor_parallelism", m.expert_tensor_parallelism}};
}

// The model side of MoE (every tool that builds a model from a config):
// the expert list against the layers, top-k against the experts, sizes.
void validate_moe_model(const ModelConfig& cfg) {
  const MoeConfig& m = cfg.moe;
  DS_USER_CHECK(!m.enabled(cfg.num_layers) || cfg.activation != Activation::ReLU,
                "model.activation relu (OPT's MLP) with Mixture-of-Experts layers is not implemented");
  DS_USER_CHECK(m.expert_interval >= 1, "model.moe.expert_interval {} (--expert-interval) must be >= 1",
                m.expert_interval);
  const int moe_layers = cfg.num_layers / m.expert_interval;
  DS_USER_CHECK(m.num_experts.size() == 1 || static_cast<int>(m.num_experts.size()) == moe_layers,
                "model.moe.num_experts (--num-experts) has {} values; give one, or one per MoE layer ({}: "
                "num_layers {} / expert_interval {})",
                m.num_experts.size(), moe_layers, cfg.num_layers, m.expert_interval);
  if (!m.enabled(cfg.num_layers)) return;
  const int min_experts = [&] {
    int e = kMaxExperts;
    for (int l = 0; l < cfg.num_layers; ++l)
      if (cfg.moe.experts(l, cfg.num_layers) > 1) e = std::min(e, cfg.moe.experts(l, cfg.num_layers));
    return e;
  }();
  DS_USER_CHECK(m.topk >= 1 && m.topk <= min_experts,
                "model.moe.topk {} (--topk) must be in [1, {}], the fewest experts of an MoE layer (--num-experts)",
                m.topk, min_experts);
  DS_USER_CHECK(m.train_capacity_factor > 0 && m.eval_capacity_factor > 0,
                "model.moe capacity factors {} / {} (--moe-train-capacity-factor / --moe-eval-capacity-factor) must "
                "be positive", m.train_capacity_factor, m.eval_capacity_factor);
  DS_USER_CHECK(m.min_capacity >= 0, "model.moe.min_capacity {} (--moe-min-capacity) must be >= 0", m.min_capacity);
  DS_USER_CHECK(m.loss_coeff >= 0, "model.moe.loss_coeff {} (--moe-loss-coeff) must be >= 0", m.loss_coeff);
  DS_USER_CHECK(m.expert_parallel_size >= 1, "model.moe.expert_parallel_size {} (--moe-expert-parallel-size) must be "
                ">= 1", m.expert_parallel_size);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int e = cfg.moe.experts(l, cfg.num_layers);
    DS_USER_CHECK(e == 1 || e % m.expert_parallel_size == 0,
                  "layer {} has {} experts (--num-experts), not divisible by the expert-parallel size {} "
                  "(--moe-expert-parallel-size)", l + 1, e, m.expert_parallel_size);
  }
}

// The layouts MoE runs in today (docs/moe.md): DP, ZeRO 0-3, pipeline
// parallelism, TP with and without sequence parallelism, DeepSpeed-Ulysses;
// expert parallelism (EP > 1) with all of them, ZeRO 0-3, and with optimizer
// offload except to the CPU from a GPU. The EP size was checked against DP
// when the layout was derived (make_parallel_layout).
void validate_moe_parallel(const TrainConfig& cfg) {
  const MoeConfig& m = cfg.model.moe;
  if (!m.enabled(cfg.model.num_layers)) return;
  const int ep = m.expert_parallel_size;
  // Offload with expert parallelism: the NVMe tier keeps one swap file per
  // sharding group; cpu on the CPU backend moves nothing; on a GPU the
  // host step serves one sharding group only so far.
  DS_USER_CHECK(ep == 1 || cfg.zero.offload_optimizer == OffloadDevice::None || cfg.device == DeviceType::CPU,
                "--moe-expert-parallel-size {} with zero_optimization.offload_optimizer.device {} on a GPU: expert "
                "parallelism runs without optimizer offload there so far (docs/moe.md)", ep,
                offload_device_name(cfg.zero.offload_optimizer));
  DS_USER_CHECK(!cfg.cuda_graph, "Mixture of Experts with --cuda-graph is not implemented yet");
}

}  // namespace ds
