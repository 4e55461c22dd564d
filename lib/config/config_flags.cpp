// dstrain's command line (CLI11): --config FILE plus Megatron-style flags.
// Each flag becomes a patch over the config JSON, so flags and file share one
// reader and "flags override the file" is simply the order of the merge.
// Most flags map 1:1 onto a JSON key (the table below, also the --help text);
// the LR-schedule, precision and batch flags need a little logic (apply_*).
#include <algorithm>
#include <cmath>
#include <CLI/CLI.hpp>
#include <map>
#include <optional>

#include "lib/config/config_internal.h"

namespace ds {

using nlohmann::json;

namespace {

enum class FlagKind { Int, Float, String, List, Const };

struct FlagSpec {
  const char* name;
  const char* pointer;  // JSON pointer into the config
  FlagKind kind;
  const char* help;
  const char* extra = nullptr;  // Const: the JSON value; String: "a|b|c" allowed values
};

constexpr FlagSpec kTable[] = {
    {"--model-family", "/model/family", FlagKind::String, "gpt2 or llama (sets family defaults)", "gpt2|llama"},
    {"--num-layers", "/model/num_layers", FlagKind::Int, "number of transformer layers (L)"},
    {"--hidden-size", "/model/hidden_size", FlagKind::Int, "hidden size (C)"},
    {"--ffn-hidden-size", "/model/ffn_hidden_size", FlagKind::Int, "MLP hidden size (default 4*C; SwiGLU 8C/3 rounded down to 64)"},
    {"--num-attention-heads", "/model/num_heads", FlagKind::Int, "attention heads (NH)"},
    {"--num-key-value-heads", "/model/num_key_value_heads", FlagKind::Int,
     "key/value heads: grouped-query attention when fewer than NH, which they must divide (default NH)"},
    {"--seq-length", "/model/seq_length", FlagKind::Int, "sequence length (T)"},
    {"--max-position-embeddings", "/model/max_position_embeddings", FlagKind::Int, "learned position table size (default: seq length)"},
    {"--make-vocab-size-divisible-by", "/model/make_vocab_size_divisible_by", FlagKind::Int, "pad the vocabulary to a multiple of this times TP"},
    {"--init-method-std", "/model/init_method_std", FlagKind::Float, "std of the normal weight init"},
    {"--rotary-base", "/model/rope_theta", FlagKind::Float, "RoPE theta"},
    {"--rotary-position-embeddings-theta", "/model/rope_theta", FlagKind::Float, "RoPE theta (= --rotary-base)"},
    {"--rotary-percent", "/model/rotary_percent", FlagKind::Float,
     "fraction of each head's dims rotated by RoPE (the first int(HS * p); default 1.0)"},
    {"--norm-epsilon", "/model/norm_eps", FlagKind::Float, "LayerNorm/RMSNorm epsilon"},
    {"--hidden-dropout", "/model/hidden_dropout", FlagKind::Float,
     "dropout probability of the embedding and of each attention / MLP output in training (default 0.1)"},
    {"--attention-dropout", "/model/attention_dropout", FlagKind::Float,
     "dropout probability of the attention softmax in training (default 0.1)"},
    {"--normalization", "/model/norm", FlagKind::String, "LayerNorm or RMSNorm", "LayerNorm|RMSNorm"},
    {"--swiglu", "/model/activation", FlagKind::Const, "SwiGLU MLP instead of GELU", "\"swiglu\""},
    {"--untie-embeddings-and-output-weights", "/model/untie_embeddings", FlagKind::Const, "separate output layer", "true"},
    {"--disable-bias-linear", "/model/bias", FlagKind::Const, "no biases in linear layers", "false"},
    {"--micro-batch-size", "/train_micro_batch_size_per_gpu", FlagKind::Int, "micro batch per GPU (= train_micro_batch_size_per_gpu)"},
    {"--global-batch-size", "/train_batch_size", FlagKind::Int, "global batch (= train_batch_size)"},
    {"--train-iters", "/training/train_iters", FlagKind::Int, "optimizer steps to train"},
    {"--train-samples", "/training/train_samples", FlagKind::Int,
     "samples to train (sample-based training: train iters = samples / global batch)"},
    {"--train-tokens", "/training/train_tokens", FlagKind::Int, "also stop once this many tokens were consumed"},
    {"--lr-warmup-samples", "/training/lr_warmup_samples", FlagKind::Int, "linear warmup samples (sample-based training)"},
    {"--lr-decay-samples", "/training/lr_decay_samples", FlagKind::Int,
     "decay length in samples (sample-based training; default: train samples)"},
    {"--lr-warmup-tokens", "/training/lr_warmup_tokens", FlagKind::Int, "linear warmup over this many tokens"},
    {"--lr-wsd-decay-iters", "/training/lr_wsd_decay_iters", FlagKind::Int,
     "WSD: iterations of the final decay (the last ones of the decay length)"},
    {"--lr-wsd-decay-samples", "/training/lr_wsd_decay_samples", FlagKind::Int,
     "WSD: samples of the final decay (sample-based training)"},
    {"--lr-decay-tokens", "/training/lr_decay_tokens", FlagKind::Int,
     "decay over this many tokens (instead of iterations or samples)"},
    {"--override-opt_param-scheduler", "/training/override_opt_param_scheduler", FlagKind::Const,
     "on resume, take the learning-rate schedule from the flags even where the checkpoint's differs", "true"},
    {"--use-checkpoint-opt_param-scheduler", "/training/use_checkpoint_opt_param_scheduler", FlagKind::Const,
     "on resume, take the learning-rate schedule from the checkpoint", "true"},
    {"--exit-signal-handler", "/training/exit_signal_handler", FlagKind::Const,
     "on SIGTERM, save a checkpoint (with --save) and stop", "true"},
    {"--exit-interval", "/training/exit_interval", FlagKind::Int,
     "stop (after saving) once the iteration is a multiple of this; the schedule still spans --train-iters"},
    {"--max-nan-iterations", "/training/max_nan_iterations", FlagKind::Int,
     "stop with an error after this many iterations in a row with a non-finite loss or gradient norm"},
    {"--seed", "/training/seed", FlagKind::Int, "random seed"},
    {"--device", "/training/device", FlagKind::String, "cpu or cuda", "cpu|cuda"},
    {"--attention-backend", "/training/attention_backend", FlagKind::String,
     "CUDA attention: flash (ours), flash2 (ours, register-resident; opt-in until verified on a device), "
     "plain (unfused, for debugging) or cudnn",
     "flash|flash2|plain|cudnn"},
    {"--cuda-graph", "/training/cuda_graph", FlagKind::Const,
     "capture the steady-state step (up to its one host read, the optimizer update included) in a CUDA graph "
     "and replay it (one GPU, static shapes)", "true"},
    {"--enable-cuda-graph", "/training/cuda_graph", FlagKind::Const, "Megatron's name for --cuda-graph", "true"},
    {"--cuda-graph-warmup-steps", "/training/cuda_graph_warmup", FlagKind::Int,
     "with --cuda-graph: eager steps before the capture (default 2)"},
    {"--save", "/training/save", FlagKind::String, "checkpoint directory to save into"},
    {"--load", "/training/load", FlagKind::String, "checkpoint directory to resume from"},
    {"--save-interval", "/training/save_interval", FlagKind::Int, "save every N iterations (0 = no periodic saves)"},
    {"--eval-interval", "/training/eval_interval", FlagKind::Int, "validate every N iterations (0 = never)"},
    {"--eval-iters", "/training/eval_iters", FlagKind::Int, "validation batches per evaluation"},
    {"--log-interval", "/training/log_interval", FlagKind::Int, "log every N iterations"},
    {"--profile", "/training/profile", FlagKind::Const,
     "log host synchronisations per step and write a compute/communication timeline of one step", "true"},
    {"--profile-dir", "/training/profile_dir", FlagKind::String,
     "with --profile: directory for timeline_rank<R>.json (Chrome trace; default: the current directory)"},
    {"--init-from", "/training/init_from", FlagKind::String,
     "start from Hugging Face weights: model.safetensors or pytorch_model.bin, or a directory holding one"},
    {"--export-hf", "/training/export_hf", FlagKind::String, "write a Hugging Face model directory here"},
    {"--tensorboard-dir", "/training/tensorboard_dir", FlagKind::String, "write TensorBoard event files here"},
    {"--tensorboard-log-interval", "/training/tensorboard_log_interval", FlagKind::Int,
     "write the training scalars to TensorBoard every N iterations"},
    {"--log-timers-to-tensorboard", "/training/log_timers_to_tensorboard", FlagKind::Const,
     "TensorBoard: iteration time", "true"},
    {"--log-batch-size-to-tensorboard", "/training/log_batch_size_to_tensorboard", FlagKind::Const,
     "TensorBoard: global batch size", "true"},
    {"--log-validation-ppl-to-tensorboard", "/training/log_validation_ppl_to_tensorboard", FlagKind::Const,
     "TensorBoard: validation perplexity", "true"},
    {"--log-optimizer-states-to-tensorboard", "/training/log_optimizer_states_to_tensorboard", FlagKind::Const,
     "TensorBoard: l1 / l2 norms and absolute maxima of Adam's moments and the weights (collective, each interval)",
     "true"},
    {"--log-world-size-to-tensorboard", "/training/log_world_size_to_tensorboard", FlagKind::Const,
     "TensorBoard: world size", "true"},
    {"--no-log-learnig-rate-to-tensorboard", "/training/log_learning_rate_to_tensorboard", FlagKind::Const,
     "TensorBoard: no learning rate (Megatron-DeepSpeed's spelling)", "false"},
    {"--no-log-loss-scale-to-tensorboard", "/training/log_loss_scale_to_tensorboard", FlagKind::Const,
     "TensorBoard: no loss scale", "false"},
    {"--cpu-peak-tflops", "/training/cpu_peak_tflops", FlagKind::Float, "CPU peak TFLOP/s for MFU (0 = no MFU)"},
    {"--estimate-memory", "/training/estimate_memory", FlagKind::Const, "print the memory estimate and exit", "true"},
    {"--weight-decay", "/optimizer/params/weight_decay", FlagKind::Float, "AdamW weight decay"},
    {"--adam-eps", "/optimizer/params/eps", FlagKind::Float, "Adam epsilon"},
    {"--clip-grad", "/gradient_clipping", FlagKind::Float, "global grad-norm clip (0 = off)"},
    {"--loss-scale", "/fp16/loss_scale", FlagKind::Float, "fp16 static loss scale (0 = dynamic)"},
    {"--min-loss-scale", "/fp16/min_loss_scale", FlagKind::Float, "fp16 dynamic loss scale floor"},
    {"--loss-scale-window", "/fp16/loss_scale_window", FlagKind::Int, "fp16 steps without overflow before raising the scale"},
    {"--hysteresis", "/fp16/hysteresis", FlagKind::Int, "fp16 overflows tolerated before lowering the scale"},
    {"--tensor-model-parallel-size", "/parallel/tensor_model_parallel_size", FlagKind::Int, "TP"},
    {"--pipeline-model-parallel-size", "/parallel/pipeline_model_parallel_size", FlagKind::Int, "PP"},
    {"--sequence-parallel", "/parallel/sequence_parallel", FlagKind::Const, "Megatron sequence parallelism (needs TP > 1)", "true"},
    {"--ds-sequence-parallel-size", "/parallel/ds_sequence_parallel_size", FlagKind::Int, "DeepSpeed-Ulysses sequence parallel size (SP)"},
    {"--num-layers-per-virtual-pipeline-stage", "/parallel/num_layers_per_virtual_pipeline_stage", FlagKind::Int, "interleaved 1F1B chunk size"},
    {"--enable-zbh1-pipeline", "/parallel/zbh1_pipeline", FlagKind::Const,
     "zero-bubble ZB-H1 pipeline schedule (backward split into input and weight passes)", "true"},
    {"--enable-zbh1-exact-semantics", "/parallel/zbh1_exact_semantics", FlagKind::Const,
     "ZB-H1 with every weight pass split off, so gradients sum in 1F1B's order", "true"},
    {"--recompute-granularity", "/parallel/recompute_granularity", FlagKind::String, "activation recomputation", "full|selective"},
    {"--recompute-activations", "/parallel/recompute_granularity", FlagKind::Const, "same as --recompute-granularity selective", "\"selective\""},
    {"--recompute-num-layers", "/parallel/recompute_num_layers", FlagKind::Int, "layers recomputed per stage with full recomputation"},
    {"--zero-stage", "/zero_optimization/stage", FlagKind::Int, "ZeRO stage 0-3"},
    {"--overlap-grad-reduce", "/zero_optimization/overlap_comm", FlagKind::Const,
     "reduce gradient buckets during the backward pass (DeepSpeed's overlap_comm)", "true"},
    {"--overlap-param-gather", "/parallel/overlap_param_gather", FlagKind::Const,
     "ZeRO 1/2: all-gather the updated parameters while the next forward runs", "true"},
    {"--data-path", "/data/data_path", FlagKind::List, "dataset prefix(es): PREFIX or W1 PREFIX1 W2 PREFIX2 ..."},
    {"--train-data-path", "/data/train_data_path", FlagKind::List, "training datasets (instead of --data-path + --split)"},
    {"--valid-data-path", "/data/valid_data_path", FlagKind::List, "validation datasets (with --train-data-path)"},
    {"--test-data-path", "/data/test_data_path", FlagKind::List, "test datasets (with --train-data-path; checked, not evaluated)"},
    {"--split", "/data/split", FlagKind::String, "train,valid,test weights, e.g. 949,50,1"},
    {"--vocab-file", "/data/vocab_file", FlagKind::String, "GPT-2 vocab.json"},
    {"--merge-file", "/data/merge_file", FlagKind::String, "GPT-2 merges.txt"},
    {"--tokenizer-type", "/data/tokenizer_type", FlagKind::String, "tokenizer kind",
     "GPT2BPETokenizer|GPTSentencePieceTokenizer|Llama2Tokenizer|SentencePieceTokenizer|HFTokenizer"},
    {"--tokenizer-model", "/data/tokenizer_model", FlagKind::String, "tokenizer.model, or tokenizer.json / its directory"},
};

std::vector<std::string> split_choices(const char* s) {
  std::vector<std::string> out(1);
  for (const char* p = s; *p; ++p) {
    if (*p == '|') out.emplace_back();
    else out.back() += *p;
  }
  return out;
}

// What the command line said, before it is applied to the file.
struct ParsedFlags {
  std::string config_path;
  std::vector<std::pair<const FlagSpec*, json>> table;  // in table order
  std::map<std::string, json> special;                  // flag name -> value
};

void add_table_flag(CLI::App& app, const FlagSpec& f, ParsedFlags& out) {
  auto put = [&out, &f](json v) { out.table.emplace_back(&f, std::move(v)); };
  CLI::Option* o = nullptr;
  switch (f.kind) {
    case FlagKind::Int: o = app.add_option_function<int64_t>(f.name, [put](const int64_t& v) { put(v); }, f.help); break;
    case FlagKind::Float: o = app.add_option_function<double>(f.name, [put](const double& v) { put(v); }, f.help); break;
    case FlagKind::String:
      o = app.add_option_function<std::string>(f.name, [put](const std::string& v) { put(v); }, f.help);
      // --normalization: Megatron scripts write rmsnorm / layernorm (the JSON reader ignores case too).
      if (f.extra) o->check(CLI::IsMember(split_choices(f.extra), CLI::ignore_case));
      break;
    case FlagKind::List:
      o = app.add_option_function<std::vector<std::string>>(
          f.name, [put](const std::vector<std::string>& v) { put(v); }, f.help);
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // all values (repeats were dropped before)
      break;
    case FlagKind::Const:
      app.add_flag_function(f.name, [put, &f](int64_t) { put(json::parse(f.extra)); }, f.help);
      break;
  }
}

void add_special_flags(CLI::App& app, ParsedFlags& out) {
  auto num = [&](const char* name, const char* help) {
    app.add_option_function<double>(name, [&out, name](const double& v) { out.special[name] = v; }, help);
  };
  auto integer = [&](const char* name, const char* help) {
    app.add_option_function<int64_t>(name, [&out, name](const int64_t& v) { out.special[name] = v; }, help);
  };
  auto flag = [&](const char* name, const char* help) {
    app.add_flag_function(name, [&out, name](int64_t) { out.special[name] = true; }, help);
  };
  num("--lr", "peak learning rate");
  num("--min-lr", "learning rate at the end of the decay");
  app.add_option_function<std::string>(
         "--lr-decay-style", [&out](const std::string& v) { out.special["--lr-decay-style"] = v; },
         "constant, linear, cosine, inverse-square-root or WSD (replaces a config 'scheduler')")
      ->check(CLI::IsMember({"constant", "linear", "cosine", "inverse-square-root", "WSD"}));
  app.add_option_function<std::string>(
         "--lr-wsd-decay-style", [&out](const std::string& v) { out.special["--lr-wsd-decay-style"] = v; },
         "WSD's final decay: exponential (Megatron's default), linear, cosine or minus_sqrt")
      ->check(CLI::IsMember({"exponential", "linear", "cosine", "minus_sqrt"}));
  app.add_option_function<std::string>(
         "--position-embedding-type",
         [&out](const std::string& v) { out.special["--position-embedding-type"] = v == "rope" ? "rope" : "learned"; },
         "learned_absolute or rope")
      ->check(CLI::IsMember({"learned_absolute", "rope"}));
  integer("--lr-warmup-iters", "linear warmup steps");
  integer("--lr-decay-iters", "decay length (default: train iters)");
  num("--lr-warmup-fraction", "warmup as a fraction of the decay length");
  num("--lr-warmup-init", "learning rate at the start of warmup");
  num("--adam-beta1", "Adam beta1");
  num("--adam-beta2", "Adam beta2");
  flag("--bf16", "bf16 mixed precision");
  flag("--fp16", "fp16 mixed precision with loss scaling");
  num("--initial-loss-scale", "fp16 initial dynamic loss scale, a power of two (fp16.initial_scale_power)");
}

// Flags that are accepted for compatibility and change nothing.
void add_ignored_flags(CLI::App& app, bool& deepspeed) {
  app.add_option_function<int>("--local_rank", [](const int&) {},
                               "set by launchers; dstrain reads LOCAL_RANK from the environment");
  app.add_flag("--deepspeed", deepspeed)
      ->description("the DeepSpeed engine's settings (ZeRO stage, clipping, fp16 loss scaling, the precision) come "
                    "from the config file, with DeepSpeed's defaults where it is silent, and the optimizer is "
                    "Megatron's from its flags (the config's optimizer section is not used), as in "
                    "Megatron-DeepSpeed");
  app.add_flag("--use-flash-attn")->description("accepted; flash attention is used on CUDA whenever it applies");
  app.add_option("--distributed-backend", "accepted; the backend follows --device (NCCL on cuda, Gloo on cpu)")
      ->check(CLI::IsMember({"nccl", "gloo"}));
}

// The config's DeepSpeed scheduler type, or "" when it has none.
std::string scheduler_type(const json& j) {
  if (!j.contains("scheduler") || !j["scheduler"].is_object()) return "";
  const json& t = j["scheduler"].value("type", json(""));
  return t.is_string() ? t.get<std::string>() : t.dump();
}

void apply_schedule_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  auto has = [&](const char* k) { return sp.count(k) > 0; };
  if (has("--lr-decay-style")) {
    if (!scheduler_type(j).empty())
      add_warning(w, fmt::format("--lr-decay-style replaces the config's scheduler ({}) with the Megatron schedule",
                                 scheduler_type(j)));
    j.erase("scheduler");
    set_at(j, "/training/lr_decay_style", sp.at("--lr-decay-style"), "--lr-decay-style");
  }
  const std::string st = scheduler_type(j);
  const bool ds = !st.empty();
  if (has("--lr")) {
    set_at(j, "/optimizer/params/lr", sp.at("--lr"), "--lr");
    if (st == "WarmupLR" || st == "WarmupDecayLR") set_at(j, "/scheduler/params/warmup_max_lr", sp.at("--lr"), "--lr");
  }
  for (const char* k : {"--min-lr", "--lr-warmup-fraction"})
    DS_USER_CHECK(!(ds && has(k)), "{} does not apply to the config's scheduler {}; add --lr-decay-style to "
                  "use the Megatron schedule instead", k, st);
  for (const char* k : {"--lr-warmup-iters", "--lr-decay-iters", "--lr-warmup-init"})
    DS_USER_CHECK(!((st == "OneCycle" || st == "LRRangeTest") && has(k)), "{} does not apply to the config's "
                  "scheduler {} (set its own scheduler.params); add --lr-decay-style to use the Megatron schedule "
                  "instead", k, st);
  DS_USER_CHECK(!(st == "WarmupLR" && has("--lr-decay-iters")), "--lr-decay-iters: the config's scheduler WarmupLR "
                "does not decay; add --lr-decay-style to use the Megatron schedule");
  DS_USER_CHECK(!(st == "WarmupCosineLR" && has("--lr-warmup-init")), "--lr-warmup-init: the config's scheduler "
                "WarmupCosineLR starts from scheduler.params.warmup_min_ratio; set that instead");
  const char* warm = ds ? "/scheduler/params/warmup_num_steps" : "/training/lr_warmup_iters";
  const char* decay = ds ? "/scheduler/params/total_num_steps" : "/training/lr_decay_iters";
  const char* init = ds ? "/scheduler/params/warmup_min_lr" : "/training/lr_warmup_init";
  if (has("--lr-warmup-iters")) set_at(j, warm, sp.at("--lr-warmup-iters"), "--lr-warmup-iters");
  if (has("--lr-decay-iters")) set_at(j, decay, sp.at("--lr-decay-iters"), "--lr-decay-iters");
  if (has("--lr-warmup-init")) set_at(j, init, sp.at("--lr-warmup-init"), "--lr-warmup-init");
  if (has("--min-lr")) set_at(j, "/training/min_lr", sp.at("--min-lr"), "--min-lr");
  if (has("--lr-warmup-fraction"))
    set_at(j, "/training/lr_warmup_fraction", sp.at("--lr-warmup-fraction"), "--lr-warmup-fraction");
  if (has("--lr-wsd-decay-style"))
    set_at(j, "/training/lr_wsd_decay_style", sp.at("--lr-wsd-decay-style"), "--lr-wsd-decay-style");
}

// Whether the config enables section `sec` ("fp16", "bf16", "bfloat16").
bool enables(const json& j, const char* sec) {
  const json::json_pointer p(std::string("/") + sec + "/enabled");
  return j.contains(p) && j.at(p) == true;
}

// Megatron-DeepSpeed (--deepspeed) builds Megatron's own optimizer from its
// flags and hands it to deepspeed.initialize, whose engine then uses it and
// never reads the config's `optimizer` section (megatron/optimizer and
// training.py). So the section is dropped with one line, and the optimizer
// starts from Megatron's defaults (AdamW, betas (0.9, 0.999), eps 1e-8,
// weight decay 0.01) for the flags to override; --lr keeps dstrain's default
// where Megatron has none. The config's scheduler section still replaces
// Megatron's schedule (the engine prefers its configured scheduler).
void use_megatron_optimizer(json& j, Warnings& w) {
  if (j.contains("optimizer"))
    add_warning(w, "config: the 'optimizer' section is not used with --deepspeed: as in Megatron-DeepSpeed the "
                   "optimizer is Megatron's, from --optimizer, --lr, --adam-beta1/--adam-beta2, --adam-eps, "
                   "--weight-decay and --sgd-momentum (Megatron's defaults where a flag is absent)");
  j["optimizer"] = {{"params", {{"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}};
}

// engine_config: --deepspeed with a config file (the DeepSpeed engine reads it).
void apply_other_flags(json& j, const std::map<std::string, json>& sp, bool engine_config, Warnings& w) {
  auto has = [&](const char* k) { return sp.count(k) > 0; };
  if (has("--adam-beta1") || has("--adam-beta2")) {
    json betas = j.value(json::json_pointer("/optimizer/params/betas"), json());
    if (!betas.is_array() || betas.size() != 2) betas = {OptimizerConfig{}.beta1, OptimizerConfig{}.beta2};
    if (has("--adam-beta1")) betas[0] = sp.at("--adam-beta1");
    if (has("--adam-beta2")) betas[1] = sp.at("--adam-beta2");
    set_at(j, "/optimizer/params/betas", betas, "--adam-beta1/--adam-beta2");
  }
  if (has("--position-embedding-type"))
    set_at(j, "/model/position", sp.at("--position-embedding-type"), "--position-embedding-type");
  // A precision flag wins over the file; both flags together are an error
  // later. Under --deepspeed with a config file the engine trains in the
  // dtype its config enables (it casts the model whatever Megatron's flag
  // made of it): a flag for the other dtype is overruled, with a warning.
  const bool file_bf16 = enables(j, "bf16") || enables(j, "bfloat16"), file_fp16 = enables(j, "fp16");
  const bool one_flag = has("--bf16") != has("--fp16");
  if (engine_config && one_flag && (has("--fp16") ? file_bf16 : file_fp16)) {
    add_warning(w, fmt::format("{} is overruled by the DeepSpeed config, which enables {}: with --deepspeed the "
                               "engine trains in the config's precision, as in Megatron-DeepSpeed",
                               has("--fp16") ? "--fp16" : "--bf16", has("--fp16") ? "bf16" : "fp16"));
  } else {
    if (has("--bf16")) set_at(j, "/bf16/enabled", true, "--bf16");
    if (has("--fp16")) set_at(j, "/fp16/enabled", true, "--fp16");
    if (has("--bf16") && !has("--fp16") && j.contains("fp16")) set_at(j, "/fp16/enabled", false, "--bf16");
    if (has("--fp16") && !has("--bf16"))
      for (const char* b : {"bf16", "bfloat16"})
        if (j.contains(b)) set_at(j, std::string("/") + b + "/enabled", false, "--fp16");
  }
  if (has("--initial-loss-scale")) {  // Megatron gives the scale, DeepSpeed its power of two
    const double s = sp.at("--initial-loss-scale").get<double>();
    int e = 0;
    DS_USER_CHECK(s > 0 && std::frexp(s, &e) == 0.5, "--initial-loss-scale {} must be a power of two (2^k)", s);
    set_at(j, "/fp16/initial_scale_power", e - 1, "--initial-loss-scale");
  }
}

// Settings the DeepSpeed engine owns: under Megatron-DeepSpeed the DeepSpeed
// config decides them and the Megatron flag does not reach the engine. Where a
// config file sets one and the flag disagrees, the file wins with a warning.
// With --deepspeed (the engine on, as in every Megatron-DeepSpeed script) a
// key the file leaves out has DeepSpeed's default, which wins the same way;
// the fp16 keys only where the file has an fp16 section. The default is
// written into the file's JSON then.
bool deepspeed_config_wins(json& file, const FlagSpec& f, const json& flag_value, bool deepspeed, Warnings& w) {
  static const std::pair<std::string, double> kOwned[] = {
      {"/zero_optimization/stage", 0}, {"/gradient_clipping", 0},  {"/fp16/loss_scale", 0},
      {"/fp16/min_loss_scale", 1},     {"/fp16/loss_scale_window", 1000}, {"/fp16/hysteresis", 2}};
  const auto owned = std::find_if(std::begin(kOwned), std::end(kOwned),
                                  [&](const auto& k) { return k.first == f.pointer; });
  if (owned == std::end(kOwned)) return false;
  const json::json_pointer ptr(f.pointer);
  const bool fp16_key = owned->first.rfind("/fp16/", 0) == 0;
  const bool by_default = deepspeed && !file.contains(ptr) && (!fp16_key || file.contains("fp16"));
  if (!file.contains(ptr) && !by_default) return false;
  if (by_default) file[ptr] = owned->second;  // dstrain's own default may differ (e.g. clipping 1.0)
  const json in_file = file.at(ptr);
  const bool same = in_file.is_number() && flag_value.is_number() ? in_file.get<double>() == flag_value.get<double>()
                                                                   : in_file == flag_value;
  if (same) return true;
  add_warning(w, fmt::format("{} {} differs from the DeepSpeed config's {} {}{}; the DeepSpeed config wins, as in "
                             "Megatron-DeepSpeed", f.name, flag_value.dump(), std::string(f.pointer).substr(1),
                             in_file.dump(), by_default ? " (DeepSpeed's default: the file does not set it)" : ""));
  return true;
}

// argparse semantics for repeated flags: the last occurrence wins. For a list
// flag (--data-path A B --data-path C) the earlier occurrences and their values
// are dropped here, since CLI11 would join them; single-valued options use
// CLI11's TakeLast policy.
std::vector<std::string> drop_repeated_list_flags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (const FlagSpec& f : kTable) {
    if (f.kind != FlagKind::List) continue;
    const std::string name = f.name, eq = name + "=";
    auto is_flag = [&](const std::string& a) { return a == name || a.rfind(eq, 0) == 0; };
    int count = 0;
    for (const std::string& a : args) count += is_flag(a) ? 1 : 0;
    for (size_t i = 1; i < args.size() && count > 1;) {
      if (!is_flag(args[i])) {
        ++i;
        continue;
      }
      size_t end = i + 1;
      if (args[i] == name)
        while (end < args.size() && args[end].rfind("--", 0) != 0) ++end;
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(end));
      --count;
    }
  }
  return args;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> table_flags() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const FlagSpec& f : kTable) out.emplace_back(f.name, f.pointer);
  return out;
}

void set_at(json& j, const std::string& pointer, const json& v, const std::string& flag) {
  // Every parent on the way must be an object (a config with "model": [1]
  // is the file's error, not the flag's).
  const json::json_pointer ptr(pointer);
  for (json::json_pointer parent = ptr.parent_pointer(); !parent.empty(); parent = parent.parent_pointer()) {
    if (!j.contains(parent) || j.at(parent).is_object()) continue;
    std::string key = parent.to_string().substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    DS_USER_ERROR("config: '{}' must be a JSON object, got {} (so {} cannot set it)", key, j.at(parent).dump(), flag);
  }
  try {
    j[ptr] = v;
  } catch (const json::exception& e) {
    DS_USER_ERROR("cannot apply {} to the config at '{}': {}", flag, pointer, e.what());
  }
}

json merge_command_line(int argc, char** argv, std::string& config_path, std::string& help_text, Warnings& w) {
  ParsedFlags f;
  CLI::App app{"dstrain: GPT pretraining. Flags override the config file; see docs/config.md.", "dstrain"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: the last one wins
  app.add_option("--config,--deepspeed_config", f.config_path, "DeepSpeed-style JSON config");
  for (const FlagSpec& spec : kTable) add_table_flag(app, spec, f);
  add_special_flags(app, f);
  bool deepspeed = false;
  add_ignored_flags(app, deepspeed);
  std::map<std::string, json> compat;
  add_compat_flags(app, compat);
  add_moe_flags(app, compat);
  add_distill_flags(app, compat);
  std::vector<std::string> args = drop_repeated_list_flags(argc, argv);
  try {
    std::vector<std::string> rest(args.rbegin(), args.rend() - 1);  // CLI11 parses a reversed list without argv[0]
    app.parse(rest);
  } catch (const CLI::CallForHelp&) {
    help_text = app.help();
    return json::object();
  } catch (const CLI::ExtrasError&) {
    // CLI11's own message lists them in the reversed order it parsed; give them as written.
    const std::vector<std::string> extra = app.remaining();
    std::string words;
    for (const std::string& x : extra) words += (words.empty() ? "" : " ") + x;
    DS_USER_ERROR("unrecognised argument{}: {} (see dstrain --help)", extra.size() == 1 ? "" : "s", words);
  } catch (const CLI::ParseError& e) {
    DS_USER_ERROR("{} (see dstrain --help)", e.what());  // main adds "dstrain: error: "
  }
  config_path = f.config_path;
  json j = f.config_path.empty() ? json::object() : load_json_file(f.config_path);
  DS_USER_CHECK(j.is_object(), "config file '{}' must hold a JSON object", f.config_path);
  if (deepspeed) use_megatron_optimizer(j, w);
  for (const auto& [spec, v] : f.table) {
    if (deepspeed_config_wins(j, *spec, v, deepspeed && !f.config_path.empty(), w)) continue;
    // Megatron-DeepSpeed resets the engine's batch size from --global-batch-size every step.
    if (std::string(spec->pointer) == "/train_batch_size" && j.contains("train_batch_size") &&
        j.at("train_batch_size") != v)
      add_warning(w, fmt::format("--global-batch-size {} differs from the DeepSpeed config's train_batch_size {}; "
                                 "the flag wins, as in Megatron-DeepSpeed", v.dump(), j.at("train_batch_size").dump()));
    set_at(j, spec->pointer, v, spec->name);
  }
  // Megatron: with both batch sizes known the accumulation steps are derived.
  const bool batch_flag = std::any_of(f.table.begin(), f.table.end(), [](const auto& e) {
    return std::string(e.first->pointer) == "/train_batch_size" ||
           std::string(e.first->pointer) == "/train_micro_batch_size_per_gpu";
  });
  if (batch_flag && j.contains("train_batch_size") && j.contains("train_micro_batch_size_per_gpu"))
    j.erase("gradient_accumulation_steps");
  apply_schedule_flags(j, f.special, w);
  apply_other_flags(j, f.special, deepspeed && !f.config_path.empty(), w);
  if (deepspeed) compat["--deepspeed"] = true;  // what some compatibility flags mean depends on the engine
  apply_compat_flags(j, compat, w);
  apply_moe_flags(j, compat, w);
  apply_distill_flags(j, compat);
  // Megatron's own fp16 optimizer (no DeepSpeed engine, no config file) starts
  // dynamic loss scaling at --initial-loss-scale's default, 2^32.
  if (!deepspeed && f.config_path.empty() && f.special.count("--fp16") &&
      !j.contains(json::json_pointer("/fp16/initial_scale_power")))
    set_at(j, "/fp16/initial_scale_power", 32, "--fp16");
  return j;
}

}  // namespace ds
