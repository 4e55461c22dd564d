// dstrain's run configuration: one plain struct per concern, filled from a
// DeepSpeed-style JSON file plus Megatron-style command-line flags.
// Precedence: built-in defaults < model family defaults < JSON file < flags.
// Everything derived (batch triple, ffn size, padded vocab, decay length) is
// computed once here so the rest of the program only reads finished values.
// The full key/flag reference is docs/config.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/core/dtype.h"

namespace ds {

enum class ModelFamily { GPT2, LLaMA };
enum class NormKind { LayerNorm, RMSNorm };
enum class Activation { GELU, SwiGLU };
enum class PositionKind { Learned, Rope };
enum class Precision { FP32, BF16, FP16 };
enum class LrDecay { Constant, Linear, Cosine };
enum class WarmupKind { Linear, Log };  // DeepSpeed warmup_type "linear" | "log"

struct ModelConfig {
  ModelFamily family = ModelFamily::GPT2;
  int num_layers = 12, hidden_size = 768, num_heads = 12;
  int ffn_hidden_size = 0;  // resolved: 4*C for GELU, int(4*C*2/3/64)*64 for SwiGLU
  int seq_length = 1024, max_position_embeddings = 1024;  // max_pos defaults to seq_length
  int vocab_size = 0;  // real vocab (from vocab file / tokenizer); resolved later if 0
  int make_vocab_size_divisible_by = 128;
  int padded_vocab_size = 0;  // padded_vocab(vocab_size, ...) when vocab_size > 0
  bool untie_embeddings = false;
  NormKind norm = NormKind::LayerNorm;
  Activation activation = Activation::GELU;
  PositionKind position = PositionKind::Learned;
  bool bias = true;
  float rope_theta = 10000.f, norm_eps = 1e-5f, init_method_std = 0.02f;
  // Not a config key: the trainer sets it from bf16/fp16.enabled. Weights the
  // forward reads and activations use it; gradients and master weights stay f32.
  DType compute_dtype = DType::F32;
};

// Sets the family and its standard blocks. GPT-2: LayerNorm, GELU, learned
// positions, biases, tied embeddings. LLaMA: RMSNorm, SwiGLU, RoPE, no
// biases, untied embeddings. (Header-only: the model and tests use it too.)
inline void set_model_family(ModelConfig& m, ModelFamily f) {
  const bool llama = f == ModelFamily::LLaMA;
  m.family = f;
  m.norm = llama ? NormKind::RMSNorm : NormKind::LayerNorm;
  m.activation = llama ? Activation::SwiGLU : Activation::GELU;
  m.position = llama ? PositionKind::Rope : PositionKind::Learned;
  m.bias = !llama;
  m.untie_embeddings = llama;
}

struct OptimizerConfig {
  std::string type = "AdamW";  // "Adam" | "AdamW" (both: decoupled weight decay)
  float lr = 6e-4f, min_lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 = off
  LrDecay decay = LrDecay::Cosine;
  int64_t warmup_iters = 0, decay_iters = 0;  // decay_iters: resolved (0 in file = train_iters)
  std::string scheduler_type;  // "" (Megatron schedule) | WarmupLR | WarmupDecayLR | WarmupCosineLR
  float warmup_min_lr = 0.f;   // Megatron --lr-warmup-init / DeepSpeed warmup_min_lr
  // DeepSpeed schedulers only:
  WarmupKind warmup_type = WarmupKind::Linear;  // DeepSpeed's own default is "log"
  float warmup_min_ratio = 0.f;     // WarmupCosineLR: warmup starts at ratio * lr
  float cos_min_ratio = 0.0001f;    // WarmupCosineLR: cosine ends at ratio * lr
};

struct BatchConfig {
  int64_t train_batch_size = 0, micro_batch_size = 0, grad_accum_steps = 0;  // 0 = derive
  int dp_size = 1;
};

struct DataConfig {
  std::vector<std::string> data_path;  // Megatron form: "prefix" or "w1 prefix1 w2 prefix2 ..."
  std::string split = "949,50,1", vocab_file, merge_file;
};

struct CheckpointConfig {
  std::string save_dir, load_dir, init_from, export_hf;
  int64_t save_interval = 0;
};

struct LoggingConfig {
  int64_t log_interval = 10, eval_interval = 100, eval_iters = 10, steps_per_print = 10;
  bool csv_enabled = false;
  std::string csv_path = "ds_logs", csv_job_name = "dstrain";
  double cpu_peak_tflops = 0;  // for MFU on CPU; 0 = not reported
};

struct PrecisionConfig {
  Precision precision = Precision::FP32;
  float loss_scale = 0;  // 0 = dynamic
  int initial_scale_power = 16, loss_scale_window = 1000, hysteresis = 2;
  float min_loss_scale = 1;
  bool consecutive_hysteresis = false;
};

struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000, allgather_bucket_size = 500000000;
  bool overlap_comm = false, contiguous_gradients = true;
  int64_t stage3_prefetch_bucket_size = 50000000, stage3_max_live_parameters = 1000000000,
          stage3_param_persistence_threshold = 100000;
  std::string offload_optimizer_device = "none";  // none | cpu
};

struct ParallelConfig {
  int tp = 1, pp = 1;
  bool sequence_parallel = false;  // forced off when tp == 1 (as Megatron does)
  int num_layers_per_virtual_stage = 0;
  std::string recompute_granularity;  // "", full, selective
  int recompute_num_layers = 0;
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
  int64_t train_iters = 0;
  int64_t exit_interval = 0;  // Megatron --exit-interval: stop at a multiple of it (0 = off)
  uint64_t seed = 1234;
  std::string device = "cpu";  // cpu | cuda
  std::string attention_backend = "flash";  // flash | plain | cudnn (CUDA only)
  std::string config_path;
  bool estimate_memory = false;
  nlohmann::json resolved;  // the full resolved config (same layout as the input file)
  std::vector<std::string> warnings;  // every config warning, also printed on rank 0
  std::string help_text;  // non-empty when --help was given: print it and exit 0
};

// Parses argv (dstrain's command line: --config/--deepspeed_config FILE plus
// Megatron flags that override the file). world_size = number of processes
// (DP = world / (tp * pp)). Throws ds::UserError with one clear line on any bad input.
TrainConfig parse_train_config(int argc, char** argv, int world_size);

// The same from an already merged JSON document (a config file, or the
// `resolved` JSON saved in a checkpoint). Re-parsing `resolved` gives it back.
TrainConfig train_config_from_json(const nlohmann::json& j, int world_size);

// DeepSpeed's batch-size rules in exactly one place: from any subset of
// (train_batch_size, micro_batch_size, grad_accum_steps) and dp_size, fills
// the rest or throws UserError naming the values.
void resolve_batch(BatchConfig& b);

// Megatron rule: the smallest multiple of divisible_by * tp that is >= vocab.
int padded_vocab(int vocab, int divisible_by, int tp);

// Enum <-> config-file spellings (used by logging and checkpoint metadata too).
const char* family_name(ModelFamily f);    // "gpt2" | "llama"
const char* precision_name(Precision p);   // "fp32" | "bf16" | "fp16"
const char* lr_decay_name(LrDecay d);      // "constant" | "linear" | "cosine"

}  // namespace ds
