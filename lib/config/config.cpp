// Entry points of the config layer, the batch-size rules, vocabulary padding,
// and the `resolved` JSON (the effective config, saved with checkpoints).
#include "lib/config/config.h"

#include <string>

#include "lib/config/config_internal.h"
#include "lib/core/log.h"
#include "lib/data/bpe.h"

namespace ds {

using nlohmann::json;

namespace {

TrainConfig finish_config(const json& j, int world_size, Warnings w) {
  TrainConfig cfg;
  read_config_json(j, cfg, w);
  derive_config(cfg, world_size, w);
  validate_config(cfg, world_size, w);
  cfg.resolved = config_to_json(cfg);
  if (log_rank() == 0)
    for (const auto& msg : w) DS_WARN("{}", msg);
  cfg.warnings = std::move(w);
  return cfg;
}

}  // namespace

TrainConfig parse_train_config(int argc, char** argv, int world_size) {
  Warnings w;
  std::string path, help;
  json j = merge_command_line(argc, argv, path, help, w);
  if (!help.empty()) {
    TrainConfig cfg;
    cfg.help_text = help;
    return cfg;
  }
  TrainConfig cfg = finish_config(j, world_size, std::move(w));
  cfg.config_path = path;
  return cfg;
}

TrainConfig train_config_from_json(const json& j, int world_size) { return finish_config(j, world_size, {}); }

// DeepSpeed's rules: any two of the triple give the third; one of
// train_batch_size / micro batch alone implies gradient_accumulation_steps = 1.
void resolve_batch(BatchConfig& b) {
  const int64_t dp = b.dp_size;
  DS_USER_CHECK(dp > 0, "data parallel size must be positive, got {}", dp);
  DS_USER_CHECK(b.train_batch_size >= 0 && b.micro_batch_size >= 0 && b.grad_accum_steps >= 0,
                "batch sizes must be positive: {} {}, {} {}, {} {}", kTbs, b.train_batch_size, kMbs,
                b.micro_batch_size, kGas, b.grad_accum_steps);
  int64_t& tbs = b.train_batch_size;
  int64_t& mbs = b.micro_batch_size;
  int64_t& gas = b.grad_accum_steps;
  if (b.elasticity.enabled) {  // DeepSpeed's elastic batch: the same global batch at every valid DP size
    DS_USER_CHECK((tbs == 0 && mbs == 0 && gas == 0) || b.elasticity.ignore_non_elastic_batch_info,
                  "config: elasticity is enabled, so the batch sizes come from the 'elasticity' section; remove {}, "
                  "{} and {} (--global-batch-size, --micro-batch-size) or set "
                  "'elasticity.ignore_non_elastic_batch_info': true", kTbs, kMbs, kGas);
    const ElasticBatch e = compute_elastic_config(b.elasticity, dp);
    tbs = e.train_batch_size;
    mbs = e.micro_batch_size;
    gas = 0;
  }
  DS_USER_CHECK(tbs > 0 || mbs > 0, "batch size: give {} (--global-batch-size) or {} (--micro-batch-size){}", kTbs,
                kMbs, gas > 0 ? fmt::format("; {} {} alone is not enough", kGas, gas) : "");
  if (tbs > 0 && mbs > 0 && gas > 0) {
    DS_USER_CHECK(tbs == mbs * gas * dp, "{} {} != {} {} * {} {} * data parallel size {} (= {})", kTbs, tbs, kMbs,
                  mbs, kGas, gas, dp, mbs * gas * dp);
  } else if (tbs > 0 && mbs > 0) {
    DS_USER_CHECK(tbs % (mbs * dp) == 0, "{} {} is not divisible by {} {} * data parallel size {} (= {})", kTbs, tbs,
                  kMbs, mbs, dp, mbs * dp);
    gas = tbs / (mbs * dp);
  } else if (tbs > 0 && gas > 0) {
    DS_USER_CHECK(tbs % (gas * dp) == 0, "{} {} is not divisible by {} {} * data parallel size {} (= {})", kTbs, tbs,
                  kGas, gas, dp, gas * dp);
    mbs = tbs / (gas * dp);
  } else if (mbs > 0 && gas > 0) {
    tbs = mbs * gas * dp;
  } else if (tbs > 0) {
    DS_USER_CHECK(tbs % dp == 0, "{} {} is not divisible by data parallel size {}", kTbs, tbs, dp);
    gas = 1;
    mbs = tbs / dp;
  } else {
    gas = 1;
    tbs = mbs * dp;
  }
}

const char* recompute_granularity_name(RecomputeKind k) {
  return k == RecomputeKind::Full ? "full" : k == RecomputeKind::Selective ? "selective" : "";
}

const char* precision_name(Precision p) {
  return p == Precision::BF16 ? "bf16" : p == Precision::FP16 ? "fp16" : "fp32";
}
std::string LoggingConfig::tensorboard_dir_in_effect() const {
  if (!tensorboard_dir.empty()) return tensorboard_dir;
  if (!ds_tensorboard) return "";
  if (ds_tensorboard_path.empty()) return ds_tensorboard_job;
  // os.path.join(output_path, job_name), as DeepSpeed's monitor: one '/' between them
  const bool slash = ds_tensorboard_path.back() == '/';
  return ds_tensorboard_path + (slash ? "" : "/") + ds_tensorboard_job;
}

DType compute_dtype(Precision p) {
  return p == Precision::BF16 ? DType::BF16 : p == Precision::FP16 ? DType::F16 : DType::F32;
}

namespace {

// The tokenizer the data config names (--tokenizer-type with --tokenizer-model,
// or --vocab-file + --merge-file): vocabulary size and bos/eos/eod/pad ids.
data::TokenizerInfo tokenizer_info_from_files(const DataConfig& d) {
  data::TokenizerSpec spec;
  spec.kind = d.tokenizer_kind();
  spec.model_path = d.tokenizer_model;
  spec.vocab_file = d.vocab_file;
  spec.merge_file = d.merge_file;
  return data::tokenizer_info(spec);
}

}  // namespace

void resolve_vocab(TrainConfig& cfg) {
  ModelConfig& m = cfg.model;
  const DataConfig& d = cfg.data;
  const bool gpt2 = d.tokenizer_kind() == data::TokenizerKind::GPT2BPE;
  if (gpt2 && !d.vocab_file.empty()) {
    int64_t v = data::vocab_file_size(d.vocab_file);
    DS_USER_CHECK(m.vocab_size == 0 || m.vocab_size == v,
                  "model.vocab_size {} does not match --vocab-file '{}' ({} entries)", m.vocab_size,
                  d.vocab_file, v);
    m.vocab_size = static_cast<int>(v);
    if (!d.merge_file.empty()) cfg.data.tokenizer = tokenizer_info_from_files(d);
  } else if (!gpt2) {
    cfg.data.tokenizer = tokenizer_info_from_files(d);
    const int64_t v = cfg.data.tokenizer.vocab_size;
    DS_USER_CHECK(m.vocab_size == 0 || m.vocab_size == v,
                  "model.vocab_size {} does not match --tokenizer-model '{}' ({} with --tokenizer-type {})",
                  m.vocab_size, d.tokenizer_model, v, data::tokenizer_kind_name(d.tokenizer_kind()));
    m.vocab_size = static_cast<int>(v);
  }
  DS_USER_CHECK(m.vocab_size > 0, "the vocabulary size is unknown: give --vocab-file, --tokenizer-type with "
                "--tokenizer-model (or model.vocab_size)");
  m.padded_vocab_size = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, cfg.parallel.tp);
  cfg.resolved["model"]["vocab_size"] = m.vocab_size;
}

namespace {

double num(float f) { return shortest_decimal(f); }

json model_json(const ModelConfig& m) {
  json j = json::object();
  write_fields(j, m, model_fields());
  j.update({{"family", family_name(m.family)},
            {"num_key_value_heads", m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads},
            {"max_position_embeddings", m.max_position_embeddings},
            {"norm", m.norm == NormKind::RMSNorm ? "rmsnorm" : "layernorm"},
            {"activation", m.activation == Activation::SwiGLU ? "swiglu"
                           : m.activation == Activation::ReLU ? "relu"
                                                              : "gelu"},
            {"position", m.position == PositionKind::Rope ? "rope" : "learned"},
            {"moe", moe_json(m.moe)}});
  // Written only when set (OPT's 0): configs that never set it stay as they were.
  if (m.embedding_dropout >= 0) j["embedding_dropout"] = num(m.embedding_dropout);
  if (m.decay_block_norms) j["decay_block_norms"] = true;
  if (m.value_head) j["value_head"] = true;
  if (m.position_offset != 0) j["position_offset"] = m.position_offset;
  if (m.post_norm) j["post_norm"] = true;
  if (m.embed_proj_dim != 0) j["embed_proj_dim"] = m.embed_proj_dim;
  return j;
}

json data_json(const DataConfig& d) {
  json j = {{"data_path", d.data_path},
            {"train_data_path", d.train_data_path},
            {"valid_data_path", d.valid_data_path},
            {"test_data_path", d.test_data_path},
            {"tokenizer_type", d.tokenizer_type ? data::tokenizer_kind_name(*d.tokenizer_type) : ""}};
  write_fields(j, d, data_fields());
  return j;
}

json parallel_json(const TrainConfig& c) {
  json j = {{"recompute_granularity", recompute_granularity_name(c.parallel.recompute)},
            {"overlap_param_gather", c.zero.overlap_param_gather}};
  write_fields(j, c.parallel, parallel_fields());
  return j;
}

json training_json(const TrainConfig& c) {
  json t = {{"train_iters", c.train_iters},
            {"seed", c.seed},
            {"device", c.device == DeviceType::CUDA ? "cuda" : "cpu"},
            {"attention_backend", attention_backend_name(c.attention_backend)},
            {"log_interval", c.log.log_interval}};
  write_fields(t, c, training_fields());
  const ScheduleLengths& L = c.lengths;
  if (L.train_tokens > 0) t["train_tokens"] = L.train_tokens;
  if (c.distill.enabled) t["distillation"] = distill_json(c.distill);
  if (L.rampup.enabled()) t["rampup_batch_size"] = {L.rampup.start, L.rampup.increment, L.rampup.samples};
  if (L.sample_based()) {  // train_iters is derived from the samples, not an input
    t.erase("train_iters");
    t["train_samples"] = L.train_samples;
  }
  if (c.optim.scheduler == LrScheduler::Megatron) {
    t["lr_decay_style"] = lr_decay_name(c.optim.decay);
    if (L.sample_based()) {
      t["lr_warmup_samples"] = L.lr_warmup_samples;
      if (L.lr_decay_samples > 0) t["lr_decay_samples"] = L.lr_decay_samples;
    } else {
      t["lr_warmup_iters"] = c.optim.warmup_iters;
      t["lr_decay_iters"] = c.optim.decay_iters;
    }
    if (L.lr_warmup_tokens >= 0) t["lr_warmup_tokens"] = L.lr_warmup_tokens;
    if (L.lr_decay_tokens >= 0) t["lr_decay_tokens"] = L.lr_decay_tokens;
    if (c.optim.decay == LrDecay::WSD) {
      t["lr_wsd_decay_style"] = wsd_decay_name(c.optim.wsd_style);
      if (L.sample_based())
        t["lr_wsd_decay_samples"] = L.lr_wsd_decay_samples;
      else
        t["lr_wsd_decay_iters"] = L.lr_wsd_decay_iters;
    }
    t["min_lr"] = num(c.optim.min_lr);
    t["lr_warmup_init"] = num(c.optim.warmup_min_lr);
  }
  return t;
}

// optimizer.params: the shared keys and those of the optimizer's type.
json optimizer_json(const OptimizerConfig& o) {
  const OptimizerSpec& s = o.spec;
  json p = {{"lr", num(o.lr)}, {"betas", {num(o.beta1), num(o.beta2)}}, {"eps", num(o.eps)},
            {"weight_decay", num(o.weight_decay)}};
  switch (optimizer_kind(s.type).value_or(OptimizerKind::AdamW)) {
    case OptimizerKind::AdamW:
    case OptimizerKind::AdamL2:
      if (s.type == "Adam") p["adam_w_mode"] = s.adam_w_mode;
      p["bias_correction"] = s.bias_correction;
      break;
    case OptimizerKind::SGD:
      p["momentum"] = num(s.momentum);
      p["dampening"] = num(s.dampening);
      p["nesterov"] = s.nesterov;
      break;
    case OptimizerKind::Adagrad:
      p["lr_decay"] = num(s.lr_decay);
      p["initial_accumulator_value"] = num(s.initial_accumulator_value);
      break;
    case OptimizerKind::Lion: break;
    case OptimizerKind::OneBitAdam: p["freeze_step"] = s.freeze_step; break;
    case OptimizerKind::ZeroOneAdam:
      p["var_freeze_step"] = s.var_freeze_step;
      p["var_update_scaler"] = s.var_update_scaler;
      p["local_step_scaler"] = s.local_step_scaler;
      p["local_step_clipper"] = s.local_step_clipper;
      break;
    case OptimizerKind::OneBitLamb:
      p["freeze_step"] = s.freeze_step;
      p["max_coeff"] = num(s.max_coeff);
      p["min_coeff"] = num(s.min_coeff);
      p["coeff_beta"] = num(s.coeff_beta);
      p["factor_max"] = num(s.factor_max);
      p["factor_min"] = num(s.factor_min);
      p["factor_threshold"] = num(s.factor_threshold);
      break;
    case OptimizerKind::Lamb:
      p["bias_correction"] = s.bias_correction;
      p["max_coeff"] = num(s.max_coeff);
      p["min_coeff"] = num(s.min_coeff);
      p["eps_inside_sqrt"] = s.eps_inside_sqrt;
      break;
  }
  return {{"type", s.type}, {"params", p}};
}

json scheduler_json(const OptimizerConfig& o) {
  if (o.scheduler == LrScheduler::Transformers) {  // dschat's (not a DeepSpeed type: never read back)
    const char* name = "";
    for (const auto& [k, n] : kHfScheduleNames)
      if (k == o.hf_schedule) name = n;
    return {{"type", "transformers"},
            {"params", {{"name", name}, {"num_warmup_steps", o.warmup_iters}, {"num_training_steps", o.decay_iters}}}};
  }
  if (o.scheduler == LrScheduler::LRRangeTest) {
    const LrRangeTestParams& r = o.range_test;
    return {{"type", lr_scheduler_name(o.scheduler)},
            {"params", {{"lr_range_test_min_lr", num(r.min_lr)}, {"lr_range_test_step_size", r.step_size},
                        {"lr_range_test_step_rate", num(r.step_rate)}, {"lr_range_test_staircase", r.staircase}}}};
  }
  if (o.scheduler == LrScheduler::OneCycle) {
    const OneCycleParams& c = o.one_cycle;
    return {{"type", lr_scheduler_name(o.scheduler)},
            {"params", {{"cycle_min_lr", num(c.cycle_min_lr)}, {"cycle_max_lr", num(c.cycle_max_lr)},
                        {"decay_lr_rate", num(c.decay_lr_rate)}, {"cycle_first_step_size", c.cycle_first_step_size},
                        {"cycle_second_step_size", c.cycle_second_step_size},
                        {"cycle_first_stair_count", c.cycle_first_stair_count},
                        {"cycle_second_stair_count", c.cycle_second_stair_count},
                        {"decay_step_size", c.decay_step_size}, {"cycle_momentum", c.cycle_momentum},
                        {"cycle_min_mom", num(c.cycle_min_mom)}, {"cycle_max_mom", num(c.cycle_max_mom)},
                        {"decay_mom_rate", num(c.decay_mom_rate)}}}};
  }
  json p = {{"warmup_num_steps", o.warmup_iters},
            {"warmup_type", o.warmup_type == WarmupKind::Log ? "log" : "linear"}};
  if (o.scheduler == LrScheduler::WarmupCosineLR) {
    p["warmup_min_ratio"] = num(o.warmup_min_ratio);
    p["cos_min_ratio"] = num(o.cos_min_ratio);
  } else {
    p["warmup_min_lr"] = num(o.warmup_min_lr);
    p["warmup_max_lr"] = num(o.lr);
  }
  if (o.scheduler != LrScheduler::WarmupLR) p["total_num_steps"] = o.decay_iters;
  return {{"type", lr_scheduler_name(o.scheduler)}, {"params", p}};
}

json offload_optimizer_json(const ZeroConfig& z) {
  if (z.offload_optimizer == OffloadDevice::None) return {{"device", "none"}};
  json j = {{"device", offload_device_name(z.offload_optimizer)},
            {"pin_memory", z.offload_pin_memory},
            {"ratio", z.offload_ratio}};
  if (z.offload_optimizer == OffloadDevice::NVMe) write_fields(j, z.nvme, nvme_fields());
  return j;
}

json offload_param_json(const ZeroConfig& z) {
  json j = {{"device", offload_device_name(z.offload_param)}};
  if (z.offload_param != OffloadDevice::None) j["pin_memory"] = z.param_pin_memory;
  if (z.offload_param == OffloadDevice::NVMe) j["nvme_path"] = z.param_nvme_path;
  return j;
}

json zero_json(const ZeroConfig& z) {
  json j = {{"offload_optimizer", offload_optimizer_json(z)}, {"offload_param", offload_param_json(z)}};
  write_fields(j, z, zero_fields());
  return j;
}

// The fields of one table as a JSON object.
template <class Root>
json fields_json(const Root& r, std::span<const ConfigField<Root>> table) {
  json j = json::object();
  write_fields(j, r, table);
  return j;
}

json curriculum_json(const CurriculumConfig& c) {
  const json sc = curriculum_schedule_json(c);
  return {{"enabled", true},
          {"curriculum_type", "seqlen"},
          {"min_difficulty", c.min_difficulty},
          {"max_difficulty", c.max_difficulty},
          {"schedule_type", curriculum_schedule_name(c.schedule)},
          {"schedule_config", sc}};
}

json compression_json(const CompressionConfig& c) {
  json out = json::object();
  if (c.act_quant) {
    json groups = json::object();
    for (const ActQuantGroup& g : c.act_groups) groups[g.name] = {{"params", {{"bits", g.bits}}}, {"modules", g.modules}};
    out["activation_quantization"] = {{"shared_parameters",
                                       {{"enabled", true},
                                        {"quantization_type", c.act_symmetric ? "symmetric" : "asymmetric"},
                                        {"range_calibration", c.act_static ? "static" : "dynamic"},
                                        {"schedule_offset", c.act_offset}}},
                                      {"different_groups", groups}};
  }
  if (c.weight_quant) {
    json groups = json::object();
    for (const WeightQuantGroup& g : c.wq_list)
      groups[g.name] = {{"params", {{"start_bits", g.start_bits}, {"target_bits", g.target_bits},
                                    {"quantization_period", g.period}}},
                        {"modules", g.modules}};
    out["weight_quantization"] = {{"shared_parameters",
                                   {{"enabled", true},
                                    {"schedule_offset", c.wq_offset},
                                    {"quantize_groups", c.wq_groups},
                                    {"quantize_verbose", c.wq_verbose},
                                    {"quantization_type", c.wq_symmetric ? "symmetric" : "asymmetric"}}},
                                  {"different_groups", groups}};
  }
  return out;
}

}  // namespace

json config_to_json(const TrainConfig& c) {
  const OptimizerConfig& o = c.optim;
  const PrecisionConfig& pc = c.precision;
  json j = {{kTbs, c.batch.train_batch_size},
            {kMbs, c.batch.micro_batch_size},
            {kGas, c.batch.grad_accum_steps},
            {"gradient_clipping", num(o.grad_clip)},
            {"steps_per_print", c.log.steps_per_print},
            {"optimizer", optimizer_json(o)},
            {"fp16", fields_json(pc, fp16_fields())},
            {"bf16", {{"enabled", pc.precision == Precision::BF16}}},
            {"zero_optimization", zero_json(c.zero)},
            {"tensorboard", fields_json(c.log, tensorboard_fields())},
            {"csv_monitor", fields_json(c.log, csv_monitor_fields())},
            {"model", model_json(c.model)},
            {"data", data_json(c.data)},
            {"training", training_json(c)},
            {"parallel", parallel_json(c)}};
  j["fp16"]["enabled"] = pc.precision == Precision::FP16;
  if (o.scheduler != LrScheduler::Megatron) j["scheduler"] = scheduler_json(o);
  if (c.curriculum.enabled) j["curriculum_learning"] = curriculum_json(c.curriculum);
  if (c.compression.act_quant || c.compression.weight_quant) j["compression_training"] = compression_json(c.compression);
  if (c.random_ltd.enabled) j["data_efficiency"] = random_ltd_json(c.random_ltd);
  if (c.data_sampling.active()) {
    json& de = j["data_efficiency"];
    if (de.is_null()) de = {{"enabled", true}};
    de["seed"] = c.data_sampling.seed;
    de["data_sampling"] = data_sampling_json(c.data_sampling);
    j["dataloader_drop_last"] = c.data_sampling.drop_last;
  }
  if (c.zero.offload_optimizer == OffloadDevice::NVMe) j["aio"] = fields_json(c.zero.nvme.aio, aio_fields());
  return j;
}

}  // namespace ds
