// Megatron-DeepSpeed flags that real launch scripts pass, kept so that those
// scripts run with only the launcher line changed. Each one either maps onto
// our config (--checkpoint-activations, --recompute-method,
// --use-rotary-position-embeddings, --exit-duration-in-mins), is an exact
// no-op because dstrain already behaves that way (the reason is in its help
// text and in docs/config.md), or, where we cannot honour the value, is an
// error naming the flag and what to use instead; never a silent no-op.
#include <CLI/CLI.hpp>

#include "lib/config/config_internal.h"
#include "lib/optim/optimizer_types.h"

namespace ds {

using nlohmann::json;

namespace {

// Accepted and changes nothing; `why` says why that is exact.
void no_op_flag(CLI::App& app, const char* name, const char* why) { app.add_flag(name)->description(why); }

void no_op_option(CLI::App& app, const char* name, const char* why) {
  app.add_option_function<std::string>(name, [](const std::string&) {}, why);
}

// A numeric flag (checked in apply_compat_flags).
void numeric(CLI::App& app, std::map<std::string, json>& out, const char* name, const char* help) {
  app.add_option_function<double>(name, [&out, name](const double& v) { out[name] = v; }, help);
}

// Megatron-Core's --group-query-attention [--num-query-groups N] (N defaults
// to 1, and is ignored without the switch); it must agree with
// Megatron-DeepSpeed's --num-key-value-heads when both are given.
void apply_gqa_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  const bool gqa = sp.count("--group-query-attention") > 0, groups = sp.count("--num-query-groups") > 0;
  if (!gqa) {
    if (groups) add_warning(w, "--num-query-groups without --group-query-attention is ignored (as in Megatron)");
    return;
  }
  const double g = groups ? sp.at("--num-query-groups").get<double>() : 1.0;
  DS_USER_CHECK(g >= 1 && g == static_cast<int>(g), "--num-query-groups {}: must be a positive integer", g);
  const json kv = j.value(json::json_pointer("/model/num_key_value_heads"), json());
  DS_USER_CHECK(kv.is_null() || kv == static_cast<int>(g),
                "--group-query-attention --num-query-groups {} disagrees with num_key_value_heads {} "
                "(--num-key-value-heads); give one of them", g, kv.dump());
  set_at(j, "/model/num_key_value_heads", static_cast<int>(g), "--num-query-groups");
}

// What --load reads (Megatron's load_checkpoint). With --deepspeed
// (sp["--deepspeed"]) the engine loads the optimizer state whatever
// --no-load-optim says; --finetune loads the weights only on either path.
void apply_load_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  auto has = [&](const char* k) { return sp.count(k) > 0; };
  if (has("--finetune")) set_at(j, "/training/finetune", true, "--finetune");
  if (has("--reset-iteration")) set_at(j, "/training/reset_iteration", true, "--reset-iteration");
  if (has("--no-load-optim")) {
    if (has("--deepspeed"))
      add_warning(w, "--no-load-optim is ignored with --deepspeed, as in Megatron-DeepSpeed (the engine loads the "
                     "optimizer state); --finetune loads the weights only");
    else
      set_at(j, "/training/no_load_optim", true, "--no-load-optim");
  }
  if (has("--no-load-rng"))
    add_warning(w, "--no-load-rng: nothing to skip: dstrain saves no random state (dropout, token selection and the "
                   "data order are keyed by the seed, the iteration and the sample)");
  if (has("--no-load-lr-state"))
    add_warning(w, "--no-load-lr-state is ignored, as in Megatron-DeepSpeed (which reads it nowhere)");
  if (has("--timing-log-level"))
    add_warning(w, fmt::format("--timing-log-level {}: dstrain's timers have no levels; the iteration line carries "
                               "the step time, wall_clock_breakdown the phases, --log-timers-to-tensorboard both",
                               sp.at("--timing-log-level").dump()));
  // tools/hf2megads_weight_converter.py's flags (finetune_hf_llama/finetune_llama.sh's conversions):
  // dstrain converts instead of training.
  if (has("--hf-ckpt-dir")) {
    const std::string dir = sp.at("--hf-ckpt-dir").get<std::string>();
    const std::string mode = has("--load-mode") ? sp.at("--load-mode").get<std::string>() : "auto";
    DS_USER_CHECK(mode == "auto" || mode == "torchbin" || mode == "safetensor",
                  "--load-mode {}: expected auto, torchbin or safetensor (hf2megads_weight_converter.py's)", mode);
    const json save = j.value(json::json_pointer("/training/save"), json(""));
    DS_USER_CHECK(save.is_string() && !save.get<std::string>().empty(), "--hf-ckpt-dir converts {} into --save, "
                  "which is not given", has("--to-hf-ckpt") ? "a --load checkpoint to Hugging Face files" : dir);
    if (has("--to-hf-ckpt")) {  // the other way: --load into Hugging Face files under --save
      set_at(j, "/training/export_hf", save, "--to-hf-ckpt");
      set_at(j, "/training/save", "", "--to-hf-ckpt");
    } else {
      set_at(j, "/training/init_from", dir, "--hf-ckpt-dir");
      set_at(j, "/training/hf_convert", true, "--hf-ckpt-dir");
    }
    set_at(j, "/training/train_iters", 0, "--hf-ckpt-dir");
    if (j.contains("training") && j["training"].is_object()) j["training"].erase("train_samples");
  } else {
    for (const char* f : {"--to-hf-ckpt", "--load-mode", "--hf-ckpt-num-shards"})
      DS_USER_CHECK(!has(f), "{} belongs to the Hugging Face conversion (hf2megads_weight_converter.py), which "
                    "--hf-ckpt-dir selects", f);
  }
  if (has("--repeated-dataloader"))
    add_warning(w, "--repeated-dataloader: nothing to change: the training sampler runs through as many epochs as "
                   "the run needs, so the loader is never exhausted");
}

}  // namespace

void add_compat_flags(CLI::App& app, std::map<std::string, json>& out) {
  auto flag = [&](const char* name, const char* help) {
    app.add_flag_function(name, [&out, name](int64_t) { out[name] = true; }, help);
  };
  auto text = [&](const char* name, const char* help, std::vector<std::string> choices) {
    app.add_option_function<std::string>(name, [&out, name](const std::string& v) { out[name] = v; }, help)
        ->check(CLI::IsMember(choices));
  };
  flag("--checkpoint-activations", "full recomputation of every layer (Megatron-DeepSpeed: granularity full, "
       "method uniform, 1 layer per chunk)");
  app.add_option_function<int64_t>("--checkpoint-num-layers",
                                   [&out](const int64_t& v) { out["--checkpoint-num-layers"] = v; },
                                   "layers per recomputed chunk with --checkpoint-activations (1 only)");
  text("--recompute-method", "uniform (every layer, --recompute-num-layers 1) or block (the first N layers)",
       {"uniform", "block"});
  flag("--use-rotary-position-embeddings", "RoPE (same as --position-embedding-type rope)");
  flag("--no-pipeline-parallel", "no pipeline engine: requires --pipeline-model-parallel-size 1");
  app.add_option_function<double>("--exit-duration-in-mins",
                                  [&out](const double& v) { out["--exit-duration-in-mins"] = v; },
                                  "save (with --save) and stop once training has run this many minutes");
  text("--data-impl", "mmap or infer: datasets are memory-mapped .bin/.idx files, checked from their header",
       {"mmap", "infer", "lazy", "cached"});
  text("--optimizer", "adam (AdamW, decoupled weight decay) or sgd (SGD with --sgd-momentum); a DeepSpeed config's "
       "optimizer section wins", {"adam", "sgd"});
  numeric(app, out, "--sgd-momentum", "SGD momentum with --optimizer sgd (Megatron's default 0.9)");
  flag("--group-query-attention", "Megatron-Core grouped-query attention: --num-query-groups kv heads (default 1)");
  numeric(app, out, "--num-query-groups", "kv heads with --group-query-attention (ignored without it, as in Megatron)");
  no_op_flag(app, "--deepspeed-activation-checkpointing",
             "accepted: recomputation is exact whichever implementation runs it");
  no_op_flag(app, "--no-async-tensor-model-parallel-allreduce",
             "accepted: tensor-parallel all-reduces are not overlapped with the weight-gradient GEMM");
  no_op_flag(app, "--no-query-key-layer-scaling",
             "accepted: softmax runs in f32, so scaling Q.K by the layer number changes nothing");
  no_op_flag(app, "--apply-query-key-layer-scaling",
             "accepted: softmax runs in f32, so scaling Q.K by the layer number changes nothing");
  no_op_flag(app, "--use-flash-attn-v2", "accepted; flash attention is used on CUDA whenever it applies");
  no_op_flag(app, "--use-flash-attn-triton", "accepted; flash attention is used on CUDA whenever it applies");
  no_op_flag(app, "--no-masked-softmax-fusion",
             "accepted: the causal mask and the softmax run in f32 in one attention kernel with or without Megatron's "
             "fused kernel, so the values are the same");
  no_op_flag(app, "--no-bias-dropout-fusion", "accepted: bias, dropout and residual add give the same values fused "
             "or not");
  no_op_flag(app, "--no-gradient-accumulation-fusion",
             "accepted: weight-gradient GEMMs add into the gradient accumulator directly, as Megatron's fused path "
             "does");
  flag("--openai-gelu", "accepted: dstrain's GELU is the tanh approximation already");
  flag("--no-bias-gelu-fusion", "accepted for SwiGLU models and with --openai-gelu; a GELU model would switch to the "
       "exact erf GELU in Megatron, which dstrain does not have: error");
  flag("--cpu-optimizer", "Adam runs on the CPU: needs zero_optimization.offload_optimizer.device cpu in the DeepSpeed "
       "config, which already does that");
  flag("--cpu_torch_adam", "with --cpu-optimizer: the CPU Adam is dstrain's AdamW either way");
  no_op_option(app, "--tensorboard-queue-size",
               "accepted: events are written as they come and flushed at every log interval and validation");
  no_op_option(app, "--num-workers", "accepted: samples are read in-process from the memory-mapped dataset");
  no_op_flag(app, "--universal-checkpoint",
             "accepted: every dstrain checkpoint loads into any TP/PP/DP layout (reshaped on load)");
  for (const char* name : {"--wandb-project", "--wandb-exp-name", "--wandb-save-dir"})
    app.add_option_function<std::string>(name, [&out, name](const std::string& v) { out[name] = v; },
                                         "Weights & Biases logging is not implemented: a warning; metrics go to the "
                                         "log, the CSV monitor and --tensorboard-dir");
  flag("--checkpoint-in-cpu", "activation checkpoints in host memory (DeepSpeed): a warning; they stay where the "
       "model runs (placement only, the numbers are the same)");
  flag("--ds-sequence-parallel-fpdt", "FPDT chunked attention (memory only): accepted with a warning; "
       "attention is computed in tiles without the score matrix anyway, Ulysses without FPDT's chunking");
  numeric(app, out, "--ds-sequence-parallel-fpdt-chunk-size", "FPDT chunk size (with --ds-sequence-parallel-fpdt)");
  flag("--ds-sequence-parallel-fpdt-offloading", "FPDT host offloading (with --ds-sequence-parallel-fpdt)");
  app.add_option_function<std::vector<int64_t>>(
         "--rampup-batch-size", [&out](const std::vector<int64_t>& v) { out["--rampup-batch-size"] = v; },
         "START INCREMENT SAMPLES: Megatron's batch-size ramp-up from START to the global batch (sample-based "
         "training)")
      ->expected(3);
  // Loading (Megatron's checkpointing.py).
  app.add_option_function<std::string>("--hf-ckpt-dir", [&out](const std::string& v) { out["--hf-ckpt-dir"] = v; },
                                       "hf2megads_weight_converter.py: convert this Hugging Face model into --save "
                                       "(iteration 0) instead of training");
  app.add_option_function<int>("--hf-ckpt-num-shards", [&out](const int& v) { out["--hf-ckpt-num-shards"] = v; },
                               "accepted: the shards are found from the directory's files");
  app.add_option_function<std::string>("--load-mode", [&out](const std::string& v) { out["--load-mode"] = v; },
                                       "auto, torchbin or safetensor: accepted (the weights' format is read from "
                                       "the files)");
  flag("--to-hf-ckpt", "with --hf-ckpt-dir: convert --load into Hugging Face files under --save instead");
  flag("--finetune", "load only the weights of --load: the iteration, data position, optimizer state, learning-rate "
       "schedule and loss scale start fresh");
  flag("--no-load-optim", "without --deepspeed: load the weights and the iteration, not the optimizer state, "
       "learning-rate schedule or loss scale; with --deepspeed ignored, as in Megatron-DeepSpeed");
  flag("--reset-iteration", "after loading, the iteration and the data position start at 0 (weights, optimizer state, "
       "learning-rate schedule and loss scale as loaded)");
  flag("--no-load-rng", "accepted: no random state is saved (the streams are keyed by seed, iteration and sample)");
  flag("--no-load-lr-state", "accepted: read nowhere in Megatron-DeepSpeed, so ignored as there");
  app.add_option_function<int>("--timing-log-level", [&out](const int& v) { out["--timing-log-level"] = v; },
                               "accepted: dstrain's timers have no levels (wall_clock_breakdown, "
                               "--log-timers-to-tensorboard)")
      ->check(CLI::Range(0, 2));
  flag("--repeated-dataloader", "accepted: the training sampler runs through as many epochs as the run needs");
  // DeepSpeed Data Efficiency (data_efficiency/gpt/): refused by name.
  flag("--random-ltd", "random layerwise token dropping (DeepSpeed Data Efficiency's random-LTD) in the layers of "
       "the config's data_efficiency.data_routing.random_ltd");
  flag("--data-efficiency-curriculum-learning", "curriculum learning by data sampling (DeepSpeed Data Efficiency) "
       "with the config's data_efficiency.data_sampling.curriculum_learning");
  for (const char* name : {"--train-doc-idx-path", "--train-sample-idx-path", "--train-shuffle-idx-path",
                           "--train-idx-path", "--train-desc-path"})
    app.add_option_function<std::string>(name, [&out, name](const std::string& v) { out[name] = v; },
                                         std::string(name) == "--train-desc-path"
                                             ? "accepted: the description file of Megatron's index maps (not read)"
                                         : std::string(name) == "--train-idx-path"
                                             ? "BERT's index map: refused (dstrain trains GPT)"
                                             : "one of Megatron's three train index maps (.npy): the train sample "
                                               "order; written there from dstrain's order when missing");
}

// Megatron's --optimizer adam|sgd and --sgd-momentum. Without --deepspeed a
// config's optimizer section builds the optimizer: with one, a flag that
// disagrees with its type, and --sgd-momentum, are warned about and the
// file's optimizer kept. With --deepspeed the section is gone by now
// (use_megatron_optimizer) and the flags decide, as in Megatron-DeepSpeed.
static void apply_optimizer_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  auto has = [&](const char* k) { return sp.count(k) > 0; };
  const json file_type = j.value(json::json_pointer("/optimizer/type"), json());
  const bool sgd = has("--optimizer") && sp.at("--optimizer") == "sgd";
  if (!file_type.is_null()) {
    const std::string ours = file_type.is_string() ? canonical_optimizer_type(file_type.get<std::string>()) : "";
    const bool agrees = sgd ? ours == "SGD" : ours == "Adam" || ours == "AdamW";
    if (has("--optimizer") && !agrees)
      add_warning(w, fmt::format("--optimizer {} disagrees with the config's optimizer.type {}; the config's is used "
                                 "(DeepSpeed builds the optimizer)", sp.at("--optimizer").get<std::string>(),
                                 file_type.dump()));
    if (has("--sgd-momentum"))
      add_warning(w, "--sgd-momentum is ignored: the config's optimizer section sets the optimizer (use "
                     "optimizer.params.momentum)");
    return;
  }
  if (sgd) {
    set_at(j, "/optimizer/type", "SGD", "--optimizer");
    set_at(j, "/optimizer/params/momentum", has("--sgd-momentum") ? sp.at("--sgd-momentum") : json(0.9),
           "--sgd-momentum");
  } else if (has("--sgd-momentum")) {
    add_warning(w, "--sgd-momentum is ignored without --optimizer sgd (as in Megatron)");
  }
}

void apply_compat_flags(json& j, const std::map<std::string, json>& sp, Warnings& w) {
  auto has = [&](const char* k) { return sp.count(k) > 0; };
  auto at = [&](const char* p) { return j.value(json::json_pointer(p), json()); };
  if (has("--data-impl")) {
    const std::string v = sp.at("--data-impl");
    DS_USER_CHECK(v == "mmap" || v == "infer", "--data-impl {}: the pre-mmap IndexedDataset format is not read by "
                  "dstrain; prepare the data with dsprep (mmap .bin/.idx) and pass --data-impl mmap", v);
  }
  apply_optimizer_flags(j, sp, w);
  if (has("--no-pipeline-parallel")) {
    const json pp = at("/parallel/pipeline_model_parallel_size");
    DS_USER_CHECK(pp.is_null() || pp == 1, "--no-pipeline-parallel with pipeline_model_parallel_size {}: "
                  "drop one of them", pp.dump());
  }
  apply_load_flags(j, sp, w);
  if (has("--random-ltd")) set_at(j, "/training/random_ltd", true, "--random-ltd");
  if (has("--data-efficiency-curriculum-learning"))
    set_at(j, "/training/data_efficiency_curriculum_learning", true, "--data-efficiency-curriculum-learning");
  for (const auto& [name, key] : {std::pair{"--train-doc-idx-path", "train_doc_idx_path"},
                                  {"--train-sample-idx-path", "train_sample_idx_path"},
                                  {"--train-shuffle-idx-path", "train_shuffle_idx_path"}})
    if (has(name)) set_at(j, std::string("/data/") + key, sp.at(name), name);
  DS_USER_CHECK(!has("--train-idx-path"), "--train-idx-path {}: Megatron's BERT index map; dstrain trains GPT (its "
                "train order is --train-doc-idx-path, --train-sample-idx-path and --train-shuffle-idx-path)",
                has("--train-idx-path") ? sp.at("--train-idx-path").get<std::string>() : std::string());
  if (has("--rampup-batch-size")) set_at(j, "/training/rampup_batch_size", sp.at("--rampup-batch-size"),
                                         "--rampup-batch-size");
  for (const char* name : {"--wandb-project", "--wandb-exp-name", "--wandb-save-dir"})
    if (has(name)) add_warning(w, fmt::format("{} {}: Weights & Biases logging is not implemented; metrics go to the "
                                              "log, the CSV monitor and --tensorboard-dir", name, sp.at(name).get<std::string>()));
  if (has("--checkpoint-in-cpu"))
    add_warning(w, "--checkpoint-in-cpu: activation checkpoints stay in the memory of the device that runs the model "
                   "(placement only; the numbers are the same)");
  for (const char* name : {"--ds-sequence-parallel-fpdt-chunk-size", "--ds-sequence-parallel-fpdt-offloading"})
    DS_USER_CHECK(!has(name) || has("--ds-sequence-parallel-fpdt"), "{} needs --ds-sequence-parallel-fpdt", name);
  if (has("--ds-sequence-parallel-fpdt"))
    add_warning(w, "--ds-sequence-parallel-fpdt: accepted as a memory-only setting: attention runs tiled without a "
                   "score matrix and DeepSpeed-Ulysses exchanges whole sequences (no FPDT chunks); chunk size and "
                   "offloading are not used");
  // Megatron's unfused GELU is the exact erf form unless --openai-gelu; the
  // fused bias-gelu (its default) and dstrain use the tanh approximation.
  DS_USER_CHECK(!has("--no-bias-gelu-fusion") || has("--openai-gelu") || at("/model/activation") == "swiglu",
                "--no-bias-gelu-fusion: Megatron then computes the exact erf GELU, dstrain only the tanh approximation "
                "(Megatron's fused bias-gelu); add --openai-gelu (the tanh form) or drop the flag");
  DS_USER_CHECK(!has("--cpu_torch_adam") || has("--cpu-optimizer"), "--cpu_torch_adam needs --cpu-optimizer");
  // DeepSpeed's CPU Adam only steps parameters that live on the CPU: with
  // Megatron-DeepSpeed the flag goes together with ZeRO-Offload.
  DS_USER_CHECK(!has("--cpu-optimizer") || at("/zero_optimization/offload_optimizer/device") == "cpu",
                "--cpu-optimizer: the optimizer runs on the CPU only with ZeRO-Offload; set "
                "zero_optimization.offload_optimizer.device to \"cpu\" in the DeepSpeed config or drop the flag");
  if (has("--use-rotary-position-embeddings")) set_at(j, "/model/position", "rope", "--use-rotary-position-embeddings");
  apply_gqa_flags(j, sp, w);
  if (has("--exit-duration-in-mins"))
    set_at(j, "/training/exit_duration_in_mins", sp.at("--exit-duration-in-mins"), "--exit-duration-in-mins");
  const bool ckpt_act = has("--checkpoint-activations");
  DS_USER_CHECK(!has("--checkpoint-num-layers") || (ckpt_act && sp.at("--checkpoint-num-layers") == 1),
                "--checkpoint-num-layers {}: only 1 (every layer recomputed on its own) is supported, with "
                "--checkpoint-activations", sp.count("--checkpoint-num-layers") ? sp.at("--checkpoint-num-layers").dump() : "");
  if (ckpt_act) {  // Megatron-DeepSpeed: granularity full, method uniform, one layer per chunk
    if (at("/parallel/recompute_granularity") == "selective")
      add_warning(w, "--checkpoint-activations replaces recompute_granularity selective with full");
    set_at(j, "/parallel/recompute_granularity", "full", "--checkpoint-activations");
    set_at(j, "/parallel/recompute_num_layers", 0, "--checkpoint-activations");
  }
  if (has("--recompute-method")) {
    const json n = at("/parallel/recompute_num_layers");
    if (sp.at("--recompute-method") == "uniform") {
      // Uniform chunks of one layer recompute every layer: our full recomputation of all layers.
      DS_USER_CHECK(n.is_null() || n == 1 || n == 0, "--recompute-method uniform with --recompute-num-layers {}: "
                    "chunks of several layers are not implemented; use 1, or --recompute-method block", n.dump());
      set_at(j, "/parallel/recompute_num_layers", 0, "--recompute-method");
    } else if (n.is_null()) {
      set_at(j, "/parallel/recompute_num_layers", 1, "--recompute-method");  // Megatron's default N
    }
  }
}

}  // namespace ds
