// What DeepSpeed-Chat's training steps share (chat_common.h).
#include "lib/chat/chat_common.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lib/chat/hf_cache.h"
#include "lib/chat/phase_data.h"
#include "lib/ckpt/hf.h"
#include "lib/ckpt/step_names.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_config.h"
#include "lib/core/log.h"
#include "lib/optim/lr_schedule.h"
#include "lib/train/exit_signal.h"
#include "lib/train/trainer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ds::chat {

namespace {

std::string first_existing(const fs::path& dir, std::initializer_list<const char*> names) {
  std::error_code ec;
  for (const char* n : names)
    if (fs::is_regular_file(dir / n, ec)) return (dir / n).string();
  return "";
}

HfSchedule hf_schedule(const std::string& name) {
  for (const auto& [k, n] : kHfScheduleNames)
    if (name == n) return k;
  return HfSchedule::Cosine;  // parse_args checked the choices
}

// The model's dropout as DeepSpeed-Chat trains it: the config's (GPT-2:
// resid_pdrop after the attention and MLP and embd_pdrop on the embeddings,
// attn_pdrop on the attention probabilities; OPT: dropout after the
// attention and MLP, attention_dropout; LLaMA: attention_dropout), with
// --dropout replacing the keys the config has of 'dropout',
// 'attention_dropout', 'hidden_dropout', 'activation_dropout'.
void set_dropout(ModelConfig& m, json& hf, const std::optional<double>& dropout, const std::string& file) {
  if (dropout)
    for (const char* k : {"dropout", "attention_dropout", "hidden_dropout", "activation_dropout"})
      if (hf.contains(k)) hf[k] = *dropout;
  auto value = [&](const char* key, double dflt) {
    if (!hf.contains(key) || hf[key].is_null()) return dflt;
    DS_USER_CHECK(hf[key].is_number(), "'{}': '{}' must be a number", file, key);
    return hf[key].get<double>();
  };
  const std::string type = hf.value("model_type", "");
  if (type == "opt") {  // none on the embeddings; activation_dropout is unused upstream
    m.hidden_dropout = static_cast<float>(value("dropout", 0.1));
    m.attention_dropout = static_cast<float>(value("attention_dropout", 0.0));
    m.embedding_dropout = 0.f;
  } else if (type == "gpt2") {
    const double resid = value("resid_pdrop", 0.1), embd = value("embd_pdrop", 0.1);
    DS_USER_CHECK(resid == embd, "'{}': embd_pdrop {} differs from resid_pdrop {}; dstrain applies one hidden "
                  "dropout to the embeddings and the residual branches", file, embd, resid);
    m.hidden_dropout = static_cast<float>(resid);
    m.attention_dropout = static_cast<float>(value("attn_pdrop", 0.1));
  } else {
    m.hidden_dropout = static_cast<float>(value("hidden_dropout", 0.0));
    m.attention_dropout = static_cast<float>(value("attention_dropout", 0.0));
  }
}

}  // namespace

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  for (const char* n : {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                        "special_tokens_map.json", "added_tokens.json", "tokenizer.model"})
    if (fs::is_regular_file(from / n, ec) && !fs::exists(to / n, ec))
      fs::copy_file(from / n, to / n, ec);
}

RawDataset read_dataset(const std::string& path, const std::string& flag) {
  std::error_code ec;
  fs::path dir;
  if (path.find("local/jsonfile") != std::string::npos) {  // DeepSpeed-Chat's test: a substring
    dir = fs::path(find_local_jsonfile_dir(fs::current_path().string())) / "data";
  } else {
    DS_USER_CHECK(fs::is_directory(path, ec),
                  "{} '{}': dschat reads local/jsonfile or a directory holding train.json and eval.json (JSON Lines "
                  "or a JSON array of objects with prompt, chosen and rejected); Hugging Face Hub datasets are not "
                  "downloaded",
                  flag, path);
    dir = path;
  }
  const std::string train = first_existing(dir, {"train.json", "train.jsonl"});
  const std::string eval = first_existing(dir, {"eval.json", "eval.jsonl"});
  DS_USER_CHECK(!train.empty() && !eval.empty(), "{} '{}': {} needs both train.json and eval.json (or .jsonl)", flag,
                path, dir.string());
  return {read_pair_file(train), read_pair_file(eval)};
}

void load_f32(const Tensor& t, int64_t offset, int64_t n, float* out) {
  DS_CHECK(t.device().is_cpu() && offset >= 0 && offset + n <= t.numel(), "load_f32: [{}, {}) of a {} tensor of {}",
           offset, offset + n, t.device().is_cpu() ? "host" : "device", t.numel());
  switch (t.dtype()) {
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(t.data<uint16_t>()[offset + i]);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(t.data<uint16_t>()[offset + i]);
      return;
    case DType::F32: std::copy_n(t.data<float>() + offset, n, out); return;
    default: DS_CHECK(false, "load_f32: a {} tensor", dtype_name(t.dtype()));
  }
}

void store_f32(const Tensor& t, int64_t offset, int64_t n, const float* in) {
  DS_CHECK(t.device().is_cpu() && offset >= 0 && offset + n <= t.numel(), "store_f32: [{}, {}) of a {} tensor of {}",
           offset, offset + n, t.device().is_cpu() ? "host" : "device", t.numel());
  switch (t.dtype()) {
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[offset + i] = f32_to_bf16(in[i]);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[offset + i] = f32_to_f16(in[i]);
      return;
    case DType::F32: std::copy_n(in, n, t.data<float>() + offset); return;
    default: DS_CHECK(false, "store_f32: a {} tensor", dtype_name(t.dtype()));
  }
}

void say(const std::string& s) {  // DeepSpeed-Chat's print_rank_0
  if (log_rank() != 0) return;
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

std::vector<ArgSpec> training_arg_specs(const char* lr) {
  using K = ArgKind;
  return {
      {"--per_device_train_batch_size", K::Int, "16"},
      {"--per_device_eval_batch_size", K::Int, "16"},
      {"--max_seq_len", K::Int, "512"},
      {"--learning_rate", K::Float, lr},
      {"--weight_decay", K::Float, "0."},
      {"--num_train_epochs", K::Int, "1"},
      {"--gradient_accumulation_steps", K::Int, "1"},
      {"--lr_scheduler_type", K::Str, "cosine",
       {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"}},
      {"--num_warmup_steps", K::Int, "0"},
      {"--output_dir", K::Str, std::nullopt},
      {"--seed", K::Int, "1234"},
      {"--local_rank", K::Int, "-1"},
      {"--gradient_checkpointing", K::Flag},
      {"--dropout", K::Float, std::nullopt},
      {"--offload", K::Flag},
      {"--dtype", K::Str, "fp16", {"fp16", "bf16", "fp32"}},  // fp32: dschat's own (no mixed precision)
      {"--zero_stage", K::Int, "0"},
  };
}

std::vector<ArgSpec> lora_arg_specs() {
  using K = ArgKind;
  return {
      {"--lora_dim", K::Int, "0"},
      {"--lora_module_name", K::Str, "decoder.layers."},
      {"--only_optimize_lora", K::Flag},
      {"--lora_learning_rate", K::Float, "5e-4"},
  };
}

std::vector<ArgSpec> deepspeed_arg_specs() {
  using K = ArgKind;
  return {
      {"--deepspeed", K::Flag},
      {"--deepspeed_config", K::Str, std::nullopt},
      {"--deepscale", K::Flag},
      {"--deepscale_config", K::Str, std::nullopt},
  };
}

void refuse_deepspeed_config(const ParsedArgs& a, const char* prog) {
  DS_USER_CHECK(!a.str("--deepspeed_config") && !a.str("--deepscale_config"),
                "{}: DeepSpeed-Chat builds its DeepSpeed config from the flags and deepspeed.initialize refuses a "
                "second one ('Not sure how to proceed, we were given deepspeed configs in the deepspeed arguments "
                "and deepspeed.initialize() function call'); drop --deepspeed_config", prog);
}

CommonArgs common_args(const ParsedArgs& a, const char* prog) {
  CommonArgs c;
  c.B = *a.integer("--per_device_train_batch_size");
  c.eval_b = *a.integer("--per_device_eval_batch_size");
  c.T = *a.integer("--max_seq_len");
  c.epochs = *a.integer("--num_train_epochs");
  c.ga = *a.integer("--gradient_accumulation_steps");
  c.warmup = *a.integer("--num_warmup_steps");
  DS_USER_CHECK(c.B >= 1 && c.eval_b >= 1, "{}: --per_device_train_batch_size {} and --per_device_eval_batch_size "
                "{} must be at least 1", prog, c.B, c.eval_b);
  DS_USER_CHECK(c.T >= 2, "{}: --max_seq_len {} must be at least 2", prog, c.T);
  DS_USER_CHECK(c.epochs >= 0 && c.ga >= 1 && c.warmup >= 0, "{}: --num_train_epochs {} must be >= 0, "
                "--gradient_accumulation_steps {} >= 1 and --num_warmup_steps {} >= 0", prog, c.epochs, c.ga,
                c.warmup);
  c.seed = *a.integer("--seed");
  DS_USER_CHECK(c.seed >= 0 && c.seed <= 0xffffffffLL, "{}: --seed {} must be between 0 and 2**32 - 1 (numpy's "
                "RandomState splits the data with it)", prog, c.seed);
  c.zero_stage = *a.integer("--zero_stage");
  DS_USER_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3, "{}: --zero_stage {} must be 0, 1, 2 or 3", prog,
                c.zero_stage);
  return c;
}

ChatModel load_chat_model(const ParsedArgs& a, const char* prog, const std::optional<std::string>& eot_token) {
  return load_model_dir(*a.str("--model_name_or_path"), "--model_name_or_path", a.real("--dropout"),
                        *a.integer("--max_seq_len"), prog, eot_token);
}

ChatModel load_model_dir(const std::string& arg_model, const char* flag, const std::optional<double>& dropout,
                         int64_t T, const char* prog, const std::optional<std::string>& eot_token,
                         const ChatModel* tokenizer_of) {
  const fs::path dir = resolve_model_dir(arg_model, flag);
  const fs::path cfg_file = dir / "config.json";
  json hf = parse_json_text(read_small_file(cfg_file.string(), size_t(64) << 20,
                                            std::string(flag) + ": the model's config '" + cfg_file.string() + "'"),
                            "'" + cfg_file.string() + "'");
  DS_USER_CHECK(hf.is_object(), "'{}' is not a JSON object", cfg_file.string());
  const std::string name = hf.contains("_name_or_path") && hf["_name_or_path"].is_string()
                               ? hf["_name_or_path"].get<std::string>()
                               : arg_model;
  ChatModel cm{dir,
               tokenizer_of ? ChatTokenizer::load(tokenizer_of->dir.string(), tokenizer_of->name, eot_token)
                            : ChatTokenizer::load(dir.string(), name, eot_token),
               {}, 0, tokenizer_of ? tokenizer_of->name : name};
  ModelConfig& m = cm.model;
  m = model_config_from_hf(hf, cfg_file.string(), 1, flag);
  set_dropout(m, hf, dropout, cfg_file.string());
  // DeepSpeed-Chat's no-decay names ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight",
  // "ln_f.weight") match every family's norms and biases as Megatron's rule does, except GPT-2's
  // ln_1 / ln_2 weights, which it decays.
  m.decay_block_norms = hf.value("model_type", "") == "gpt2";
  const int64_t vocab = 8 * ceil_div(cm.tok.size(), 8);
  cm.file_vocab = m.vocab_size;
  DS_USER_CHECK(vocab >= cm.file_vocab, "{}: the tokenizer has {} tokens, so DeepSpeed-Chat would shrink the "
                "model's {}-row embedding to {}; dschat only grows it", prog, cm.tok.size(), cm.file_vocab, vocab);
  DS_USER_CHECK(T <= m.max_position_embeddings, "{}: {} holds sequences of {} tokens, longer than the model's {} "
                "positions", prog, flag, T, m.max_position_embeddings);
  m.vocab_size = static_cast<int>(vocab);
  m.padded_vocab_size = static_cast<int>(vocab);
  m.make_vocab_size_divisible_by = 1;
  m.seq_length = static_cast<int>(T);
  return cm;
}

void apply_lora(const ParsedArgs& a, ModelConfig& m, const char* prog) {
  apply_lora(LoraFlags{.dim = *a.integer("--lora_dim"),
                       .module = *a.str("--lora_module_name"),
                       .only_lora = a.flag("--only_optimize_lora"),
                       .lr = *a.real("--lora_learning_rate")},
             *a.real("--learning_rate"), m, prog);
}

void apply_lora(const LoraFlags& f, double lr, ModelConfig& m, const char* prog) {
  const int64_t dim = f.dim;
  const char* dflag = f.dim_flag.c_str();
  const char* mflag = f.module_flag.c_str();
  if (dim <= 0) {
    if (f.only_lora) DS_LOG("--only_optimize_lora without {}: ignored, as DeepSpeed-Chat ignores it", dflag);
    return;
  }
  DS_USER_CHECK(dim <= 65536, "{}: {} {} is larger than any layer", prog, dflag, dim);
  const std::string& module = f.module;
  m.lora.dim = static_cast<int>(dim);
  m.lora.targets = lora_targets_for(m, module, mflag);
  if (m.lora.targets.empty()) {
    DS_USER_CHECK(!f.only_lora, "{}: {} '{}' selects no nn.Linear of the model (GPT-2's layers are Conv1D), so "
                  "--only_optimize_lora would leave nothing to train", prog, mflag, module);
    DS_LOG("{} '{}' selects no nn.Linear of the model (GPT-2's layers are Conv1D): as in DeepSpeed-Chat, LoRA "
           "adapts nothing", mflag, module);
    m.lora = {};
    return;
  }
  const double lora_lr = f.lr;
  DS_USER_CHECK(lr > 0 && lora_lr >= 0, "{}: with LoRA, the learning rate {} must be > 0 and the LoRA learning rate "
                "{} >= 0 (the LoRA tensors' rate is kept as a multiple of the base one)", prog, lr, lora_lr);
  m.lora.lr_scale = static_cast<float>(lora_lr / lr);
  m.lora.only_lora = f.only_lora;
  DS_LOG("LoRA: dimension {} on {} linear layers ('{}'), learning rate {}{}", dim, m.lora.targets.size(), module,
         python_repr(lora_lr), m.lora.only_lora ? "; every other weight frozen (--only_optimize_lora)" : "");
}

TrainFlags train_flags(const ParsedArgs& a, const CommonArgs& c) {
  return {.lr = *a.real("--learning_rate"),
          .weight_decay = *a.real("--weight_decay"),
          .zero_stage = c.zero_stage,
          .B = c.B,
          .ga = c.ga,
          .warmup = c.warmup,
          .seed = c.seed,
          .recompute = a.flag("--gradient_checkpointing"),
          .offload = a.flag("--offload"),
          .tensorboard = a.flag("--enable_tensorboard"),
          .dtype = *a.str("--dtype"),
          .scheduler = *a.str("--lr_scheduler_type"),
          .tensorboard_path = *a.str("--tensorboard_path") + "/ds_tensorboard_logs/"};
}

TrainConfig chat_train_config(const ParsedArgs& a, const ChatModel& cm, const CommonArgs& c, int world,
                              int64_t steps, int64_t sched_total, const char* tb_job, const char* prog) {
  return chat_train_config(train_flags(a, c), cm, world, steps, sched_total, tb_job, prog);
}

TrainConfig chat_train_config(const TrainFlags& f, const ChatModel& cm, int world, int64_t steps,
                              int64_t sched_total, const char* tb_job, const char* prog) {
  const std::string& sched = f.scheduler;
  DS_USER_CHECK(sched != "polynomial" || f.warmup != sched_total,
                "{}: --lr_scheduler_type polynomial with --num_warmup_steps {} equal to the {} training steps "
                "divides by zero in transformers", prog, f.warmup, sched_total);
  const double lr = f.lr;
  DS_USER_CHECK(sched != "polynomial" || lr > 1e-7, "{}: --lr_scheduler_type polynomial needs a learning rate above "
                "its end value 1e-7 (transformers raises ValueError)", prog);
  TrainConfig base;
  base.model = cm.model;
  json j = config_to_json(base);
  const char* offload = f.offload ? "cpu" : "none";
  const CommonArgs c{.B = f.B, .ga = f.ga, .warmup = f.warmup, .seed = f.seed, .zero_stage = f.zero_stage};
  j["train_batch_size"] = c.B * world * c.ga;
  j["train_micro_batch_size_per_gpu"] = c.B;
  j["gradient_accumulation_steps"] = c.ga;
  j["steps_per_print"] = 10;
  j["gradient_clipping"] = 1.0;
  j["prescale_gradients"] = false;
  j["wall_clock_breakdown"] = false;
  j["zero_optimization"] = {{"stage", c.zero_stage},
                            {"overlap_comm", true},
                            // DeepSpeed uses offload_param at stage 3 only (dstrain refuses it elsewhere)
                            {"offload_param", {{"device", c.zero_stage == 3 ? offload : "none"}}},
                            {"offload_optimizer", {{"device", offload}}},
                            {"stage3_param_persistence_threshold", 1e4},
                            {"stage3_max_live_parameters", 3e7},
                            {"stage3_prefetch_bucket_size", 3e7}};
  const std::string& dtype = f.dtype;
  j["fp16"] = {{"enabled", dtype == "fp16"}, {"loss_scale_window", 100}};
  j["bf16"] = {{"enabled", dtype == "bf16"}};
  j["optimizer"] = {{"type", "AdamW"},
                    {"params", {{"lr", lr}, {"betas", {0.9, 0.95}}, {"eps", 1e-8},
                                {"weight_decay", f.weight_decay}}}};
  j.erase("scheduler");
  j["tensorboard"] = {{"enabled", f.tensorboard},
                      {"output_path", f.tensorboard_path},
                      {"job_name", std::string(tb_job) + "_tensorboard"}};
  j["training"]["train_iters"] = steps;
  j["training"]["seed"] = c.seed;
  j["training"]["init_from"] = cm.dir.string();
  j["training"]["log_interval"] = 1;
  j["training"]["eval_interval"] = 0;
  if (f.recompute) j["parallel"]["recompute_granularity"] = "full";
  TrainConfig cfg = train_config_from_json(j, world);
  cfg.optim.scheduler = LrScheduler::Transformers;
  cfg.optim.hf_schedule = hf_schedule(sched);
  cfg.optim.warmup_iters = c.warmup;
  cfg.optim.decay_iters = sched_total;
  cfg.ckpt.init_from_vocab = cm.file_vocab < cm.model.vocab_size ? cm.file_vocab : 0;
  cfg.model.lora = cm.model.lora;  // not a config key
  cfg.data.tokenizer.vocab_size = cm.tok.size();
  cfg.data.tokenizer.bos_id = cm.tok.bos_id();
  cfg.data.tokenizer.eos_id = cm.tok.eos_id();
  cfg.data.tokenizer.pad_id = cm.tok.pad_id();
  return cfg;
}

void export_into(Trainer& trainer, const fs::path& out, const fs::path& model_dir, int rank) {
  std::error_code ec;
  const fs::path tmp = out / ".dschat_export.tmp";
  if (rank == 0) {
    fs::create_directories(out, ec);
    DS_USER_CHECK(!ec, "--output_dir '{}': cannot create it: {}", out.string(), ec.message());
    fs::remove_all(tmp, ec);  // what an interrupted save left
  }
  trainer.export_hf(tmp.string());  // collective; rank 0 writes
  if (rank != 0) return;
  copy_tokenizer_files(model_dir, tmp);
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    fs::rename(e.path(), out / e.path().filename(), ec);
    DS_USER_CHECK(!ec, "--output_dir '{}': cannot move '{}' into it: {}", out.string(), e.path().string(),
                  ec.message());
  }
  fs::remove_all(tmp, ec);
}


void keep_newest_checkpoint(const fs::path& dir, int64_t keep) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with("global_step") && e.path().filename() != step_dir_name(keep))
      fs::remove_all(e.path(), ec);
}

EpochCheckpoint::EpochCheckpoint(const std::optional<std::string>& dir, const char* step, const char* prog)
    : step_(step), prog_(prog) {
  if (!dir) return;
  dir_ = *dir;
  DS_USER_CHECK(!dir_.empty(), "{}: --checkpoint_dir: give a directory", prog);
  const fs::path f = fs::path(dir_) / "dschat_state.json";
  const std::string what = "--checkpoint_dir '" + f.string() + "'";
  std::error_code ec;
  state_ = {{"step", step_}, {"epochs", nlohmann::json::object()}};
  fs::create_directories(dir_, ec);
  DS_USER_CHECK(!ec, "--checkpoint_dir '{}': cannot create it: {}", dir_, ec.message());
  if (fs::exists(f, ec)) {
    const nlohmann::json j = parse_json_text(read_small_file(f.string(), size_t(1) << 20, what), what);
    DS_USER_CHECK(j.is_object() && j.contains("step") && j["step"].is_string() && j.contains("epochs") &&
                      j["epochs"].is_object(),
                  "{}: not a dschat checkpoint record (a \"step\" and an \"epochs\" object)", what);
    DS_USER_CHECK(j["step"] == step_, "{} records a checkpoint of dschat {}, not of dschat {}", what,
                  j["step"].get<std::string>(), step_);
    for (const auto& [it, e] : j["epochs"].items())
      DS_USER_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0, "{}: epochs of iteration {} must be a count", what,
                    it);
    DS_USER_CHECK(fs::exists(fs::path(dir_) / "model" / "latest", ec), "{}: there is no model checkpoint beside it "
                  "(model/latest)", what);
    state_ = j;
    resume_ = true;
  }
  install_exit_signal_handler();
}

void EpochCheckpoint::configure(TrainConfig& cfg) const {
  if (!on()) return;
  cfg.ckpt.save_dir = (fs::path(dir_) / "model").string();
  if (resume_) cfg.ckpt.load_dir = cfg.ckpt.save_dir;
}

int64_t EpochCheckpoint::resume(const Trainer& t) {
  if (!resume_) return 0;
  saved_iteration_ = t.state().iteration;
  const std::string it = std::to_string(saved_iteration_);
  DS_USER_CHECK(state_["epochs"].contains(it), "--checkpoint_dir '{}': the model checkpoint is at iteration {}, which "
                "dschat_state.json does not record", dir_, it);
  const int64_t done = state_["epochs"][it].get<int64_t>();
  say(fmt::format("resuming from --checkpoint_dir {}: {} epoch(s) done, iteration {}", dir_, done, it));
  return done;
}

bool EpochCheckpoint::end_of_epoch(Trainer& t, int64_t done, Communicator& world) {
  if (!on()) return false;
  const int64_t it = t.state().iteration;
  // The record first, naming the checkpoint on disk and the one about to be
  // written: a save interrupted before its commit leaves the older one, which
  // it still names.
  if (world.rank() == 0) {
    nlohmann::json epochs = nlohmann::json::object();
    const std::string prev = std::to_string(saved_iteration_);
    if (saved_iteration_ >= 0 && state_["epochs"].contains(prev)) epochs[prev] = state_["epochs"][prev];
    epochs[std::to_string(it)] = done;
    state_["epochs"] = epochs;
    write_file_atomic((fs::path(dir_) / "dschat_state.json").string(), state_.dump(1) + "\n");
  }
  if (it != saved_iteration_) {  // an epoch without an optimizer step changed nothing the trainer saves
    t.save_checkpoint();
    saved_iteration_ = it;
    if (world.rank() == 0) keep_newest_checkpoint(fs::path(dir_) / "model", it);
  }
  world.barrier();
  const double stop = world.all_reduce_scalar(exit_signal_received() ? 1.0 : 0.0, Device::cpu(), ReduceOp::Max);
  if (stop > 0)
    say(fmt::format("SIGTERM: stopping after epoch {}, its checkpoint in {}; run the same command again to continue",
                    done, dir_));
  return stop > 0;
}

}  // namespace ds::chat
