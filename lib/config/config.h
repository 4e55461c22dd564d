// dstrain's run configuration: one plain struct per concern, filled from a
// DeepSpeed-style JSON file plus Megatron-style command-line flags.
// Precedence: built-in defaults < model family defaults < JSON file < flags.
// Everything derived (batch triple, ffn size, padded vocab, decay length) is
// computed once here so the rest of the program only reads finished values.
// The full key/flag reference is docs/config.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lib/config/batch_rampup.h"
#include "lib/config/curriculum.h"
#include "lib/core/attention_backend.h"
#include "lib/core/dtype.h"
#include "lib/core/elasticity.h"
#include "lib/data/tokenizer.h"
#include "lib/model/model_config.h"
#include "lib/model/random_ltd.h"
#include "lib/optim/optimizer_config.h"
#include "lib/parallel/parallel_layout.h"
#include "lib/runtime/zero_config.h"

namespace ds {

enum class Precision { FP32, BF16, FP16 };

struct BatchConfig {
  int64_t train_batch_size = 0, micro_batch_size = 0, grad_accum_steps = 0;  // 0 = derive
  int dp_size = 1;
  ElasticityConfig elasticity;  // enabled: the batch and micro batch come from it (resolve_batch)
};

struct DataConfig {
  std::vector<std::string> data_path;  // Megatron form: "prefix" or "w1 prefix1 w2 prefix2 ..."
  // Megatron's separate datasets per split (same forms), instead of data_path + split.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "949,50,1", vocab_file, merge_file;
  // Megatron's --tokenizer-type / --tokenizer-model (no type: GPT2BPETokenizer
  // when vocab_file is given). resolve_vocab fills `tokenizer` from them.
  std::optional<data::TokenizerKind> tokenizer_type;
  std::string tokenizer_model;
  // Megatron's --train-{doc,sample,shuffle}-idx-path: the train dataset's
  // sample order as Megatron's three index maps (.npy). All three or none;
  // files that do not exist yet are written from dstrain's own order.
  std::string train_doc_idx_path, train_sample_idx_path, train_shuffle_idx_path;
  // The tokenizer the files are read with: the type, or GPT2BPETokenizer.
  data::TokenizerKind tokenizer_kind() const { return tokenizer_type.value_or(data::TokenizerKind::GPT2BPE); }
  data::TokenizerInfo tokenizer;  // vocab size and bos/eos/eod/pad ids; kind GPT2BPE, size 0 when no files
};

struct CheckpointConfig {
  std::string save_dir, load_dir, init_from, export_hf;
  // The --init-from file's vocabulary rows when the model's vocabulary is
  // larger (dschat's resized embedding; the added rows start as the mean of
  // the file's: lib/ckpt/hf.h). 0: the model's own.
  int64_t init_from_vocab = 0;
  int64_t save_interval = 0;
  // --finetune: load only the weights; the iteration, data position,
  // optimizer, learning-rate schedule and loss scale start fresh.
  // --no-load-optim (without --deepspeed): the weights and the iteration and
  // data position; the optimizer, learning-rate schedule and loss scale fresh.
  bool finetune = false, no_load_optim = false;
  // --reset-iteration (Megatron-DeepSpeed): after a full load the iteration
  // and the data position (consumed samples and tokens) start at 0; the
  // weights, optimizer state, learning-rate schedule and loss scale are kept.
  bool reset_iteration = false;
  // Megatron-DeepSpeed's tools/hf2megads_weight_converter.py (--hf-ckpt-dir):
  // no training; the --init-from weights are saved to --save as iteration 0.
  bool hf_convert = false;
};

struct LoggingConfig {
  int64_t log_interval = 10, eval_interval = 100, eval_iters = 10, steps_per_print = 10;
  bool csv_enabled = false;
  std::string csv_path = "ds_logs", csv_job_name = "dstrain";
  double cpu_peak_tflops = 0;  // for MFU on CPU; 0 = not reported
  bool wall_clock_breakdown = false;  // per-phase step times at each log line (DeepSpeed's key)
  // --profile: host synchronisations per step in the log, and the timeline of
  // one steady-state step written to profile_dir/timeline_rank<R>.json.
  bool profile = false;
  std::string profile_dir = ".";
  // TensorBoard: Megatron's --tensorboard-dir, or DeepSpeed's "tensorboard"
  // section (output_path/job_name); tensorboard_dir() is the one in effect.
  std::string tensorboard_dir;
  bool ds_tensorboard = false;
  std::string ds_tensorboard_path, ds_tensorboard_job = "DeepSpeedJobName";
  int64_t tensorboard_log_interval = 1;
  bool tb_learning_rate = true, tb_loss_scale = true, tb_batch_size = false, tb_timers = false,
       tb_validation_ppl = false, tb_optimizer_states = false, tb_world_size = false;
  std::string tensorboard_dir_in_effect() const;
};

struct PrecisionConfig {
  Precision precision = Precision::FP32;
  float loss_scale = 0;  // 0 = dynamic
  int initial_scale_power = 16, loss_scale_window = 1000, hysteresis = 2;
  float min_loss_scale = 1;
  bool consecutive_hysteresis = false;
  // data_types.grad_accum_dtype: the dtype gradients accumulate and are
  // data-parallel reduced in: f32 (the default, Megatron's main grads) or, with
  // bf16/fp16 training, the compute dtype (DeepSpeed's default for bf16/fp16).
  DType grad_accum = DType::F32;
};

// The parallel sizes as configured; TrainConfig::layout is what they make of
// the job's world (derive_config).
struct ParallelConfig {
  int tp = 1, pp = 1;
  bool sequence_parallel = false;  // forced off when tp == 1 (as Megatron does)
  int sp = 1;  // ds_sequence_parallel_size: DeepSpeed-Ulysses sequence parallelism
  int num_layers_per_virtual_stage = 0;
  // Megatron-DeepSpeed's zero-bubble pipeline (--enable-zbh1-pipeline) and its
  // exact semantics (--enable-zbh1-exact-semantics); see docs/pipeline.md.
  bool zbh1_pipeline = false, zbh1_exact_semantics = false;
  RecomputeKind recompute = RecomputeKind::None;  // recompute_granularity: "" (none), full, selective
  int recompute_num_layers = 0;
};

// Megatron's sample- and token-based lengths as given (0 = not given; token
// lengths -1). derive_config turns them into train_iters and the optimizer's
// resolved schedule lengths.
struct ScheduleLengths {
  int64_t train_samples = 0;       // --train-samples: train_iters = samples / global batch
  int64_t train_tokens = 0;        // --train-tokens: also stop once this many tokens were consumed
  int64_t lr_warmup_samples = 0, lr_decay_samples = 0;  // sample-based training only
  int64_t lr_warmup_tokens = -1, lr_decay_tokens = -1;  // Megatron-DeepSpeed token-wise schedule
  int64_t lr_wsd_decay_iters = 0, lr_wsd_decay_samples = 0;  // Megatron-LM's WSD final decay
  BatchRampup rampup;  // --rampup-batch-size (sample-based training only)
  bool sample_based() const { return train_samples > 0; }
};

// Knowledge distillation as Megatron-DeepSpeed's --kd / --mos (docs/distillation.md):
// a frozen teacher GPT from one of our checkpoints runs forward on each
// micro-batch, and beta_ce * temperature^2 * KL(teacher || student) at that
// temperature, over batchmean and the sequence length, is added to the loss.
struct DistillConfig {
  bool enabled = false;  // --kd or --mos
  bool mos = false;      // --mos: the same loss, logged as "mos loss"
  float alpha_ce = 1.0f, beta_ce = 1.0f, temperature = 1.0f;  // --kd-alpha-ce (unused, as upstream), --kd-beta-ce, --kd-temp
  std::string load_teacher;  // --load-teacher: a dstrain checkpoint directory
  // The teacher's size as the flags state it (0 / empty: not given); the
  // checkpoint's saved config is the teacher, and a flag that disagrees is an error.
  int num_layers = 0, hidden_size = 0, num_attention_heads = 0;
  std::vector<int> num_experts;
};

// DeepSpeed Compression (compression_training) as dstrain runs it: the
// activation quantization of the transformer layers' linear-layer inputs
// (docs/config.md, "DeepSpeed Compression").
struct ActQuantGroup {
  std::string name;                  // the different_groups key
  int bits = 8;                      // params.bits: 4 or 8
  std::vector<std::string> modules;  // regular expressions over Megatron's module names
};
struct WeightQuantGroup {
  std::string name;
  int start_bits = 0, target_bits = 0;  // params.start_bits, params.target_bits
  int64_t period = 1;                   // params.quantization_period
  std::vector<std::string> modules;
};
struct CompressionConfig {
  // weight_quantization, as DeepSpeed's MoQ runs it (the fp16 weights
  // quantized after every optimizer step from schedule_offset on).
  bool weight_quant = false;
  int64_t wq_offset = 0;      // schedule_offset
  int64_t wq_groups = 1;      // quantize_groups
  bool wq_symmetric = true;   // quantization_type
  bool wq_verbose = false;    // quantize_verbose
  std::vector<WeightQuantGroup> wq_list;  // different_groups
  bool act_quant = false;          // activation_quantization.shared_parameters.enabled
  bool act_symmetric = true;       // quantization_type: symmetric | asymmetric
  bool act_static = false;         // range_calibration: static | dynamic
  int64_t act_offset = 1000;       // schedule_offset: optimizer steps of this run before it acts
  std::vector<ActQuantGroup> act_groups;
};

// DeepSpeed Data Efficiency's random-LTD (docs/data_efficiency.md): the
// section data_efficiency.data_routing.random_ltd, which acts only when
// Megatron-DeepSpeed's --random-ltd (training.random_ltd) converts the layers.
struct RandomLtdConfig {
  bool enabled = false;           // random_ltd.enabled
  bool layers_converted = false;  // --random-ltd
  std::vector<int> layer_ids;     // random_ltd_layer_id: 0-based layer indices, ascending
  RandomLtdSchedule schedule;     // random_ltd_schedule (fixed_linear)
  bool active() const { return enabled && layers_converted; }
};

// DeepSpeed Data Efficiency's curriculum learning by data sampling
// (docs/data_efficiency.md): data_efficiency.data_sampling.curriculum_learning,
// acting with Megatron-DeepSpeed's --data-efficiency-curriculum-learning
// (training.data_efficiency_curriculum_learning). Each metric has a
// difficulty schedule; the sampler (lib/train/curriculum_sampler.h) draws
// every global batch from the clusters of samples whose difficulty the
// schedule has reached, in the order of the index files of the data analysis.
enum class CurriculumDifficulty { Value, Percentile };

struct CurriculumMetricConfig {
  std::string name;  // the metric's key: "seqlen_truncate" / "seqlen_reshape" also set the sequence length
  CurriculumDifficulty difficulty = CurriculumDifficulty::Value;  // difficulty_type
  bool single_cluster = true;                                      // clustering_type single_cluster | schedule_based
  std::string index_to_sample_path, index_to_metric_path;          // schedule_based only
  CurriculumConfig schedule;                                       // min/max_difficulty, schedule_type, schedule_config
};

struct DataSamplingConfig {
  bool enabled = false;        // data_sampling.curriculum_learning.enabled
  bool flag = false;           // --data-efficiency-curriculum-learning
  uint64_t seed = 1234;        // data_efficiency.seed: the sampler's numpy generator
  int64_t num_epochs = 1000;   // data_sampling.num_epochs: the stream ends after this many epochs' samples
  int64_t num_workers = 0;     // data_sampling.num_workers: loader processes upstream; no effect here
  bool drop_last = false;      // dataloader_drop_last: a micro-step cut short at a global batch's end is dropped
  std::string data_cluster_path;
  std::vector<CurriculumMetricConfig> metrics;  // by name (the order does not change the samples)
  bool active() const { return enabled && flag; }
  // The metric that sets the sequence length: seqlen_truncate, else
  // seqlen_reshape (Megatron-DeepSpeed's data_post_process checks them in
  // that order), or null.
  const CurriculumMetricConfig* seqlen_metric() const {
    for (const char* name : {"seqlen_truncate", "seqlen_reshape"})
      for (const CurriculumMetricConfig& m : metrics)
        if (m.name == name) return &m;
    return nullptr;
  }
  // Whether the length re-cuts the rows (seqlen_reshape) instead of truncating them.
  bool reshapes() const {
    const CurriculumMetricConfig* m = seqlen_metric();
    return active() && m && m->name == "seqlen_reshape";
  }
};

struct TrainConfig {
  ModelConfig model;
  OptimizerConfig optim;
  BatchConfig batch;
  DataConfig data;
  CheckpointConfig ckpt;
  LoggingConfig log;
  PrecisionConfig precision;
  ZeroConfig zero;
  ParallelConfig parallel;
  // Derived once from `parallel` and the world size (derive_config): DP, the
  // sequence-data-parallel size, virtual stages, positions per rank.
  ParallelLayout layout;
  int64_t train_iters = 0;
  ScheduleLengths lengths;
  // DeepSpeed's legacy `curriculum_learning` section (sequence-length warmup).
  CurriculumConfig curriculum;
  CompressionConfig compression;
  DistillConfig distill;
  RandomLtdConfig random_ltd;
  DataSamplingConfig data_sampling;
  // On resume, a Megatron schedule that differs from the checkpoint's is an
  // error unless one of these picks a side (Megatron's two flags).
  bool override_lr_scheduler = false, use_checkpoint_lr_scheduler = false;
  // Megatron --exit-signal-handler: on SIGTERM, save (with --save) and stop.
  bool exit_signal_handler = false;
  int64_t exit_interval = 0;  // Megatron --exit-interval: stop at a multiple of it (0 = off)
  // Consecutive iterations with a non-finite loss or gradient norm (each one
  // skipped) before the run stops with an error.
  int64_t max_nan_iterations = 3;
  // Megatron --exit-duration-in-mins: save and stop once training has run this
  // long (0 = off).
  double exit_duration_in_mins = 0;
  uint64_t seed = 1234;
  DeviceType device = DeviceType::CPU;  // "cpu" | "cuda"
  AttentionBackend attention_backend = AttentionBackend::Flash;  // CUDA only
  std::string config_path;
  bool estimate_memory = false;
  // --cuda-graph: after cuda_graph_warmup eager steps, the step up to its one
  // host read, the AdamW update included, is captured once in a CUDA graph
  // and replayed (docs/cuda.md, "CUDA graphs"). Single GPU, static shapes
  // only (validate_cuda_graph).
  bool cuda_graph = false;
  int64_t cuda_graph_warmup = 2;
  nlohmann::json resolved;  // the full resolved config (same layout as the input file)
  std::vector<std::string> warnings;  // every config warning, also printed on rank 0
  std::string help_text;  // non-empty when --help was given: print it and exit 0
};

// Parses argv (dstrain's command line: --config/--deepspeed_config FILE plus
// Megatron flags that override the file). world_size = number of processes
// (DP = world / (tp * pp)). Throws ds::UserError with one clear line on any bad input.
TrainConfig parse_train_config(int argc, char** argv, int world_size);

// The effective config in the input layout (re-parsable by
// train_config_from_json; what checkpoints save as `resolved`).
nlohmann::json config_to_json(const TrainConfig& cfg);

// The same from an already merged JSON document (a config file, or the
// `resolved` JSON saved in a checkpoint). Re-parsing `resolved` gives it back.
TrainConfig train_config_from_json(const nlohmann::json& j, int world_size);

// The sizes of a parallel section as a layout request; the expert-parallel
// size is the model's model.moe.expert_parallel_size when it has MoE layers,
// else 1 (as Megatron-DeepSpeed, a dense model ignores it).
ParallelRequest parallel_request(const ParallelConfig& p, const ModelConfig& m);

// A checkpoint's saved (resolved) config re-targeted to another layout: its
// parallel section is replaced by `to`'s sizes, the global batch is kept and
// the gradient accumulation re-derived for the new data-parallel size
// (BatchOnRetarget::Keep), or both batch keys are dropped
// (BatchOnRetarget::Drop: a one-process tool such as dsgen, where the
// global batch no longer has to divide). The one place that knows which
// saved fields depend on the layout.
enum class BatchOnRetarget { Keep, Drop };
nlohmann::json retarget_config(nlohmann::json saved, const ParallelRequest& to, BatchOnRetarget batch);
// The same, parsed for `world` processes (validates the new layout).
TrainConfig retargeted_train_config(const nlohmann::json& saved, const ParallelRequest& to, int world,
                                    BatchOnRetarget batch);
// The layout a saved resolved config was trained with: its parallel sizes and
// the world its batch triple implies (DP = global / (micro x accumulation)).
// UserError naming `where` (the step directory) when a field is missing or
// out of range.
ParallelLayout saved_parallel_layout(const nlohmann::json& saved, const std::string& where);

// DeepSpeed's batch-size rules in exactly one place: from any subset of
// (train_batch_size, micro_batch_size, grad_accum_steps) and dp_size, fills
// the rest or throws UserError naming the values.
void resolve_batch(BatchConfig& b);

// Fills model.vocab_size from the vocab file (if given) and the padded size
// (Megatron's rule, padded_vocab). Reads the vocab file, so it is a separate
// step from parsing (configs parse without their data present).
void resolve_vocab(TrainConfig& cfg);

// The compute dtype of the model's weights copy and activations (bf16/f16
// with mixed precision, else f32); gradients and master weights stay f32.
DType compute_dtype(Precision p);

const char* precision_name(Precision p);   // "fp32" | "bf16" | "fp16"
// recompute_granularity as the config spells it: "" (none), "full", "selective".
const char* recompute_granularity_name(RecomputeKind k);

}  // namespace ds
