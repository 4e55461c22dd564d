// The config field tables (config_fields.h): each section's plain keys and
// the members they fill, read by config_sections.cpp / config_json.cpp and
// written by config.cpp from these same lines. Keys with logic stay beside
// the readers and writers (their comments name them).
#include "lib/config/config_internal.h"

namespace ds {

#define F DS_CONFIG_FIELD

// model: family (applied first so that explicit keys win), max_position_embeddings
// (defaults to seq_length), num_key_value_heads (saved as num_heads when 0), the
// enums norm / activation / position and the moe subsection are written out.
std::span<const ConfigField<ModelConfig>> model_fields() {
  static const ConfigField<ModelConfig> t[] = {
      F(ModelConfig, "num_layers", num_layers),
      F(ModelConfig, "hidden_size", hidden_size),
      F(ModelConfig, "num_heads", num_heads),
      F(ModelConfig, "ffn_hidden_size", ffn_hidden_size),
      F(ModelConfig, "seq_length", seq_length),
      F(ModelConfig, "vocab_size", vocab_size),
      F(ModelConfig, "make_vocab_size_divisible_by", make_vocab_size_divisible_by),
      F(ModelConfig, "untie_embeddings", untie_embeddings),
      F(ModelConfig, "bias", bias),
      F(ModelConfig, "rope_theta", rope_theta),
      F(ModelConfig, "rotary_percent", rotary_percent),
      F(ModelConfig, "norm_eps", norm_eps),
      F(ModelConfig, "init_method_std", init_method_std),
      F(ModelConfig, "hidden_dropout", hidden_dropout),
      F(ModelConfig, "attention_dropout", attention_dropout),
  };
  return t;
}

// data: the path lists (a string or a list) and tokenizer_type (an enum) are written out.
std::span<const ConfigField<DataConfig>> data_fields() {
  static const ConfigField<DataConfig> t[] = {
      F(DataConfig, "split", split),
      F(DataConfig, "vocab_file", vocab_file),
      F(DataConfig, "merge_file", merge_file),
      F(DataConfig, "tokenizer_model", tokenizer_model),
      F(DataConfig, "train_doc_idx_path", train_doc_idx_path),
      F(DataConfig, "train_sample_idx_path", train_sample_idx_path),
      F(DataConfig, "train_shuffle_idx_path", train_shuffle_idx_path),
  };
  return t;
}

// training: train_iters / train_samples / train_tokens (one of them saved),
// seed (checked non-negative), device and attention_backend (enums),
// log_interval (defaults to steps_per_print), rampup_batch_size,
// distillation and the learning-rate schedule keys are written out.
std::span<const ConfigField<TrainConfig>> training_fields() {
  static const ConfigField<TrainConfig> t[] = {
      F(TrainConfig, "exit_interval", exit_interval),
      F(TrainConfig, "max_nan_iterations", max_nan_iterations),
      F(TrainConfig, "exit_duration_in_mins", exit_duration_in_mins),
      F(TrainConfig, "exit_signal_handler", exit_signal_handler),
      F(TrainConfig, "override_opt_param_scheduler", override_lr_scheduler),
      F(TrainConfig, "use_checkpoint_opt_param_scheduler", use_checkpoint_lr_scheduler),
      F(TrainConfig, "estimate_memory", estimate_memory),
      F(TrainConfig, "cuda_graph", cuda_graph),
      F(TrainConfig, "cuda_graph_warmup", cuda_graph_warmup),
      F(TrainConfig, "save", ckpt.save_dir),
      F(TrainConfig, "load", ckpt.load_dir),
      F(TrainConfig, "save_interval", ckpt.save_interval),
      F(TrainConfig, "init_from", ckpt.init_from),
      F(TrainConfig, "finetune", ckpt.finetune),
      F(TrainConfig, "no_load_optim", ckpt.no_load_optim),
      F(TrainConfig, "reset_iteration", ckpt.reset_iteration),
      F(TrainConfig, "hf_convert", ckpt.hf_convert),
      F(TrainConfig, "export_hf", ckpt.export_hf),
      F(TrainConfig, "random_ltd", random_ltd.layers_converted),
      F(TrainConfig, "data_efficiency_curriculum_learning", data_sampling.flag),
      F(TrainConfig, "eval_interval", log.eval_interval),
      F(TrainConfig, "eval_iters", log.eval_iters),
      F(TrainConfig, "cpu_peak_tflops", log.cpu_peak_tflops),
      F(TrainConfig, "profile", log.profile),
      F(TrainConfig, "profile_dir", log.profile_dir),
      F(TrainConfig, "tensorboard_dir", log.tensorboard_dir),
      F(TrainConfig, "tensorboard_log_interval", log.tensorboard_log_interval),
      F(TrainConfig, "log_learning_rate_to_tensorboard", log.tb_learning_rate),
      F(TrainConfig, "log_loss_scale_to_tensorboard", log.tb_loss_scale),
      F(TrainConfig, "log_batch_size_to_tensorboard", log.tb_batch_size),
      F(TrainConfig, "log_timers_to_tensorboard", log.tb_timers),
      F(TrainConfig, "log_validation_ppl_to_tensorboard", log.tb_validation_ppl),
      F(TrainConfig, "log_optimizer_states_to_tensorboard", log.tb_optimizer_states),
      F(TrainConfig, "log_world_size_to_tensorboard", log.tb_world_size),
  };
  return t;
}

// parallel: recompute_granularity (an enum) and overlap_param_gather (a
// ZeroConfig member) are written out.
std::span<const ConfigField<ParallelConfig>> parallel_fields() {
  static const ConfigField<ParallelConfig> t[] = {
      F(ParallelConfig, "tensor_model_parallel_size", tp),
      F(ParallelConfig, "pipeline_model_parallel_size", pp),
      F(ParallelConfig, "sequence_parallel", sequence_parallel),
      F(ParallelConfig, "ds_sequence_parallel_size", sp),
      F(ParallelConfig, "num_layers_per_virtual_pipeline_stage", num_layers_per_virtual_stage),
      F(ParallelConfig, "zbh1_pipeline", zbh1_pipeline),
      F(ParallelConfig, "zbh1_exact_semantics", zbh1_exact_semantics),
      F(ParallelConfig, "recompute_num_layers", recompute_num_layers),
  };
  return t;
}

// fp16 (DeepSpeed): enabled (with bf16's, the precision) is written out.
std::span<const ConfigField<PrecisionConfig>> fp16_fields() {
  static const ConfigField<PrecisionConfig> t[] = {
      F(PrecisionConfig, "loss_scale", loss_scale),
      F(PrecisionConfig, "initial_scale_power", initial_scale_power),
      F(PrecisionConfig, "loss_scale_window", loss_scale_window),
      F(PrecisionConfig, "hysteresis", hysteresis),
      F(PrecisionConfig, "min_loss_scale", min_loss_scale),
      F(PrecisionConfig, "consecutive_hysteresis", consecutive_hysteresis),
  };
  return t;
}

// zero_optimization (DeepSpeed): the offload subsections and the keys
// accepted at dstrain's own value are written out.
std::span<const ConfigField<ZeroConfig>> zero_fields() {
  static const ConfigField<ZeroConfig> t[] = {
      F(ZeroConfig, "stage", stage),
      F(ZeroConfig, "reduce_bucket_size", reduce_bucket_size),
      F(ZeroConfig, "allgather_bucket_size", allgather_bucket_size),
      F(ZeroConfig, "overlap_comm", overlap_comm),
      F(ZeroConfig, "contiguous_gradients", contiguous_gradients),
      F(ZeroConfig, "stage3_prefetch_bucket_size", stage3_prefetch_bucket_size),
      F(ZeroConfig, "stage3_max_live_parameters", stage3_max_live_parameters),
      F(ZeroConfig, "stage3_param_persistence_threshold", stage3_param_persistence_threshold),
      F(ZeroConfig, "sub_group_size", sub_group_size),
      F(ZeroConfig, "load_from_fp32_weights", load_from_fp32_weights),
  };
  return t;
}

// zero_optimization.offload_optimizer with device nvme: device, pin_memory
// and ratio (ZeroConfig members shared with device cpu) are written out.
std::span<const ConfigField<NvmeOffloadConfig>> nvme_fields() {
  static const ConfigField<NvmeOffloadConfig> t[] = {
      F(NvmeOffloadConfig, "nvme_path", nvme_path),
      F(NvmeOffloadConfig, "buffer_count", buffer_count),
      F(NvmeOffloadConfig, "pipeline_read", pipeline_read),
      F(NvmeOffloadConfig, "pipeline_write", pipeline_write),
      F(NvmeOffloadConfig, "fast_init", fast_init),
  };
  return t;
}

// aio (DeepSpeed): thread_count, the older name of intra_op_parallelism, is
// read first; use_gds is warned about.
std::span<const ConfigField<AioConfig>> aio_fields() {
  static const ConfigField<AioConfig> t[] = {
      F(AioConfig, "block_size", block_size),
      F(AioConfig, "queue_depth", queue_depth),
      F(AioConfig, "intra_op_parallelism", intra_op_parallelism),
      F(AioConfig, "single_submit", single_submit),
      F(AioConfig, "overlap_events", overlap_events),
  };
  return t;
}

// csv_monitor and tensorboard (DeepSpeed's monitor sections).
std::span<const ConfigField<LoggingConfig>> csv_monitor_fields() {
  static const ConfigField<LoggingConfig> t[] = {
      F(LoggingConfig, "enabled", csv_enabled),
      F(LoggingConfig, "output_path", csv_path),
      F(LoggingConfig, "job_name", csv_job_name),
  };
  return t;
}

std::span<const ConfigField<LoggingConfig>> tensorboard_fields() {
  static const ConfigField<LoggingConfig> t[] = {
      F(LoggingConfig, "enabled", ds_tensorboard),
      F(LoggingConfig, "output_path", ds_tensorboard_path),
      F(LoggingConfig, "job_name", ds_tensorboard_job),
  };
  return t;
}

#undef F

}  // namespace ds
