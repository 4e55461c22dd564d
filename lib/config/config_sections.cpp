// Our own config sections: "model", "data", "training", "parallel".
// These are strict (an unknown key is an error naming it) and are documented
// key by key in docs/config.md; keep the two in step.
#include <type_traits>
#include <variant>

#include "lib/config/config_internal.h"

namespace ds {

using nlohmann::json;

namespace {


constexpr Choice<ModelFamily> kFamilies[] = {{"gpt2", ModelFamily::GPT2}, {"llama", ModelFamily::LLaMA}};
constexpr Choice<NormKind> kNorms[] = {{"layernorm", NormKind::LayerNorm}, {"rmsnorm", NormKind::RMSNorm}};
constexpr Choice<Activation> kActs[] = {
    {"gelu", Activation::GELU}, {"swiglu", Activation::SwiGLU}, {"relu", Activation::ReLU}};
constexpr Choice<PositionKind> kPositions[] = {{"learned", PositionKind::Learned}, {"rope", PositionKind::Rope}};
constexpr Choice<LrDecay> kDecays[] = {
    {"constant", LrDecay::Constant}, {"linear", LrDecay::Linear}, {"cosine", LrDecay::Cosine},
    {"inverse-square-root", LrDecay::InverseSqrt}, {"wsd", LrDecay::WSD}};
constexpr Choice<WsdDecay> kWsdStyles[] = {{"exponential", WsdDecay::Exponential},
                                           {"linear", WsdDecay::Linear},
                                           {"cosine", WsdDecay::Cosine},
                                           {"minus_sqrt", WsdDecay::MinusSqrt}};

}  // namespace

void read_model_section(JsonSection s, ModelConfig& m) {
  set_model_family(m, read_choice(s, "family", kFamilies, m.family));
  read_fields(s, m, model_fields());
  m.num_kv_heads = s.get<int>("num_key_value_heads", m.num_kv_heads);
  // Not given: as long as the sequence (Megatron does the same).
  m.max_position_embeddings = s.get<int>("max_position_embeddings", m.seq_length);
  m.norm = read_choice(s, "norm", kNorms, m.norm);
  m.activation = read_choice(s, "activation", kActs, m.activation);
  m.embedding_dropout = s.get<float>("embedding_dropout", m.embedding_dropout);
  m.decay_block_norms = s.get<bool>("decay_block_norms", m.decay_block_norms);
  m.value_head = s.get<bool>("value_head", m.value_head);
  m.position_offset = s.get<int>("position_offset", m.position_offset);
  m.post_norm = s.get<bool>("post_norm", m.post_norm);
  m.embed_proj_dim = s.get<int>("embed_proj_dim", m.embed_proj_dim);
  m.position = read_choice(s, "position", kPositions, m.position);
  if (s.has("moe")) read_moe_section(s.section("moe"), m.moe);
  s.mark("moe");
  s.finish(UnknownKeys::Error);
}

void read_data_section(JsonSection s, DataConfig& d) {
  auto paths = [&](const char* key, std::vector<std::string>& out) {
    if (s.has(key) && s.raw().at(key).is_string())
      out = {s.get<std::string>(key, "")};
    else
      out = s.get<std::vector<std::string>>(key, out);
  };
  paths("data_path", d.data_path);
  paths("train_data_path", d.train_data_path);
  paths("valid_data_path", d.valid_data_path);
  paths("test_data_path", d.test_data_path);
  read_fields(s, d, data_fields());
  if (const std::string t = s.get<std::string>("tokenizer_type", ""); !t.empty())
    d.tokenizer_type = data::parse_tokenizer_kind(t, "data.tokenizer_type (--tokenizer-type)");
  s.finish(UnknownKeys::Error);
}

namespace {

// Megatron-style schedule keys; they conflict with a DeepSpeed "scheduler".
constexpr const char* kMegatronScheduleKeys[] = {"lr_decay_style",    "lr_warmup_iters",   "lr_warmup_fraction",
                                                 "lr_decay_iters",    "min_lr",            "lr_warmup_init",
                                                 "lr_warmup_samples", "lr_decay_samples",  "lr_warmup_tokens",
                                                 "lr_decay_tokens",   "lr_wsd_decay_style", "lr_wsd_decay_iters",
                                                 "lr_wsd_decay_samples"};

// Megatron's rules: iteration- and sample-based lengths do not mix (a warmup
// length of 0 is the default and mixes with either).
void check_length_kinds(const JsonSection& s) {
  auto val = [&](const char* k) { return s.raw().value(k, json()).dump(); };
  auto nonzero = [&](const char* k) { return s.has(k) && s.raw().at(k) != 0; };
  const bool samples = nonzero("train_samples");
  DS_USER_CHECK(!(samples && nonzero("train_iters")), "config: training.train_iters {} and training.train_samples "
                "{} (--train-iters / --train-samples): give one of them", val("train_iters"), val("train_samples"));
  DS_USER_CHECK(!(samples && s.has("lr_decay_iters")), "config: training.lr_decay_iters {} with sample-based training "
                "(train_samples {}): use lr_decay_samples (--lr-decay-samples)", val("lr_decay_iters"),
                val("train_samples"));
  DS_USER_CHECK(!(samples && nonzero("lr_warmup_iters")), "config: training.lr_warmup_iters {} with sample-based "
                "training (train_samples {}): use lr_warmup_samples (--lr-warmup-samples)", val("lr_warmup_iters"),
                val("train_samples"));
  DS_USER_CHECK(samples || !s.has("lr_decay_samples"), "config: training.lr_decay_samples {} needs sample-based "
                "training (--train-samples instead of --train-iters)", val("lr_decay_samples"));
  DS_USER_CHECK(samples || !nonzero("lr_warmup_samples"), "config: training.lr_warmup_samples {} needs sample-based "
                "training (--train-samples instead of --train-iters)", val("lr_warmup_samples"));
  for (const char* k : {"lr_warmup_iters", "lr_warmup_samples"})
    DS_USER_CHECK(!(nonzero(k) && s.has("lr_warmup_fraction")),
                  "config: give only one of training.{} ({}) and training.lr_warmup_fraction ({})", k, val(k),
                  val("lr_warmup_fraction"));
}

void read_training_schedule(JsonSection& s, TrainConfig& cfg, bool has_ds_scheduler) {
  OptimizerConfig& o = cfg.optim;
  ScheduleLengths& L = cfg.lengths;
  check_length_kinds(s);
  for (const char* k : kMegatronScheduleKeys) {
    DS_USER_CHECK(!(has_ds_scheduler && s.has(k)),
                  "config: 'training.{}' conflicts with the DeepSpeed 'scheduler' section ({}); use one of them",
                  k, lr_scheduler_name(o.scheduler));
  }
  if (has_ds_scheduler) {
    for (const char* k : kMegatronScheduleKeys) s.mark(k);
    return;
  }
  o.decay = read_choice(s, "lr_decay_style", kDecays, o.decay);
  o.decay_iters = s.get<int64_t>("lr_decay_iters", o.decay_iters);
  o.min_lr = s.get<float>("min_lr", o.min_lr);
  o.warmup_min_lr = s.get<float>("lr_warmup_init", o.warmup_min_lr);
  o.warmup_type = WarmupKind::Linear;
  o.warmup_iters = s.get<int64_t>("lr_warmup_iters", o.warmup_iters);
  L.lr_warmup_samples = s.get<int64_t>("lr_warmup_samples", L.lr_warmup_samples);
  L.lr_decay_samples = s.get<int64_t>("lr_decay_samples", L.lr_decay_samples);
  L.lr_warmup_tokens = s.get<int64_t>("lr_warmup_tokens", L.lr_warmup_tokens);
  L.lr_decay_tokens = s.get<int64_t>("lr_decay_tokens", L.lr_decay_tokens);
  o.wsd_style = read_choice(s, "lr_wsd_decay_style", kWsdStyles, o.wsd_style);
  L.lr_wsd_decay_iters = s.get<int64_t>("lr_wsd_decay_iters", L.lr_wsd_decay_iters);
  L.lr_wsd_decay_samples = s.get<int64_t>("lr_wsd_decay_samples", L.lr_wsd_decay_samples);
  const double frac = s.get<double>("lr_warmup_fraction", 0.0);
  DS_USER_CHECK(frac >= 0.0 && frac <= 1.0, "config: training.lr_warmup_fraction must be in [0, 1], got {}", frac);
  if (frac > 0 && L.sample_based()) {  // Megatron: warmup = fraction of the decay length (rounded down here)
    const int64_t decay = L.lr_decay_samples > 0 ? L.lr_decay_samples : L.train_samples;
    L.lr_warmup_samples = static_cast<int64_t>(frac * static_cast<double>(decay));
  } else if (frac > 0) {
    const int64_t decay = o.decay_iters > 0 ? o.decay_iters : cfg.train_iters;
    o.warmup_iters = static_cast<int64_t>(frac * static_cast<double>(decay));
  }
}

}  // namespace

void read_training_section(JsonSection s, TrainConfig& cfg, bool has_ds_scheduler, bool has_steps_per_print) {
  cfg.train_iters = s.get<int64_t>("train_iters", cfg.train_iters);
  s.mark("distillation");
  if (s.has("distillation")) read_distill_section(s.section("distillation"), cfg.distill);
  cfg.lengths.train_samples = s.get<int64_t>("train_samples", cfg.lengths.train_samples);
  cfg.lengths.train_tokens = s.get<int64_t>("train_tokens", cfg.lengths.train_tokens);
  s.mark("rampup_batch_size");
  if (s.has("rampup_batch_size")) {
    const std::vector<int64_t> r = s.get<std::vector<int64_t>>("rampup_batch_size", {});
    DS_USER_CHECK(r.size() == 3, "training.rampup_batch_size (--rampup-batch-size) needs 3 values: start batch, "
                  "increment, ramp-up samples; got {}", r.size());
    cfg.lengths.rampup = {.start = r[0], .increment = r[1], .samples = r[2]};
    DS_USER_CHECK(r[0] > 0, "training.rampup_batch_size (--rampup-batch-size): the start batch must be positive, "
                  "got {}", r[0]);
  }
  read_fields(s, cfg, training_fields());
  DS_USER_CHECK(!s.has("seed") || s.raw().at("seed").is_number_unsigned() ||
                    (s.raw().at("seed").is_number_integer() && s.raw().at("seed").get<int64_t>() >= 0),
                "config: 'training.seed' (--seed) must be a non-negative integer, got {}", s.raw().value("seed", json()).dump());
  cfg.seed = s.get<uint64_t>("seed", cfg.seed);
  const std::string device = s.get<std::string>("device", cfg.device == DeviceType::CUDA ? "cuda" : "cpu");
  DS_USER_CHECK(device == "cpu" || device == "cuda", "training.device (--device) '{}' must be cpu or cuda", device);
  cfg.device = device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  const std::string attn = s.get<std::string>("attention_backend", attention_backend_name(cfg.attention_backend));
  const auto backend = attention_backend_from_name(attn);
  DS_USER_CHECK(backend.has_value(),
                "training.attention_backend (--attention-backend) '{}' must be flash, flash2, plain or cudnn", attn);
  cfg.attention_backend = *backend;
  LoggingConfig& l = cfg.log;
  // DeepSpeed's steps_per_print is the default for the iteration log line.
  l.log_interval = s.get<int64_t>("log_interval", has_steps_per_print ? l.steps_per_print : l.log_interval);
  DS_USER_CHECK(!l.profile_dir.empty(), "training.profile_dir (--profile-dir) must not be empty");
  DS_USER_CHECK(l.tensorboard_log_interval > 0, "training.tensorboard_log_interval (--tensorboard-log-interval) must "
                "be positive, got {}", l.tensorboard_log_interval);
  read_training_schedule(s, cfg, has_ds_scheduler);
  s.finish(UnknownKeys::Error);
}

void read_parallel_section(JsonSection s, ParallelConfig& p, ZeroConfig& z) {
  read_fields(s, p, parallel_fields());
  const std::string g = s.get<std::string>("recompute_granularity", recompute_granularity_name(p.recompute));
  DS_USER_CHECK(g.empty() || g == "full" || g == "selective",
                "parallel.recompute_granularity '{}' must be \"full\" or \"selective\" (or absent)", g);
  p.recompute = g == "full" ? RecomputeKind::Full : g == "selective" ? RecomputeKind::Selective : RecomputeKind::None;
  // Megatron's flag, not a DeepSpeed key: it lives in our section and drives the ZeRO code.
  z.overlap_param_gather = s.get<bool>("overlap_param_gather", z.overlap_param_gather);
  s.finish(UnknownKeys::Error);
}

}  // namespace ds
