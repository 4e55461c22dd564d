// Derived values and cross-field validation of TrainConfig.
// Every error is one line naming the fields (config key and flag) and values.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "lib/config/config_internal.h"
#include "lib/data/blended_dataset.h"
#include "lib/data/gpt_dataset.h"
#include "lib/optim/lr_schedule.h"

namespace ds {

namespace {

// train_iters from --train-samples, and the Megatron schedule's lengths in
// Megatron's own units: samples (iterations x global batch when training is
// iteration-based) and tokens.
// Megatron-LM's WSD: the final decay's length, in the unit of the run
// (iterations x global batch, or samples), required with lr_decay_style WSD.
void resolve_wsd(TrainConfig& cfg) {
  const ScheduleLengths& L = cfg.lengths;
  OptimizerConfig& o = cfg.optim;
  const bool wsd = o.decay == LrDecay::WSD;
  DS_USER_CHECK(L.lr_wsd_decay_iters >= 0 && L.lr_wsd_decay_samples >= 0,
                "training.lr_wsd_decay_iters {} and lr_wsd_decay_samples {} must be >= 0", L.lr_wsd_decay_iters,
                L.lr_wsd_decay_samples);
  DS_USER_CHECK(L.sample_based() ? L.lr_wsd_decay_iters == 0 : L.lr_wsd_decay_samples == 0,
                "training.{} with {}-based training: use {} ({})",
                L.sample_based() ? "lr_wsd_decay_iters" : "lr_wsd_decay_samples",
                L.sample_based() ? "sample" : "iteration",
                L.sample_based() ? "lr_wsd_decay_samples" : "lr_wsd_decay_iters",
                L.sample_based() ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters");
  if (!wsd) return;
  o.wsd_decay_iters = L.lr_wsd_decay_iters;
  o.wsd_decay_samples = L.sample_based() ? L.lr_wsd_decay_samples : L.lr_wsd_decay_iters * cfg.batch.train_batch_size;
  DS_USER_CHECK(o.wsd_decay_samples > 0 && o.wsd_decay_samples <= o.decay_samples,
                "training.lr_decay_style WSD needs a final decay of 1 to {} {} (the decay length; "
                "training.lr_wsd_decay_iters / --lr-wsd-decay-iters, or lr_wsd_decay_samples / "
                "--lr-wsd-decay-samples), got {}", L.sample_based() ? o.decay_samples : o.decay_iters,
                L.sample_based() ? "samples" : "iterations",
                L.sample_based() ? o.wsd_decay_samples : o.wsd_decay_iters);
  DS_USER_CHECK(o.decay_tokens < 0, "training.lr_decay_style WSD with a token-wise decay (lr_decay_tokens / "
                "--lr-decay-tokens) is not supported (Megatron-DeepSpeed has no WSD; Megatron-LM counts samples)");
}

void resolve_schedule_lengths(TrainConfig& cfg) {
  const ScheduleLengths& L = cfg.lengths;
  OptimizerConfig& o = cfg.optim;
  const int64_t gbs = cfg.batch.train_batch_size;
  DS_USER_CHECK(L.train_samples >= 0 && L.train_tokens >= 0 && L.lr_warmup_samples >= 0 && L.lr_decay_samples >= 0,
                "training.train_samples {}, train_tokens {}, lr_warmup_samples {} and lr_decay_samples {} must be >= 0",
                L.train_samples, L.train_tokens, L.lr_warmup_samples, L.lr_decay_samples);
  DS_USER_CHECK(L.lr_warmup_tokens >= -1 && L.lr_decay_tokens >= -1,
                "training.lr_warmup_tokens {} and lr_decay_tokens {} (--lr-warmup-tokens / --lr-decay-tokens) must "
                "be >= 0", L.lr_warmup_tokens, L.lr_decay_tokens);
  if (L.rampup.enabled()) {  // Megatron's batch-size ramp-up (batch_rampup.h)
    DS_USER_CHECK(L.sample_based(), "--rampup-batch-size needs sample-based training (--train-samples instead of "
                  "--train-iters), as in Megatron");
    check_batch_rampup(L.rampup, gbs, int64_t{cfg.batch.micro_batch_size} * cfg.batch.dp_size);
    DS_USER_CHECK(cfg.parallel.pp == 1, "--rampup-batch-size with pipeline parallelism (pipeline_model_parallel_size "
                  "{}) is not implemented yet: the pipeline schedule is built for a fixed number of micro-batches",
                  cfg.parallel.pp);
    DS_USER_CHECK(!cfg.cuda_graph, "--rampup-batch-size with --cuda-graph is not implemented yet (the captured step "
                  "has a fixed number of micro-batches)");
  }
  if (L.sample_based()) cfg.train_iters = L.rampup.iterations(L.train_samples, gbs);  // partial last batch dropped
  if (o.decay_iters == 0 && o.scheduler != LrScheduler::WarmupLR) o.decay_iters = cfg.train_iters;
  if (o.scheduler != LrScheduler::Megatron) return;
  const int64_t lim = gbs > 0 ? std::numeric_limits<int64_t>::max() / gbs : 0;
  const auto overflow = [&](int64_t iters) { return gbs > 0 && (iters > lim || iters < -lim); };
  DS_USER_CHECK(!overflow(o.decay_iters) && !overflow(o.warmup_iters),
                "lr_decay_iters {} / lr_warmup_iters {} times the global batch {} overflows", o.decay_iters,
                o.warmup_iters, gbs);
  if (L.sample_based()) {
    o.decay_samples = L.lr_decay_samples > 0 ? L.lr_decay_samples : L.train_samples;
    o.warmup_samples = L.lr_warmup_samples;
  } else {
    o.decay_samples = o.decay_iters * gbs;
    o.warmup_samples = o.warmup_iters * gbs;
  }
  o.warmup_tokens = L.lr_warmup_tokens;
  o.decay_tokens = L.lr_decay_tokens;
  resolve_wsd(cfg);
}

}  // namespace

void derive_config(TrainConfig& cfg, int world_size, Warnings& w) {
  ParallelConfig& p = cfg.parallel;
  cfg.layout = make_parallel_layout(parallel_request(p, cfg.model), world_size, std::max(0, cfg.model.num_layers),
                                    std::max(0, cfg.model.seq_length));
  p.sequence_parallel = cfg.layout.sequence_parallel;  // as Megatron: off when tp == 1
  cfg.batch.dp_size = cfg.layout.dp;  // Ulysses ranks of one replica read the same samples
  resolve_batch(cfg.batch);

  ModelConfig& m = cfg.model;
  if (m.ffn_hidden_size == 0 && m.hidden_size > 0) {  // a bad hidden size is reported as itself below
    const bool swiglu = m.activation == Activation::SwiGLU;
    const double ffn = swiglu ? std::floor(4.0 * m.hidden_size * 2.0 / 3.0 / 64.0) * 64 : 4.0 * m.hidden_size;
    DS_USER_CHECK(ffn <= std::numeric_limits<int>::max(), "model.hidden_size (--hidden-size) {} is too large: the "
                  "MLP size derived from it ({}, {}) is more than {}", m.hidden_size, ffn,
                  swiglu ? "8/3 x hidden rounded down to 64" : "4 x hidden", std::numeric_limits<int>::max());
    m.ffn_hidden_size = static_cast<int>(ffn);
  }
  if (m.vocab_size > 0 && m.make_vocab_size_divisible_by > 0)
    m.padded_vocab_size = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp);

  OptimizerConfig& o = cfg.optim;
  resolve_schedule_lengths(cfg);
  if (o.scheduler == LrScheduler::WarmupCosineLR) {
    o.min_lr = o.cos_min_ratio * o.lr;
    o.warmup_min_lr = o.warmup_min_ratio * o.lr;
  }
  if (o.scheduler != LrScheduler::Megatron && o.scheduler != LrScheduler::WarmupLR && o.decay_iters < o.warmup_iters)
    add_warning(w, fmt::format("scheduler.params.total_num_steps {} is less than warmup_num_steps {}", o.decay_iters,
                               o.warmup_iters));
  const LoggingConfig& l = cfg.log;
  if (!l.tensorboard_dir.empty() && l.ds_tensorboard)
    add_warning(w, fmt::format("TensorBoard: --tensorboard-dir '{}' is used; the DeepSpeed config's tensorboard "
                               "section (output_path '{}', job_name '{}') is not", l.tensorboard_dir,
                               l.ds_tensorboard_path, l.ds_tensorboard_job));
  if (cfg.ckpt.save_interval > 0 && cfg.ckpt.save_dir.empty())
    add_warning(w, fmt::format("training.save_interval {} is set but there is no save directory (--save); "
                               "no checkpoints will be written", cfg.ckpt.save_interval));
  // DeepSpeed's fp16 wrapper hands the optimizer one flat tensor per parameter
  // group: under fp16 1-bit Adam and 0/1 Adam compress per group.
  const std::optional<OptimizerKind> k = optimizer_kind(cfg.optim.spec);
  cfg.optim.spec.compress_param_groups =
      k && (*k == OptimizerKind::OneBitAdam || *k == OptimizerKind::ZeroOneAdam) &&
      cfg.precision.precision == Precision::FP16;
}

namespace {

void validate_nvme_offload(const TrainConfig& cfg);
void validate_param_offload(const TrainConfig& cfg);

void validate_model(const ModelConfig& m, const ParallelConfig& p) {
  DS_USER_CHECK(m.num_layers > 0, "model.num_layers (--num-layers) must be positive, got {}", m.num_layers);
  DS_USER_CHECK(m.hidden_size > 0, "model.hidden_size (--hidden-size) must be positive, got {}", m.hidden_size);
  DS_USER_CHECK(m.num_heads > 0, "model.num_heads (--num-attention-heads) must be positive, got {}", m.num_heads);
  DS_USER_CHECK(m.hidden_size % m.num_heads == 0,
                "model.hidden_size {} is not divisible by model.num_heads {} (--hidden-size / --num-attention-heads)",
                m.hidden_size, m.num_heads);
  DS_USER_CHECK(m.position != PositionKind::Rope || (m.hidden_size / m.num_heads) % 2 == 0,
                "RoPE needs an even head size, but hidden_size {} / num_heads {} = {}", m.hidden_size, m.num_heads,
                m.hidden_size / m.num_heads);
  DS_USER_CHECK(m.ffn_hidden_size > 0, "model.ffn_hidden_size (--ffn-hidden-size) must be positive, got {}",
                m.ffn_hidden_size);
  DS_USER_CHECK(m.seq_length > 0, "model.seq_length (--seq-length) must be positive, got {}", m.seq_length);
  DS_USER_CHECK(m.position != PositionKind::Learned || m.seq_length <= m.max_position_embeddings,
                "model.seq_length {} exceeds model.max_position_embeddings {} (--seq-length / "
                "--max-position-embeddings); learned positions cannot extend past the table",
                m.seq_length, m.max_position_embeddings);
  DS_USER_CHECK(m.vocab_size >= 0, "model.vocab_size must be >= 0 (0 = from the vocab file), got {}", m.vocab_size);
  DS_USER_CHECK(m.make_vocab_size_divisible_by > 0,
                "model.make_vocab_size_divisible_by (--make-vocab-size-divisible-by) must be positive, got {}",
                m.make_vocab_size_divisible_by);
  DS_USER_CHECK(m.init_method_std > 0, "model.init_method_std (--init-method-std) must be positive, got {}",
                m.init_method_std);
  DS_USER_CHECK(m.norm_eps > 0, "model.norm_eps (--norm-epsilon) must be positive, got {}", m.norm_eps);
  DS_USER_CHECK(m.rope_theta > 0, "model.rope_theta (--rotary-base) must be positive, got {}", m.rope_theta);
  const int nkv = m.num_kv_heads;
  DS_USER_CHECK(nkv >= 0 && (nkv == 0 || m.num_heads % nkv == 0),
                "model.num_key_value_heads {} (--num-key-value-heads / --num-query-groups) must be positive and "
                "divide model.num_heads {}",
                nkv, m.num_heads);
  const int rot = static_cast<int>((m.hidden_size / m.num_heads) * static_cast<double>(m.rotary_percent));
  DS_USER_CHECK(m.rotary_percent > 0.f && m.rotary_percent <= 1.f,
                "model.rotary_percent {} (--rotary-percent) must be in (0, 1]", m.rotary_percent);
  DS_USER_CHECK(m.position != PositionKind::Rope || (rot >= 2 && rot % 2 == 0),
                "model.rotary_percent {} (--rotary-percent) of head size {} rotates {} dims; it must be an even "
                "number >= 2",
                m.rotary_percent, m.hidden_size / m.num_heads, rot);
  DS_USER_CHECK(m.hidden_dropout >= 0 && m.hidden_dropout < 1,
                "model.hidden_dropout (--hidden-dropout) must be in [0, 1), got {}", m.hidden_dropout);
  DS_USER_CHECK(m.attention_dropout >= 0 && m.attention_dropout < 1,
                "model.attention_dropout (--attention-dropout) must be in [0, 1), got {}", m.attention_dropout);
  DS_USER_CHECK(m.embedding_dropout < 1, "model.embedding_dropout must be in [0, 1) (or < 0: as hidden_dropout), "
                "got {}", m.embedding_dropout);
  DS_USER_CHECK(m.num_heads % p.tp == 0,
                "model.num_heads {} is not divisible by tensor_model_parallel_size {} (--tensor-model-parallel-size)",
                m.num_heads, p.tp);
  DS_USER_CHECK(m.hidden_size % p.tp == 0, "model.hidden_size {} is not divisible by tensor_model_parallel_size {}",
                m.hidden_size, p.tp);
  DS_USER_CHECK(m.ffn_hidden_size % p.tp == 0,
                "model.ffn_hidden_size {} is not divisible by tensor_model_parallel_size {}", m.ffn_hidden_size, p.tp);
  validate_moe_model(m);
  // A model past any machine is refused here, before its layout is built.
  check_model_limits(m, "");
  DS_USER_CHECK(nkv == 0 || nkv % p.tp == 0 || p.tp % nkv == 0,
                "model.num_key_value_heads {} (--num-key-value-heads / --num-query-groups) must divide or be a "
                "multiple of tensor_model_parallel_size {}",
                nkv, p.tp);
}

// ZB-H1 (Megatron-DeepSpeed's deepspeed_zbh1_*): upstream asserts the exact
// semantics need the pipeline flag and refuses sequence parallelism as
// untested; dstrain runs it (its weight passes keep copies of the gathered
// inputs), tested against 1F1B.
void validate_zbh1(const TrainConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  DS_USER_CHECK(!p.zbh1_exact_semantics || p.zbh1_pipeline,
                "--enable-zbh1-exact-semantics (parallel.zbh1_exact_semantics) requires --enable-zbh1-pipeline (as in "
                "Megatron-DeepSpeed: exact semantics require the ZB-H1 pipeline)");
  if (!p.zbh1_pipeline) return;
  DS_USER_CHECK(p.num_layers_per_virtual_stage == 0,
                "--enable-zbh1-pipeline cannot be combined with --num-layers-per-virtual-pipeline-stage {}: ZB-H1 is a "
                "schedule of one model chunk per stage (DeepSpeed's pipeline engine, which runs it upstream, has no "
                "interleaving)", p.num_layers_per_virtual_stage);
  DS_USER_CHECK(cfg.zero.stage <= 1 || p.pp == 1,
                "--enable-zbh1-pipeline with zero_optimization.stage {}: ZB-H1 runs with ZeRO stages 0 and 1 (the stages "
                "DeepSpeed's pipeline engine takes); its weight passes would reduce-scatter every micro-batch twice",
                cfg.zero.stage);
}

void validate_parallel(const TrainConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  // Layers per (virtual) stage were checked when the layout was derived (make_parallel_layout).
  if (p.sp > 1) {
    const int nkv = m.num_kv_heads;
    DS_USER_CHECK(m.seq_length % p.sp == 0,
                  "DeepSpeed-Ulysses: model.seq_length {} is not divisible by ds_sequence_parallel_size {} "
                  "(--seq-length / --ds-sequence-parallel-size)", m.seq_length, p.sp);
    DS_USER_CHECK(m.num_heads % (p.tp * p.sp) == 0,
                  "DeepSpeed-Ulysses: model.num_heads {} is not divisible by tensor_model_parallel_size {} * "
                  "ds_sequence_parallel_size {} (each sequence-parallel rank attends with whole heads)",
                  m.num_heads, p.tp, p.sp);
    // kv heads of a tp rank (one replicated head when fewer than TP) split over SP, or are replicated.
    const int nkv_tp = nkv == 0 ? m.num_heads / p.tp : (nkv % p.tp == 0 ? nkv / p.tp : 1);
    DS_USER_CHECK(nkv_tp % p.sp == 0 || p.sp % nkv_tp == 0,
                  "DeepSpeed-Ulysses: {} key-value heads per tensor-parallel rank (num_key_value_heads {}, tp {}) "
                  "cannot be split over ds_sequence_parallel_size {}: one must divide the other",
                  nkv_tp, nkv == 0 ? m.num_heads : nkv, p.tp, p.sp);
    DS_USER_CHECK(!p.sequence_parallel || (m.seq_length / p.sp) % p.tp == 0,
                  "sequence parallelism with DeepSpeed-Ulysses: the {} positions per Ulysses rank (seq_length {} / "
                  "ds_sequence_parallel_size {}) are not divisible by tensor_model_parallel_size {}",
                  m.seq_length / p.sp, m.seq_length, p.sp, p.tp);
  }
  DS_USER_CHECK(!p.sequence_parallel || m.seq_length % p.tp == 0,
                "sequence parallelism: model.seq_length {} is not divisible by tensor_model_parallel_size {}",
                m.seq_length, p.tp);
  DS_USER_CHECK(p.recompute_num_layers >= 0 && p.recompute_num_layers <= m.num_layers / p.pp,
                "parallel.recompute_num_layers {} must be in [0, layers per stage {}]", p.recompute_num_layers,
                m.num_layers / p.pp);
  const ZeroConfig& z = cfg.zero;
  validate_zbh1(cfg);
  DS_USER_CHECK(z.stage >= 0 && z.stage <= 3, "zero_optimization.stage (--zero-stage) must be 0-3, got {}", z.stage);
  DS_USER_CHECK(!(z.stage >= 3 && p.pp > 1),
                "zero_optimization.stage {} cannot be combined with pipeline_model_parallel_size {} yet (ZeRO-3 "
                "gathers parameters per pass); use stage 0, 1 or 2", z.stage, p.pp);
  DS_USER_CHECK(z.reduce_bucket_size > 0 && z.allgather_bucket_size > 0,
                "zero_optimization: reduce_bucket_size {} and allgather_bucket_size {} must be positive",
                z.reduce_bucket_size, z.allgather_bucket_size);
  DS_USER_CHECK(z.stage3_prefetch_bucket_size >= 0 && z.stage3_max_live_parameters >= 0 &&
                    z.stage3_param_persistence_threshold >= 0,
                "zero_optimization: stage3_prefetch_bucket_size {}, stage3_max_live_parameters {} and "
                "stage3_param_persistence_threshold {} must be >= 0", z.stage3_prefetch_bucket_size,
                z.stage3_max_live_parameters, z.stage3_param_persistence_threshold);
  // On the CPU backend the optimizer reads the gradient shard where it is
  // (cpu: nothing moves; nvme: the tier's step reads it per sub-group).
  DS_USER_CHECK(cfg.precision.grad_accum == DType::F32 || z.offload_optimizer == OffloadDevice::None ||
                    cfg.device == DeviceType::CPU,
                "data_types.grad_accum_dtype '{}' with zero_optimization.offload_optimizer.device {} on a GPU is not "
                "supported (the host AdamW reads f32 gradients); use \"fp32\"",
                cfg.precision.grad_accum == DType::BF16 ? "bf16" : "fp16", offload_device_name(z.offload_optimizer));
  DS_USER_CHECK(z.offload_ratio >= 0 && z.offload_ratio <= 1,
                "zero_optimization.offload_optimizer.ratio {} must be in [0, 1]", z.offload_ratio);
  DS_USER_CHECK(z.offload_ratio == 1 || z.stage == 3, "zero_optimization.offload_optimizer.ratio {}: partial "
                "offloading is only supported with zero_optimization.stage 3 (as in DeepSpeed); stage is {}",
                z.offload_ratio, z.stage);
  DS_USER_CHECK(z.offload_ratio == 1 || cfg.device == DeviceType::CPU,
                "zero_optimization.offload_optimizer.ratio {}: partial offload (part of the optimizer state on the "
                "GPU) is not implemented; use ratio 1 (the whole state offloaded: the same values, more host memory)",
                z.offload_ratio);
  if (z.offload_optimizer == OffloadDevice::NVMe) validate_nvme_offload(cfg);
  if (z.offload_param != OffloadDevice::None) validate_param_offload(cfg);
  DS_USER_CHECK(!z.overlap_param_gather || z.stage == 1 || z.stage == 2,
                "parallel.overlap_param_gather (--overlap-param-gather) overlaps the parameter all-gather after the "
                "step of ZeRO stages 1 and 2; zero_optimization.stage is {} (stage 3 prefetches its gathers already)",
                z.stage);
}

// offload_optimizer.device nvme: DeepSpeed swaps optimizer state to NVMe in
// its stage-3 optimizer only (stages 1 and 2 take "cpu" alone); the host
// optimizer updates it sub-group by sub-group, on either backend.
void validate_nvme_offload(const TrainConfig& cfg) {
  const ZeroConfig& z = cfg.zero;
  DS_USER_CHECK(z.stage == 3, "zero_optimization.offload_optimizer.device nvme needs zero_optimization.stage 3 "
                "(as in DeepSpeed, which swaps optimizer state to NVMe in its stage-3 optimizer only); stage is {}",
                z.stage);
  DS_USER_CHECK(!z.nvme.nvme_path.empty(), "zero_optimization.offload_optimizer.nvme_path must name a directory "
                "on the NVMe device when offload_optimizer.device is nvme");
  DS_USER_CHECK(z.nvme.buffer_count >= 0, "zero_optimization.offload_optimizer.buffer_count must be >= 0, got {}",
                z.nvme.buffer_count);
  DS_USER_CHECK(z.sub_group_size > 0, "zero_optimization.sub_group_size must be > 0, got {}", z.sub_group_size);
  const AioConfig& a = z.nvme.aio;
  DS_USER_CHECK(a.block_size > 0 && a.block_size % kAioAlign == 0,
                "aio.block_size {} must be a positive multiple of {} (O_DIRECT requests)", a.block_size, kAioAlign);
  DS_USER_CHECK(a.queue_depth >= 1 && a.intra_op_parallelism >= 1,
                "aio.queue_depth {} and aio.intra_op_parallelism (thread_count) {} must be >= 1", a.queue_depth,
                a.intra_op_parallelism);
}

// offload_param: DeepSpeed's rule (stage 3 only); nvme here lives in the
// optimizer's swap file, so it needs offload_optimizer nvme on the same path.
void validate_param_offload(const TrainConfig& cfg) {
  const ZeroConfig& z = cfg.zero;
  DS_USER_CHECK(z.stage == 3, "zero_optimization.offload_param needs zero_optimization.stage 3 (as in DeepSpeed: "
                "parameters are partitioned at stage 3 only); stage is {}", z.stage);
  // On a GPU the host optimizer updates the offloaded shard where it lives
  // (DeepSpeed also runs offload_param alone, its optimizer reading the
  // parameters across PCIe; dstrain does not).
  DS_USER_CHECK(cfg.device == DeviceType::CPU || z.offload_optimizer != OffloadDevice::None,
                "zero_optimization.offload_param with a GPU (--device cuda) needs offload_optimizer too (cpu or "
                "nvme): the parameter shard in host memory is updated by the host optimizer");
  if (z.offload_param != OffloadDevice::NVMe) return;
  DS_USER_CHECK(z.offload_optimizer == OffloadDevice::NVMe,
                "zero_optimization.offload_param.device nvme needs offload_optimizer.device nvme too: dstrain keeps a "
                "rank's parameter shard in its optimizer swap file, updated in the same sub-groups");
  DS_USER_CHECK(z.param_nvme_path.empty() || z.param_nvme_path == z.nvme.nvme_path,
                "zero_optimization.offload_param.nvme_path '{}' differs from offload_optimizer.nvme_path '{}': dstrain "
                "keeps parameters and optimizer state in one swap file per rank; give the same directory",
                z.param_nvme_path, z.nvme.nvme_path);
}

void validate_optimizer(const OptimizerConfig& o) {
  DS_USER_CHECK(o.lr >= 0 && std::isfinite(o.lr), "optimizer lr (optimizer.params.lr / --lr) must be a finite "
                "number >= 0, got {}", o.lr);
  DS_USER_CHECK(o.cos_min_ratio >= 0 && o.cos_min_ratio <= 1 && o.warmup_min_ratio >= 0 && o.warmup_min_ratio <= 1,
                "scheduler.params: cos_min_ratio {} and warmup_min_ratio {} must be in [0, 1]", o.cos_min_ratio,
                o.warmup_min_ratio);
  DS_USER_CHECK(o.min_lr >= 0 && o.min_lr <= o.lr, "min_lr {} must be in [0, lr {}] (training.min_lr / --min-lr)",
                o.min_lr, o.lr);
  DS_USER_CHECK(o.warmup_min_lr >= 0 && o.warmup_min_lr <= o.lr,
                "warmup start lr {} must be in [0, lr {}] (warmup_min_lr / lr_warmup_init / --lr-warmup-init)",
                o.warmup_min_lr, o.lr);
  DS_USER_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                "optimizer.params.betas [{}, {}] must be in [0, 1) (--adam-beta1 / --adam-beta2)", o.beta1, o.beta2);
  DS_USER_CHECK(o.eps > 0, "optimizer.params.eps (--adam-eps) must be positive, got {}", o.eps);
  DS_USER_CHECK(o.weight_decay >= 0, "optimizer.params.weight_decay (--weight-decay) must be >= 0, got {}",
                o.weight_decay);
  DS_USER_CHECK(o.grad_clip >= 0, "gradient_clipping (--clip-grad) must be >= 0 (0 = off), got {}", o.grad_clip);
  DS_USER_CHECK(o.warmup_iters >= 0 && o.decay_iters >= 0,
                "lr warmup iterations {} and decay iterations {} must be >= 0 (--lr-warmup-iters / "
                "--lr-decay-iters)", o.warmup_iters, o.decay_iters);
  if (o.scheduler == LrScheduler::Megatron && o.decay != LrDecay::Constant && o.warmup_iters > 0 && o.decay_iters > 0)
    DS_USER_CHECK(o.warmup_iters < o.decay_iters,
                  "lr warmup iterations {} must be fewer than lr decay iterations {} (--lr-warmup-iters / "
                  "--lr-decay-iters, default: train iters)", o.warmup_iters, o.decay_iters);
  if (o.scheduler == LrScheduler::Megatron && o.decay != LrDecay::Constant && o.warmup_samples > 0 && o.decay_samples > 0)
    DS_USER_CHECK(o.warmup_samples < o.decay_samples,
                  "lr warmup samples {} must be fewer than lr decay samples {} (--lr-warmup-samples / "
                  "--lr-decay-samples, default: train samples)", o.warmup_samples, o.decay_samples);
}

void validate_data(const DataConfig& d) {
  (void)data::parse_split_weights(d.split, "data.split");  // the one --split parser (lib/data)
  DS_USER_CHECK(d.vocab_file.empty() == d.merge_file.empty(),
                "data.vocab_file '{}' and data.merge_file '{}' (--vocab-file / --merge-file) go together",
                d.vocab_file, d.merge_file);
  if (d.tokenizer_type) {
    const bool gpt2 = *d.tokenizer_type == data::TokenizerKind::GPT2BPE;
    DS_USER_CHECK(gpt2 || !d.tokenizer_model.empty(),
                  "data.tokenizer_type {} (--tokenizer-type) needs data.tokenizer_model (--tokenizer-model)",
                  data::tokenizer_kind_name(*d.tokenizer_type));
    DS_USER_CHECK(!gpt2 || d.tokenizer_model.empty(),
                  "data.tokenizer_model (--tokenizer-model) '{}' is not used by GPT2BPETokenizer, which reads "
                  "--vocab-file and --merge-file", d.tokenizer_model);
  } else {
    DS_USER_CHECK(d.tokenizer_model.empty(), "data.tokenizer_model (--tokenizer-model) '{}' needs "
                  "data.tokenizer_type (--tokenizer-type)", d.tokenizer_model);
  }
  if (!d.data_path.empty()) data::parse_blend(d.data_path, "data.data_path (--data-path)");
  const bool separate = !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty();
  DS_USER_CHECK(!(separate && !d.data_path.empty()),
                "data.data_path (--data-path) and the separate train/valid/test data paths (--train-data-path ...) "
                "exclude each other: give one form");
  DS_USER_CHECK(!separate || !d.train_data_path.empty(),
                "--valid-data-path / --test-data-path need --train-data-path (data.train_data_path)");
  if (!d.train_data_path.empty()) data::parse_blend(d.train_data_path, "data.train_data_path (--train-data-path)");
  if (!d.valid_data_path.empty()) data::parse_blend(d.valid_data_path, "data.valid_data_path (--valid-data-path)");
  if (!d.test_data_path.empty()) data::parse_blend(d.test_data_path, "data.test_data_path (--test-data-path)");
}

void validate_training(const TrainConfig& cfg) {
  DS_USER_CHECK(cfg.exit_interval >= 0, "training.exit_interval (--exit-interval) must be >= 0, got {}",
                cfg.exit_interval);
  DS_USER_CHECK(cfg.exit_duration_in_mins >= 0,
                "training.exit_duration_in_mins (--exit-duration-in-mins) must be >= 0, got {}", cfg.exit_duration_in_mins);
  DS_USER_CHECK(cfg.max_nan_iterations >= 1,
                "training.max_nan_iterations (--max-nan-iterations) must be >= 1, got {}", cfg.max_nan_iterations);
  DS_USER_CHECK(cfg.train_iters >= 0, "training.train_iters (--train-iters) must be >= 0, got {}", cfg.train_iters);
  DS_USER_CHECK(!(cfg.override_lr_scheduler && cfg.use_checkpoint_lr_scheduler),
                "training.override_opt_param_scheduler and use_checkpoint_opt_param_scheduler "
                "(--override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler): give at most one");
  const LoggingConfig& l = cfg.log;
  DS_USER_CHECK(l.log_interval > 0, "training.log_interval (--log-interval) must be positive, got {}", l.log_interval);
  DS_USER_CHECK(l.steps_per_print > 0, "steps_per_print must be positive, got {}", l.steps_per_print);
  DS_USER_CHECK(l.eval_interval >= 0 && l.eval_iters >= 0,
                "training.eval_interval {} and eval_iters {} must be >= 0 (--eval-interval / --eval-iters)",
                l.eval_interval, l.eval_iters);
  DS_USER_CHECK(l.cpu_peak_tflops >= 0, "training.cpu_peak_tflops (--cpu-peak-tflops) must be >= 0, got {}",
                l.cpu_peak_tflops);
  DS_USER_CHECK(cfg.ckpt.save_interval >= 0, "training.save_interval (--save-interval) must be >= 0, got {}",
                cfg.ckpt.save_interval);
  const PrecisionConfig& pc = cfg.precision;
  DS_USER_CHECK(pc.loss_scale >= 0 && pc.min_loss_scale > 0 && pc.loss_scale_window > 0 && pc.hysteresis >= 1 &&
                    pc.initial_scale_power >= 0 && pc.initial_scale_power < 64,
                "fp16: loss_scale {} (>= 0), min_loss_scale {} (> 0), loss_scale_window {} (> 0), hysteresis {} "
                "(>= 1), initial_scale_power {} (0-63) out of range",
                pc.loss_scale, pc.min_loss_scale, pc.loss_scale_window, pc.hysteresis, pc.initial_scale_power);
}

// curriculum_learning: the values themselves, then that every sequence length
// the schedule can produce fits the layouts that split the sequence.
void validate_curriculum(const TrainConfig& cfg) {
  const CurriculumConfig& c = cfg.curriculum;
  if (!c.enabled) return;
  const int64_t T = cfg.model.seq_length;
  DS_USER_CHECK(c.min_difficulty >= 1 && c.min_difficulty <= c.max_difficulty && c.max_difficulty <= T,
                "curriculum_learning: min_difficulty {} and max_difficulty {} must satisfy 1 <= min <= max <= "
                "model.seq_length {} (--seq-length): they are sequence lengths",
                c.min_difficulty, c.max_difficulty, T);
  if (c.schedule == CurriculumSchedule::FixedDiscrete) {
    DS_USER_CHECK(c.difficulty.size() == c.max_step.size() + 1,
                  "curriculum_learning.schedule_config: fixed_discrete needs one more difficulty than max_step "
                  "(the last difficulty holds after the last max_step), got {} difficulties and {} max_step values",
                  c.difficulty.size(), c.max_step.size());
    for (int64_t d : c.difficulty)
      DS_USER_CHECK(d <= T, "curriculum_learning.schedule_config.difficulty {} exceeds model.seq_length {} "
                    "(--seq-length): samples can only be shortened", d, T);
  } else {
    DS_USER_CHECK(c.total_curriculum_step >= 1 && c.difficulty_step >= 1,
                  "curriculum_learning.schedule_config: total_curriculum_step {} and difficulty_step {} must be "
                  "positive integers", c.total_curriculum_step, c.difficulty_step);
    DS_USER_CHECK(c.schedule != CurriculumSchedule::FixedRoot || (std::isfinite(c.root_degree) && c.root_degree > 0),
                  "curriculum_learning.schedule_config.root_degree {} must be a positive number", c.root_degree);
  }
  // Ulysses splits the sequence over SP ranks and Megatron sequence
  // parallelism each rank's part over TP: every length must divide evenly.
  const ParallelConfig& p = cfg.parallel;
  const int64_t split = static_cast<int64_t>(p.sp) * (p.sequence_parallel ? p.tp : 1);
  if (split == 1) return;
  for (int64_t L : curriculum_values(c))
    DS_USER_CHECK(L % split == 0,
                  "curriculum_learning: the schedule reaches sequence length {}, which is not divisible by {} "
                  "(ds_sequence_parallel_size {} x {} for sequence parallelism); choose min_difficulty, max_difficulty "
                  "and difficulty_step (or the fixed_discrete difficulties) as multiples of {}",
                  L, split, p.sp, p.sequence_parallel ? p.tp : 1, split);
}


// --cuda-graph: the replayed step must be the same kernels with the same
// arguments every step (docs/cuda.md, "CUDA graphs"), so everything that
// changes the step's work, its shapes or its in-graph scalars, and every
// layout with communication, is refused here by name. Dropout is not among
// them: its per-step key is read from device memory the graph refills.
void validate_cuda_graph(const TrainConfig& cfg, int world_size) {
  DS_USER_CHECK(cfg.cuda_graph_warmup >= 1,
                "training.cuda_graph_warmup (--cuda-graph-warmup-steps) must be >= 1, got {}", cfg.cuda_graph_warmup);
  if (!cfg.cuda_graph) return;
  auto refuse = [](bool bad, const char* what) {
    DS_USER_CHECK(!bad, "training.cuda_graph (--cuda-graph) cannot be combined with {}", what);
  };
  DS_USER_CHECK(cfg.device == DeviceType::CUDA,
                "training.cuda_graph (--cuda-graph) needs a GPU: give --device cuda (training.device is cpu)");
  const ParallelConfig& p = cfg.parallel;
  refuse(p.tp > 1, "tensor parallelism (--tensor-model-parallel-size > 1)");
  refuse(p.pp > 1, "pipeline parallelism (--pipeline-model-parallel-size > 1)");
  refuse(p.sp > 1, "sequence parallelism (ds_sequence_parallel_size > 1)");
  DS_USER_CHECK(world_size == 1,
                "training.cuda_graph (--cuda-graph) cannot be combined with data parallelism: it runs a single "
                "process on one GPU, this job has {} processes", world_size);
  refuse(cfg.zero.stage != 0, "zero_optimization.stage > 0 (use stage 0)");
  refuse(cfg.zero.offload_optimizer != OffloadDevice::None, "zero_optimization.offload_optimizer");
  const OptimizerSpec& os = cfg.optim.spec;
  DS_USER_CHECK(optimizer_kind(os) == OptimizerKind::AdamW && os.bias_correction,
                "training.cuda_graph (--cuda-graph) captures the fused AdamW update; optimizer.type {}{} has no "
                "device-gated step: use AdamW or drop --cuda-graph", os.type,
                optimizer_kind(os) == OptimizerKind::AdamL2 ? " with adam_w_mode false"
                : !os.bias_correction                      ? " with bias_correction false"
                                                           : "");
  refuse(cycles_momentum(cfg.optim), "scheduler OneCycle with cycle_momentum (the captured update has fixed betas); "
         "set scheduler.params.cycle_momentum false");
  // A dynamic fp16 loss scale is read from the step block inside the graph
  // and multiplies 1 / (B x T x ga) there: a power of two keeps that product
  // the eager step's loss weight bit for bit. 2^initial_scale_power doubled
  // or halved stays one unless the floor min_loss_scale is not.
  const PrecisionConfig& pc = cfg.precision;
  int exp2 = 0;
  DS_USER_CHECK(pc.precision != Precision::FP16 || pc.loss_scale > 0 || std::frexp(pc.min_loss_scale, &exp2) == 0.5,
                "training.cuda_graph (--cuda-graph) with a dynamic fp16 loss scale needs fp16.min_loss_scale "
                "(--min-loss-scale) to be a power of two, got {}", pc.min_loss_scale);
  refuse(cfg.curriculum.enabled, "curriculum_learning (the sequence length changes between steps)");
  refuse(cfg.data_sampling.active(), "--data-efficiency-curriculum-learning (the batches come from a sampler on the host)");
  refuse(cfg.attention_backend == AttentionBackend::Cudnn, "training.attention_backend cudnn (--attention-backend; not verified "
         "under capture): use flash, flash2 or plain");
}

}  // namespace

// DeepSpeed Compression's activation quantization: what dstrain runs of it
// (docs/config.md, "DeepSpeed Compression").
void validate_compression(const TrainConfig& cfg) {
  const CompressionConfig& c = cfg.compression;
  const ParallelConfig& p = cfg.parallel;
  if (c.weight_quant) {
    auto refuse = [](bool bad, const std::string& what) {
      DS_USER_CHECK(!bad, "compression_training.weight_quantization with {} is not implemented yet", what);
    };
    // DeepSpeed's engine: "MoQ (quantize in optimization step) weight quantization is only supported for FP16".
    DS_USER_CHECK(cfg.precision.precision == Precision::FP16,
                  "compression_training.weight_quantization (MoQ: quantizing in the optimizer step) is only supported "
                  "with fp16, as in DeepSpeed; this run is {}", cfg.precision.precision == Precision::BF16 ? "bf16"
                                                                                                      : "fp32");
    refuse(cfg.device != DeviceType::CPU, "--device cuda (the quantizer runs on the host's copy of the weights)");
    refuse(p.tp > 1, "tensor parallelism (each rank would quantize its shard's groups)");
    refuse(p.pp > 1, "pipeline parallelism");
    refuse(p.sp > 1, "DeepSpeed-Ulysses");
    refuse(cfg.zero.stage > 1, "zero_optimization.stage " + std::to_string(cfg.zero.stage) + " (stages 0 and 1 hold the "
                                                                                             "whole fp16 model)");
    refuse(cfg.zero.offload_optimizer != OffloadDevice::None, "zero_optimization.offload_optimizer");
    refuse(cfg.model.moe.enabled(cfg.model.num_layers), "Mixture-of-Experts layers");
    refuse(cfg.model.num_kv_heads != 0 && cfg.model.num_kv_heads != cfg.model.num_heads,
           "grouped-query attention (Megatron-DeepSpeed lays its query_key_value out otherwise)");
    refuse(cfg.model.activation == Activation::SwiGLU, "SwiGLU (Megatron-DeepSpeed lays its dense_h_to_4h out otherwise)");
  }
  if (!c.act_quant) return;
  auto refuse = [](bool bad, const std::string& what) {
    DS_USER_CHECK(!bad, "compression_training.activation_quantization with {} is not implemented yet", what);
  };
  refuse(p.pp > 1, "pipeline parallelism (Megatron-DeepSpeed's pipeline model names its modules differently, so "
                   "the module patterns pick other layers)");
  refuse(p.sequence_parallel, "sequence parallelism (--sequence-parallel)");
  refuse(p.sp > 1, "DeepSpeed-Ulysses (ds_sequence_parallel_size > 1)");
  refuse(cfg.model.moe.enabled(cfg.model.num_layers), "Mixture-of-Experts layers");
  refuse(cfg.cuda_graph, "--cuda-graph");
  // SymQuantizer with a static range divides by a (1)-shaped f32 scale, so
  // its output is f32 and the fp16/bf16 linear layer after it fails upstream.
  DS_USER_CHECK(!(c.act_symmetric && c.act_static) || cfg.precision.precision == Precision::FP32,
                "compression_training.activation_quantization: quantization_type symmetric with range_calibration "
                "static needs fp32 (DeepSpeed's quantizer returns f32 activations there, which its fp16/bf16 linear "
                "layers reject); use asymmetric or dynamic");
}

void validate_config(const TrainConfig& cfg, int world_size, Warnings& w) {
  validate_model(cfg.model, cfg.parallel);
  validate_parallel(cfg);
  validate_moe_parallel(cfg);
  validate_distill(cfg);
  validate_training(cfg);  // before the optimizer: its schedule lengths follow train_iters
  validate_optimizer(cfg.optim);
  DS_USER_CHECK(optimizer_kind(cfg.optim.spec) != OptimizerKind::Lamb ||
                    cfg.zero.offload_optimizer == OffloadDevice::None,
                "optimizer.type Lamb cannot be combined with zero_optimization.offload_optimizer: the offloaded step "
                "updates its range bucket by bucket and Lamb needs whole-tensor norms (DeepSpeed's ZeRO-Offload has "
                "no Lamb either); drop offload_optimizer");
  // DeepSpeed's engine: "DeepSpeed {Lamb, OneBitLamb} optimizer requires dynamic loss scaling".
  DS_USER_CHECK((optimizer_kind(cfg.optim.spec) != OptimizerKind::Lamb &&
                 optimizer_kind(cfg.optim.spec) != OptimizerKind::OneBitLamb) ||
                    cfg.precision.precision != Precision::FP16 || cfg.precision.loss_scale == 0,
                "optimizer.type {} requires dynamic loss scaling with fp16 (as in DeepSpeed): set fp16.loss_scale to "
                "0 (it is {})", cfg.optim.spec.type, cfg.precision.loss_scale);
  if (const OptimizerKind k = *optimizer_kind(cfg.optim.spec); is_onebit(k)) {
    const std::string& t = cfg.optim.spec.type;
    // DeepSpeed's engine asserts these names.
    const char* upstream = k == OptimizerKind::OneBitAdam ? "1bit-Adam" : k == OptimizerKind::ZeroOneAdam ? "0/1 Adam"
                                                                                                          : "1bit-Lamb";
    DS_USER_CHECK(cfg.zero.stage == 0, "optimizer.type {}: {} is not compatible with ZeRO (as in DeepSpeed); set "
                  "zero_optimization.stage 0 (it is {})", t, upstream, cfg.zero.stage);
    DS_USER_CHECK(!cfg.cuda_graph, "optimizer.type {} cannot be combined with --cuda-graph", t);
    DS_USER_CHECK(cfg.model.moe.expert_parallel_size == 1 || !cfg.model.moe.enabled(cfg.model.num_layers),
                  "optimizer.type {} with expert parallelism is not implemented yet", t);
    DS_USER_CHECK(cfg.parallel.sp == 1, "optimizer.type {} with DeepSpeed-Ulysses (ds_sequence_parallel_size {}) is "
                  "not implemented yet: its compressed exchange would stand in for the sequence ranks' gradient sum",
                  t, cfg.parallel.sp);
  }
  validate_data(cfg.data);
  validate_curriculum(cfg);
  validate_random_ltd(cfg, w);
  validate_data_sampling(cfg, w);
  validate_cuda_graph(cfg, world_size);
  validate_compression(cfg);
}

}  // namespace ds
