// Training loop implementation.
#include "lib/train/trainer.h"

#include "lib/core/device_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/ranges.h>

#include "lib/ckpt/file_io.h"
#include "lib/ckpt/hf.h"
#include "lib/optim/onebit_exchange.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/mem_tag.h"
#include "lib/core/sync_counter.h"
#include "lib/model/tp_shard.h"
#include "lib/model/param_init.h"
#include "lib/ops/ops.h"
#include "lib/optim/lr_schedule.h"
#include "lib/train/compression.h"
#include "lib/train/curriculum_sampler.h"
#include "lib/train/distill.h"
#include "lib/train/exit_signal.h"
#include "lib/train/memory_estimate.h"
#include "lib/train/schedule_resume.h"
#include "lib/parallel/pipeline_schedule.h"

namespace ds {
namespace {

RecomputeConfig recompute_config(const ParallelConfig& p) {
  RecomputeConfig r;
  r.kind = p.recompute;
  r.num_layers = p.recompute_num_layers;
  return r;
}

// Experts each expert-parallel rank holds, per MoE layer (the layers' counts / EP).
std::vector<int> expert_blocks(const std::vector<int>& experts_per_layer, int ep) {
  std::vector<int> out;
  for (int e : experts_per_layer)
    if (e > 1) out.push_back(e / ep);
  return out;
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, Comms& comms, int local_rank, std::unique_ptr<BatchSource> data)
    : cfg_(cfg), comms_(comms), local_rank_(local_rank), start_(std::chrono::steady_clock::now()) {
  setup_device_and_precision();
  resolve_vocab(cfg_);
  check_inputs_and_outputs();
  data_ = data ? std::move(data) : std::make_unique<DataPipeline>(cfg_, dev_);
  build_model_and_optimizer();
  load_or_init();
  first_iteration_ = state_.iteration;
  if (state_.consumed_tokens < 0) state_.consumed_tokens = state_.consumed_samples * cfg_.model.seq_length;
  seqlen_ = cfg_.model.seq_length;
  if (cfg_.curriculum.enabled) {
    const CurriculumConfig& c = cfg_.curriculum;
    curriculum_ = std::make_unique<CurriculumScheduler>(c);
    curriculum_->replay(state_.iteration);  // a resumed run continues the schedule exactly
    DS_LOG("curriculum learning (sequence length): {} from {} to {} tokens{}; each training sample keeps its first "
           "curriculum seqlen tokens (validation uses all {})",
           curriculum_schedule_name(c.schedule), c.min_difficulty, c.max_difficulty,
           c.schedule == CurriculumSchedule::FixedDiscrete
               ? std::string()
               : fmt::format(" over {} steps in multiples of {}", c.total_curriculum_step, c.difficulty_step),
           cfg_.model.seq_length);
  }
  if (cfg_.log.csv_enabled && comms_.grid.rank == 0) csv_.open(cfg_.log.csv_path, cfg_.log.csv_job_name);
  open_tensorboard();
  log_setup();
  setup_step_runner();
}

Trainer::~Trainer() = default;

void Trainer::check_inputs_and_outputs() {
  // Outputs and inputs that would fail only after training are refused before it.
  if (!cfg_.ckpt.export_hf.empty()) {
    check_hf_exportable(cfg_.model, "--export-hf");
    check_export_dir(cfg_.ckpt.export_hf, "--export-hf");
  }
  if (!cfg_.ckpt.save_dir.empty()) check_output_dir(cfg_.ckpt.save_dir, "--save");
  if (comms_.grid.rank == 0 && (!cfg_.ckpt.save_dir.empty() || !cfg_.ckpt.export_hf.empty())) {
    const DataConfig& dc = cfg_.data;
    tokenizer_copy_ = read_run_tokenizer(data::tokenizer_kind_name(dc.tokenizer_kind()), dc.vocab_file, dc.merge_file,
                                         dc.tokenizer_model);
  }
  if (!cfg_.ckpt.load_dir.empty()) {
    std::error_code ec;
    namespace fs = std::filesystem;
    DS_USER_CHECK(!fs::exists(cfg_.ckpt.load_dir, ec) || fs::is_directory(cfg_.ckpt.load_dir, ec),
                  "--load '{}' is a file, not a checkpoint directory (for Hugging Face weights use --init-from)",
                  cfg_.ckpt.load_dir);
  }
}

// The grid's views of this rank, its sharding groups, the model, the
// optimizer and the passes (eager or pipeline).
void Trainer::build_model_and_optimizer() {
  tagged_before_.params = live_tagged_bytes(MemTag::Params, dev_.type);
  tagged_before_.grads = live_tagged_bytes(MemTag::Grads, dev_.type);
  tagged_before_.optimizer = live_tagged_bytes(MemTag::Optimizer, dev_.type);
  DS_USER_CHECK(comms_.grid.pp == 1 || cfg_.zero.stage <= 2,
                "zero_optimization.stage {} cannot be combined with pipeline_model_parallel_size {} yet; use ZeRO "
                "stage 0, 1 or 2", cfg_.zero.stage, comms_.grid.pp);
  const ParallelLayout& pl = cfg_.layout;
  DS_CHECK(pl.world == comms_.grid.world && pl.tp == comms_.grid.tp && pl.pp == comms_.grid.pp &&
               pl.ulysses == comms_.grid.sp && pl.dp == comms_.grid.dp,
           "the rank grid ({}) is not the config's layout ({})", comms_.grid.describe(), pl.describe());
  shard_ = comms_.grid.shard_coords(pl.vp);
  dp_ = comms_.grid.dp;
  dp_rank_ = comms_.grid.dp_rank;
  sdp_ = comms_.grid.sdp;
  sdp_rank_ = comms_.grid.sdp_rank;
  full_layout_ = build_layout(cfg_.model);
  if (!cfg_.ckpt.init_from.empty())  // the weights' header against the model, before the model is allocated
    check_hf_weights(cfg_.model, full_layout_, cfg_.ckpt.init_from, "the model config", cfg_.ckpt.init_from_vocab);
  const TpComm tp{shard_.tp > 1 ? comms_.tp : nullptr, shard_.tp, shard_.tp_rank, cfg_.parallel.sequence_parallel};
  EpComm ep{shard_.ep > 1 ? comms_.ep : nullptr, shard_.ep, shard_.ep_rank, {}};
  ep.trace = [this](const char* what, EpComm::Clock::time_point b, EpComm::Clock::time_point e) {
    if (timeline_.enabled()) timeline_.add({what, "comm", 0, timeline_.us(b), timeline_.us(b), timeline_.us(e)});
  };
  const PipeStage stage{shard_.pp, shard_.pp_rank, shard_.vp, ep};
  const ModelLayout local = build_layout(cfg_.model, shard_);
  // DeepSpeed folds Ulysses into data parallelism: gradients are reduced and
  // ZeRO partitions over the sequence-data-parallel group (SP x DP). With
  // expert parallelism each parameter group is partitioned over its own ranks
  // (the sharding groups below); the optimizer files are then counted and
  // named by the expert-data-parallel rank (one set per expert-parallel rank).
  const bool experts_apart = shard_.ep > 1;
  zero_ranks_ = experts_apart ? comms_.grid.edp : sdp_;
  zero_rank_ = experts_apart ? comms_.grid.edp_rank : sdp_rank_;
  ZeroPartition part = make_zero_partition(local.total, zero_ranks_);
  const DType compute = compute_dtype(cfg_.precision.precision);
  Communicator* dp_comm = zero_ranks_ > 1 ? (experts_apart ? comms_.edp : comms_.sdp) : nullptr;
  // ZeRO 1-3 with expert parallelism: as DeepSpeed, the dense weights' state
  // is partitioned over every data-parallel rank, the experts' over the
  // expert-data-parallel ones (each group in its own space, ShardGroup).
  std::vector<ShardGroup> sharding;
  if (cfg_.zero.stage >= 1 && experts_apart) {
    for (const bool experts : {false, true}) {
      GroupSpace space(group_ranges(local, [&](const ParamGroupSpec& g) {
        return g.reduces_over(ParallelAxis::ExpertData) == experts;
      }));
      const int ranks = experts ? comms_.grid.edp : sdp_;
      Communicator* c = ranks > 1 ? (experts ? comms_.edp : comms_.sdp) : nullptr;
      const ZeroPartition gp = make_zero_partition(space.total(), ranks);
      sharding.push_back(ShardGroup{.name = experts ? "experts" : "dense", .ep_shared = !experts, .dp = c,
                                    .space = std::move(space), .part = gp});
    }
  }
  if (cfg_.zero.stage >= 2) {
    store_ = std::make_unique<ZeroParamStore>(local, cfg_.model.num_layers, dev_, dp_comm, cfg_.zero, part,
                                              compute, cfg_.precision.grad_accum, sharding);
    model_ = std::make_unique<GptModel>(cfg_.model, dev_, *store_, tp, stage, compute);
  } else {  // ZeRO-1: the store all-gathers the updated weights (mixed: f32 master of this rank's range only)
    const bool zero1 = cfg_.zero.stage == 1 && dp_comm;
    FlatStoreOptions flat{.grad = cfg_.precision.grad_accum, .dp = zero1 && sharding.empty() ? dp_comm : nullptr,
                          .part = part, .groups = sharding, .allgather_bucket = cfg_.zero.allgather_bucket_size,
                          .overlap_param_gather = cfg_.zero.overlap_param_gather};
    model_ = std::make_unique<GptModel>(cfg_.model, dev_, 0, tp, stage, compute, flat);
  }
  if (comms_.grid.sp > 1) model_->set_ulysses({comms_.sp, comms_.grid.sp, comms_.grid.sp_rank});
  model_->set_recompute(recompute_config(cfg_.parallel));
  moe_ = model_->has_moe();
  if (cfg_.distill.enabled) {
    teacher_ = load_teacher(cfg_, dev_, compute);
    model_->set_distillation(distill_settings(cfg_, *teacher_));
  }
  if (cfg_.compression.act_quant) {
    ActivationQuantization q = activation_quantization(cfg_);
    int n = 0;
    for (const auto& layer : q.bits) n += static_cast<int>(std::count_if(layer.begin(), layer.end(), [](int b) { return b > 0; }));
    DS_LOG("activation quantization ({}, {} range): the inputs of {} of the layers' {} linear layers, from step {} of "
           "this run on", cfg_.compression.act_symmetric ? "symmetric" : "asymmetric",
           cfg_.compression.act_static ? "static" : "dynamic", n, 4 * cfg_.model.num_layers,
           cfg_.compression.act_offset + 1);
    model_->set_activation_quantization(std::move(q));
  }
  if (cfg_.random_ltd.active()) {
    const RandomLtdConfig& r = cfg_.random_ltd;
    model_->set_random_ltd({.layers = r.layer_ids, .reserved = 0});
    DS_LOG("random-LTD: {} of {} layers drop tokens in training; reserved length {} -> {} over {} steps (multiples "
           "of {})", r.layer_ids.size(), cfg_.model.num_layers, r.schedule.min_value, r.schedule.max_value,
           r.schedule.require_steps, r.schedule.seq_per_step);
  }
  if (cfg_.compression.weight_quant) {
    wq_ = std::make_unique<WeightQuantizer>(cfg_, model_->layout());
    DS_LOG("weight quantization (MoQ, {}, {} groups per weight): the fp16 weights of {} linear layers, quantized after "
           "each optimizer step from step {} of this run on (the f32 master weights stay exact)",
           cfg_.compression.wq_symmetric ? "symmetric" : "asymmetric", cfg_.compression.wq_groups, wq_->weights(),
           cfg_.compression.wq_offset + 1);
  }
  opt_ = std::make_unique<ZeroOptimizer>(*model_, dp_comm, cfg_.zero, part, store_.get(), cfg_.optim.spec);
  opt_->set_timeline(&timeline_);
  if (shard_.tp > 1 || shard_.pp > 1)  // each parameter counted once over the model-parallel (tp x pp) ranks
    opt_->set_norm_counted(norm_counted_ranges(local));
  // Stages 0/1: the experts group's gradients are all-reduced over the
  // expert-data-parallel ranks, the dense ones over all (stages 2/3: the
  // store reduces each sharding group over its ranks).
  if (experts_apart && !store_)
    opt_->set_expert_reduce(
        group_ranges(local, [](const ParamGroupSpec& g) { return g.reduces_over(ParallelAxis::ExpertData); }),
        sdp_ > 1 ? comms_.sdp : nullptr);
  if (shard_.pp > 1) {
    pipe_ = std::make_unique<PipelineExecutor>(*model_, *comms_.pp, static_cast<int>(cfg_.batch.grad_accum_steps),
                                               comms_.pp_grad, cfg_.zero.overlap_comm, cfg_.parallel.zbh1_pipeline,
                                               cfg_.parallel.zbh1_exact_semantics);
    pipe_->set_timeline(&timeline_);
    // overlap_comm, stages 0/1: buckets are reduced during the last backward,
    // except the tied embedding's, whose first+last stage all-reduce must come
    // first (tied_embedding_all_reduce, then reduce_gradients issues them).
    pipe_->set_last_backward_hook([this] { opt_->begin_last_micro_batch(); });
    if (comms_.embedding->size() > 1 && !model_->dims().untied) opt_->hold_unit(0);
    if (store_ && comms_.embedding->size() > 1 && !model_->dims().untied) store_->defer_unit(0);
    passes_ = pipe_.get();
  } else {
    if (cfg_.parallel.zbh1_pipeline)
      DS_LOG("--enable-zbh1-pipeline with one pipeline stage: nothing to split, every backward runs whole (as "
             "upstream's schedule does on its first stage)");
    eager_ = std::make_unique<EagerPasses>(*model_, [this] { opt_->begin_last_micro_batch(); });
    passes_ = eager_.get();
  }
  if (cfg_.zero.offload_ratio < 1)  // (config_validate: the CPU backend only)
    DS_LOG("offload_optimizer.ratio {}: the whole optimizer state is offloaded here (partial offload places part of "
           "it on a GPU; on the CPU backend that changes nothing, the values are the same)",
           cfg_.zero.offload_ratio);
  if (cfg_.zero.offload_param == OffloadDevice::CPU && !dev_.is_cuda())
    DS_LOG("offload_param.device = cpu on the CPU backend: the parameters are in host memory already, so nothing "
           "moves");
  else if (cfg_.zero.offload_param == OffloadDevice::CPU)
    DS_LOG("offload_param.device = cpu: this rank's fp32 parameter shard lives in host memory; a ZeRO-3 gather "
           "copies the rank's piece of a unit to the GPU when the unit is fetched, and the host optimizer updates "
           "the shard in place (nothing is copied back after the step)");
  if (cfg_.zero.offload_optimizer == OffloadDevice::CPU && !dev_.is_cuda())
    DS_LOG("offload_optimizer.device = cpu on the CPU backend: the optimizer state is in host memory already, so "
           "nothing moves and the run is the one without it");
  else if (cfg_.zero.offload_optimizer == OffloadDevice::CPU)
    DS_LOG("offload_optimizer.device = cpu: Adam m, v and the fp32 master range of this rank live in host memory; "
           "AdamW runs on the CPU");
  int64_t n_matmul = full_layout_.total;
  if (const ParamSpec* p = full_layout_.try_find("embed.wpe")) n_matmul -= p->numel;
  // Mixture of Experts: a token runs through topk of each MoE layer's experts.
  n_matmul -= inactive_expert_params(full_layout_, cfg_.model.moe.topk);
  flops_per_token_ = flops_per_token(cfg_.model, n_matmul);
}

void Trainer::log_setup() {
  DS_LOG("model: {} layers, hidden {}, heads {}, ffn {}, vocab {} (padded {}), {} parameters",
         model_->dims().L, model_->dims().C, model_->dims().NH, model_->dims().F, model_->dims().V,
         model_->dims().Vp, model_->layout().total);
  if (moe_) {
    const MoeConfig& m = cfg_.model.moe;
    int moe_layers = 0;
    for (int e : model_->dims().experts) moe_layers += e > 1 ? 1 : 0;
    DS_LOG("mixture of experts: {} MoE layers (every {}{}), experts {}, top-{}, {} parameters active per token; "
           "capacity factor {} (eval {}), min capacity {}, {}; loss coefficient {}",
           moe_layers, m.expert_interval, m.residual ? ", PR-MoE: a dense MLP beside the experts" : "",
           fmt::join(m.num_experts, ","), m.topk,
           full_layout_.total - inactive_expert_params(full_layout_, m.topk), m.train_capacity_factor,
           m.eval_capacity_factor, m.min_capacity, m.drop_tokens ? "dropping tokens" : "dropless", m.loss_coeff);
  }
  if (const OptimizerKind k = optimizer_kind(cfg_.optim.spec).value_or(OptimizerKind::AdamW); is_onebit(k)) {  // the bytes a rank sends per step
    const OptimizerSpec& sp = cfg_.optim.spec;
    int64_t compressed = 0;
    if (k == OptimizerKind::OneBitLamb) {  // one tensor: the whole momentum
      compressed = onebit_bytes_sent(model_->layout().total, sdp_);
    } else if (sp.compress_param_groups) {  // fp16: one unit per parameter group (decay, no decay)
      int64_t decay = 0, rest = 0;
      for (const ParamSpec& p : model_->layout().params) (p.decay ? decay : rest) += p.numel;
      compressed = onebit_bytes_sent(decay, sdp_) + onebit_bytes_sent(rest, sdp_);
    } else {
      for (const ParamSpec& p : model_->layout().params) compressed += onebit_bytes_sent(p.numel, sdp_);
    }
    const int64_t ring = sdp_ > 1 ? 2 * (sdp_ - 1) * 4 * model_->layout().total / sdp_ : 0;
    const std::string phases =
        k == OptimizerKind::ZeroOneAdam
            ? fmt::format("variance steps on all-reduced gradients at intervals doubling every {} of them "
                          "(var_update_scaler), the gradients between them exchanged in 1-bit form; after step {} "
                          "(var_freeze_step) local steps, the ranks synchronising their accumulated updates in "
                          "1-bit form at intervals doubling every {} steps up to {} (local_step_scaler, "
                          "local_step_clipper)",
                          sp.var_update_scaler, sp.var_freeze_step, sp.local_step_scaler, sp.local_step_clipper)
            : fmt::format("the warm-up with all-reduced gradients until step {} (freeze_step), then the variance "
                          "frozen and {} momentum exchanged in 1-bit form",
                          sp.freeze_step,
                          k == OptimizerKind::OneBitLamb ? "the whole"
                          : sp.compress_param_groups     ? "each parameter group's (fp16, as DeepSpeed's)"
                                                         : "each tensor's");
    DS_LOG("{}: an initialising step, then {}, over {} data-parallel rank{}: at most about {} bytes sent per rank "
           "per compressed exchange, against {} for a ring all-reduce of the f32 gradients",
           sp.type, phases, sdp_, sdp_ == 1 ? "" : "s", compressed, ring);
  }
  if (moe_ && shard_.ep > 1)
    DS_LOG("expert parallel: {} ranks, this rank holds block {} of each MoE layer's experts ({} per MoE "
           "layer); expert gradients reduce over {} expert-data-parallel ranks",
           shard_.ep, shard_.ep_rank, fmt::join(expert_blocks(model_->dims().experts, shard_.ep), ","),
           comms_.grid.edp);
  if (shard_.tp > 1)
    DS_LOG("tensor parallel: {} ranks, this rank holds {} of the model's {} parameters ({} heads, vocab rows "
           "[{}, {}))",
           shard_.tp, model_->layout().total, full_layout_.total, model_->dims().NH / shard_.tp,
           shard_.tp_rank * (model_->dims().Vp / shard_.tp), (shard_.tp_rank + 1) * (model_->dims().Vp / shard_.tp));
  if (moe_ && model_->expert_tp())
    DS_LOG("expert tensor parallel: each expert's fc and proj split over the {} tp ranks ({} of the ffn's {} "
           "columns per rank); the experts' output summed over tp",
           shard_.tp, model_->dims().F / shard_.tp, model_->dims().F);
  if (shard_.pp > 1)
    DS_LOG(
        "pipeline parallel: {} stages ({}), this is stage {} with layers [{}, {}); {} micro-batches per step, "
        "bubble fraction {:.3f}, up to {} chunk activations live",
        shard_.pp,
        shard_.vp > 1 ? "interleaved 1F1B, " + std::to_string(shard_.vp) + " model chunks per stage"
        : pipe_->kind() == ScheduleKind::ZeroBubbleH1      ? std::string("ZB-H1")
        : pipe_->kind() == ScheduleKind::ZeroBubbleH1Exact ? std::string("ZB-H1, exact semantics")
                                                           : std::string("1F1B"),
        shard_.pp_rank, model_->layout().first_layer, model_->layout().end_layer, cfg_.batch.grad_accum_steps,
        bubble_fraction(pipe_->kind(), shard_.pp, static_cast<int>(cfg_.batch.grad_accum_steps), shard_.vp),
        pipe_->max_live());
  DS_LOG("batch: global {} = micro {} x grad accum {} x data parallel {}; {} train samples per epoch",
         cfg_.batch.train_batch_size, cfg_.batch.micro_batch_size, cfg_.batch.grad_accum_steps, cfg_.batch.dp_size,
         data_->train_samples_per_epoch());
  if (const BatchRampup& r = cfg_.lengths.rampup; r.enabled())
    DS_LOG("batch size ramp-up: the global batch grows from {} by {} over the first {} samples to {} (now {}); {} "
           "iterations for {} training samples",
           r.start, r.increment, r.samples, cfg_.batch.train_batch_size,
           r.batch_at(state_.consumed_samples, cfg_.batch.train_batch_size), cfg_.train_iters,
           cfg_.lengths.train_samples);
  if (comms_.grid.sp > 1)
    DS_LOG("DeepSpeed-Ulysses sequence parallel: {} ranks, this rank holds positions [{}, {}) of every sample and "
           "attends over all {} with {} of the {} heads; gradients reduced over {} sequence-data-parallel ranks",
           comms_.grid.sp, comms_.grid.sp_rank * cfg_.model.seq_length / comms_.grid.sp,
           (comms_.grid.sp_rank + 1) * cfg_.model.seq_length / comms_.grid.sp, cfg_.model.seq_length,
           cfg_.model.num_heads / shard_.tp / comms_.grid.sp, cfg_.model.num_heads, sdp_);
  if (cfg_.parallel.sequence_parallel)
    DS_LOG("sequence parallel: norms and residuals hold {} of the {} positions per rank",
           cfg_.model.seq_length / comms_.grid.sp / shard_.tp, cfg_.model.seq_length);
  DS_LOG("activations: {} bytes saved per micro-batch on this rank (micro {} x seq {}, recompute {}{})",
         model_->saved_activation_bytes(cfg_.batch.micro_batch_size, cfg_.model.seq_length / comms_.grid.sp),
         cfg_.batch.micro_batch_size,
         comms_.grid.sp > 1 ? std::to_string(cfg_.model.seq_length / comms_.grid.sp) + " of " +
                                  std::to_string(cfg_.model.seq_length)
                            : std::to_string(cfg_.model.seq_length),
         cfg_.parallel.recompute == RecomputeKind::None ? "none" : recompute_granularity_name(cfg_.parallel.recompute),
         cfg_.parallel.recompute == RecomputeKind::Full
             ? ", " + std::to_string(cfg_.parallel.recompute_num_layers) + " layers per chunk (0: all)"
             : std::string());
  log_model_state();
}

void Trainer::setup_step_runner() {
  // The update is gated on the device (train_step) where nothing after it
  // involves another process and it runs on the compute device.
  device_update_ = comms_.world->size() == 1 && cfg_.zero.offload_optimizer == OffloadDevice::None &&
                   opt_->optimizer().has_gated_step();
  step_block_ = Tensor::zeros({kStepStats + AdamWSlot::Count}, DType::F32, dev_);
  if (device_update_ && dev_.is_cuda())
    pinned_terms_.reset(static_cast<float*>(device_runtime(dev_).alloc_pinned(kStepHostSlots * sizeof(float))));
  StepBody body = [this](const StepPlan& p, const MicroBatchFeed& feed) { step_body(p, feed); };
  if (!cfg_.cuda_graph) {
    runner_ = std::make_unique<DirectStep>(std::move(body),
                                           [this](int m) { return data_->to_device(host_train_batch(m)); });
    return;
  }
  // validate_cuda_graph refused every other layout and device already; these
  // hold by construction.
  DS_CHECK(dev_.is_cuda() && !pipe_ && comms_.world->size() == 1 && !curriculum_ && pinned_terms_,
           "--cuda-graph: unsupported configuration reached the trainer");
  const bool dynamic_scale = scaler_ && scaler_->dynamic();
  // A dynamic fp16 loss scale enters the loss gradient from the step block
  // (every graph-mode step, eager warm-up included; an evaluation computes no
  // gradient, so it is unaffected).
  if (dynamic_scale) model_->set_dloss_scale(step_scalars().view(AdamWSlot::LossScale, {1}));
  const int64_t ga = cfg_.batch.grad_accum_steps, B = cfg_.batch.micro_batch_size, T = cfg_.model.seq_length;
  runner_ = make_graph_step({.dev = dev_,
                             .micro_batch = B,
                             .seq_length = T,
                             .micro_batches = ga,
                             .warmup = cfg_.cuda_graph_warmup,
                             .dynamic_scale = dynamic_scale,
                             .body = std::move(body),
                             .host_feed = [this](int m) { return host_train_batch(m); },
                             .abandon =
                                 [this] {
                                   model_->abandon_pass();
                                   opt_->abandon_step();
                                 }});
  DS_LOG("cuda graph: {} eager warm-up steps, then the step up to its host read, AdamW update included, is "
         "captured and replayed ({} micro-batches of {} x {} tokens, their dropout keys and the step scalars from "
         "fixed pinned buffers)",
         cfg_.cuda_graph_warmup, ga, B, T);
}

void Trainer::setup_device_and_precision() {
  const Precision prec = cfg_.precision.precision;
  peak_tflops_ = cfg_.log.cpu_peak_tflops;
  if (cfg_.device == DeviceType::CUDA) {
    DeviceRuntime& rt = device_runtime(DeviceType::CUDA);
    DS_USER_CHECK(rt.available(), "--device cuda: {}", rt.unavailable_reason());
    const int local = local_rank_;
    DS_USER_CHECK(local < rt.device_count(),
                  "--device cuda: LOCAL_RANK {} but only {} CUDA device(s) are visible (CUDA_VISIBLE_DEVICES)", local,
                  rt.device_count());
    rt.init_device(local);
    rt.set_attention_backend(cfg_.attention_backend);
    dev_ = Device::cuda(local);
    // MFU against the tensor-core peak applies to bf16/fp16 only.
    if (prec != Precision::FP32) peak_tflops_ = rt.peak_bf16_tflops();
    DS_LOG("device: {} (cuda:{}), attention {}, peak {:.0f} TFLOP/s (bf16 dense; DS_PEAK_BF16_TFLOPS overrides)",
           rt.device_name(), local, attention_backend_name(cfg_.attention_backend), rt.peak_bf16_tflops());
  } else {
    dev_ = Device::cpu();
    const char* bf16_matmuls = ops::cpu_lowp_description();  // also checks DS_CPU_BF16_GEMM
    if (prec == Precision::BF16)
      DS_LOG("{}; the other ops read bf16 tensors, compute in f32 and round what they write", bf16_matmuls);
    else if (prec != Precision::FP32)
      DS_LOG("{} on cpu: every op reads {} tensors, computes in f32 and rounds what it writes, as the GPU "
             "kernels do (slower than fp32 on cpu; for checking numerics)",
             precision_name(prec), precision_name(prec));
  }
  if (prec == Precision::FP16) {
    const PrecisionConfig& pc = cfg_.precision;
    LossScalerConfig lc;
    lc.dynamic = pc.loss_scale <= 0;
    lc.initial_scale = lc.dynamic ? std::ldexp(1.0, pc.initial_scale_power) : pc.loss_scale;
    lc.window = pc.loss_scale_window;
    lc.hysteresis = pc.hysteresis;
    lc.min_scale = pc.min_loss_scale;
    lc.consecutive_hysteresis = pc.consecutive_hysteresis;
    scaler_ = std::make_unique<LossScaler>(lc);
    state_.loss_scale = scaler_->scale();
    state_.hysteresis_left = scaler_->hysteresis_left();
  }
}

bool Trainer::skip_for_overflow(bool overflow) {
  if (!scaler_) return false;
  const double before = scaler_->scale();
  const ScaleEvent e = scaler_->update(overflow);
  state_.loss_scale = scaler_->scale();
  state_.good_steps = scaler_->good_steps();
  state_.hysteresis_left = scaler_->hysteresis_left();
  if (overflow) {
    state_.skipped_steps += 1;
    DS_LOG("iteration {}: gradient overflow at loss scale {}, step skipped; loss scale now {}{}",
           state_.iteration + 1, before, scaler_->scale(),
           e == ScaleEvent::HysteresisSpent ? " (hysteresis " + std::to_string(scaler_->hysteresis_left()) + " left)"
                                            : std::string());
  } else if (e == ScaleEvent::Raised) {
    DS_LOG("iteration {}: {} steps without overflow, loss scale raised to {}", state_.iteration + 1,
           cfg_.precision.loss_scale_window, scaler_->scale());
  }
  return overflow;
}

void Trainer::log_model_state() {
  // What the allocator counted for the persistent buffers (lib/core/mem_tag.h),
  // on the training device: with offload the Adam state is host memory.
  // Less what was live before this trainer built its model (dschat ppo holds
  // four models in one process).
  ModelStateBytes b;
  b.params = live_tagged_bytes(MemTag::Params, dev_.type) - tagged_before_.params;
  b.grads = live_tagged_bytes(MemTag::Grads, dev_.type) - tagged_before_.grads;
  b.optimizer = live_tagged_bytes(MemTag::Optimizer, dev_.type) - tagged_before_.optimizer;
  DS_LOG("model state: {} bytes per rank (ZeRO stage {}, {} data-parallel ranks{}; params {} + grads {} ({}) + Adam "
         "m, v {})",
         b.total(), cfg_.zero.stage, sdp_,
         opt_->grouped()
             ? fmt::format(", the dense weights' state partitioned over the {} data-parallel ranks, the experts' "
                           "over the {} expert-data-parallel ranks", sdp_, zero_ranks_)
         : shard_.ep > 1 && cfg_.zero.stage >= 1
             ? fmt::format(", partitioned over the {} expert-data-parallel ranks", zero_ranks_)
             : std::string(),
         b.params, b.grads, dtype_name(cfg_.precision.grad_accum), b.optimizer);
  if (pipe_) {
    // Transient, allocated by the executor as the schedule runs: the count
    // follows the same p2p plan (lib/train/memory_estimate.h).
    const int n = pipeline_message_buffers(shard_.pp, shard_.pp_rank, static_cast<int>(cfg_.batch.grad_accum_steps),
                                           shard_.vp, cfg_.zero.overlap_comm, cfg_.parallel.zbh1_pipeline,
                                           cfg_.parallel.zbh1_exact_semantics);
    const int64_t each = cfg_.batch.micro_batch_size * model_->local_seq(cfg_.model.seq_length / comms_.grid.sp) *
                         model_->dims().C * static_cast<int64_t>(dtype_size(model_->compute_dtype()));
    DS_LOG("pipeline messages: up to {} buffers of {} bytes live on this stage ({} bytes, transient, not in the model "
           "state above: received activations and gradients, input gradients waiting to be sent{})",
           n, each, n * each,
           cfg_.zero.overlap_comm ? "; gradients on the second communicator, receives posted a compute early "
                                    "(overlap_comm)"
                                  : "");
    if (const int waiting = max_pending_weight_grads(pipe_->kind(), shard_.pp, shard_.pp_rank,
                                                     static_cast<int>(cfg_.batch.grad_accum_steps));
        waiting > 0) {
      const int64_t set = model_->deferred_weight_grad_bytes(
          cfg_.batch.micro_batch_size, cfg_.model.seq_length / comms_.grid.sp);
      DS_LOG("ZB-H1 weight passes: up to {} micro-batches wait on this stage, {} bytes each ({} bytes, transient: "
             "copies of the linear layers' inputs and output gradients)", waiting, set, waiting * set);
    }
  }
  if (cfg_.zero.offload_optimizer == OffloadDevice::CPU)
    DS_LOG("host memory (offload_optimizer): {} bytes per rank: Adam m, v {} + fp32 master copy and two gradient "
           "buckets {} ({}, allocated at the first step)",
           live_tagged_bytes(MemTag::Optimizer, DeviceType::CPU) + opt_->offload_host_bytes(),
           live_tagged_bytes(MemTag::Optimizer, DeviceType::CPU), opt_->offload_host_bytes(),
           cfg_.zero.offload_pin_memory ? "pinned" : "pageable");
  for (const ZeroOptimizer::StatePart& part : opt_->state_parts()) {
    const NvmeStateTier* t = part.tier;
    if (!t) continue;
    DS_LOG("offload_optimizer.device = nvme: the optimizer state{}{}{} ({} states x {} elements, {} bytes) lives in a "
           "swap file under {} (unlinked: removed however the run ends); the step updates {} sub-groups of {} "
           "elements; host buffers {} bytes ({} set{} of sub-group buffers; reads {}, writes {})",
           part.group.empty() ? "" : " of the " + part.group + " group",
           opt_->tier_state_offset() ? ", the parameter shard (offload_param nvme; ZeRO-3 gathers read their "
                                       "pieces from it)" : "",
           opt_->grads_in_tier() ? " and the f32 gradient shard (each unit's reduced piece written there, added "
                                   "to over the micro-batches)" : "",
           t->n_states(), t->numel(), t->file_bytes(), cfg_.zero.nvme.nvme_path, t->n_sub_groups(), t->sub_group(),
           t->host_bytes(), t->buffer_sets(), t->buffer_sets() == 1 ? "" : "s",
           t->pipelined_read() ? "ahead of the update" : "in turn",
           t->pipelined_write() ? "behind the update" : "in turn");
    if (dev_.is_cuda())
      DS_LOG("offload_optimizer.device = nvme on a GPU: the optimizer runs on the host; each sub-group's gradients "
             "and fp32 master (which stays on the GPU) go through two {} host buffer pairs, {} bytes, the next "
             "sub-group's copies overlapping the update", cfg_.zero.offload_pin_memory ? "pinned" : "pageable",
             opt_->offload_host_bytes() - t->host_bytes());
    if ((cfg_.zero.nvme.pipeline_read || cfg_.zero.nvme.pipeline_write) && t->buffer_sets() < 2 &&
        t->n_sub_groups() > 1)
      DS_WARN("offload_optimizer.pipeline_read/pipeline_write need two sets of sub-group buffers: buffer_count {} "
              "holds {} for {} optimizer states; the sub-groups are read and written in turn (raise buffer_count to "
              "{})",
              cfg_.zero.nvme.buffer_count, cfg_.zero.nvme.buffer_count, t->n_states(), 2 * t->n_states());
  }
  if (cfg_.zero.stage == 3) {
    const Zero3Plan& p = store_->plan();
    int n_persistent = 0;
    for (bool x : p.persistent) n_persistent += x ? 1 : 0;
    DS_LOG("ZeRO-3: {} parameter units, {} persistent ({} elements); prefetch depth {}; peak live gathered "
           "parameters {} elements ({} bytes, transient, not in the model state above)",
           p.persistent.size(), n_persistent, store_->persistent_elems(), p.prefetch_depth, p.peak_live,
           4 * p.peak_live);
  }
}

// Gradient-norm ranges of this rank's layout: split weights on every tp rank,
// replicated ones (and replicated kv parts) on the first tp rank holding them;
// a tied wte on the last pipeline stage is the first stage's copy and is not
// counted again.
std::vector<Range> Trainer::norm_counted_ranges(const ModelLayout& local) const {
  std::vector<Range> skip = duplicate_ranges(local);
  const ParamSpec* wte = local.try_find("embed.wte");
  if (wte && !local.first_stage()) skip.push_back({wte->offset, wte->offset + wte->numel});
  std::sort(skip.begin(), skip.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> counted;
  int64_t at = 0;
  for (const Range& r : skip) {
    if (r.begin > at) counted.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < local.total) counted.push_back({at, local.total});
  return counted;
}

CheckpointData Trainer::checkpoint_data(int shard_index, int shards) {
  CheckpointData d = rank_checkpoint(rank_model(), Tensor(), opt_->optimizer(), opt_->optimizer_range(),
                                     shard_index, shards);
  // offload_optimizer nvme: the state is saved and loaded through the tier
  // (state 0 is the parameter shard with offload_param nvme).
  const int off = opt_->tier_state_offset();
  auto tier_io = [off](NvmeStateTier* t, CheckpointData::TierRead& read, CheckpointData::TierWrite& write) {
    if (!t) return;
    read = [t, off](size_t i, int64_t lo, int64_t hi, float* out) { t->read(static_cast<int>(i) + off, lo, hi, out); };
    write = [t, off](size_t i, int64_t lo, int64_t hi, const float* in) {
      t->write(static_cast<int>(i) + off, lo, hi, in);
    };
  };
  if (!opt_->grouped()) {
    tier_io(opt_->state_parts()[0].tier, d.tier_read, d.tier_write);
    return d;
  }
  d.opt_state.clear();
  for (const ZeroOptimizer::StatePart& p : opt_->state_parts()) {
    CheckpointData::StatePart part{.group = p.group, .ep_shared = p.ep_shared, .pieces = p.pieces,
                                   .states = checkpoint_states(*p.opt), .tier_read = {}, .tier_write = {}};
    tier_io(p.tier, part.tier_read, part.tier_write);
    d.opt_parts.push_back(std::move(part));
  }
  return d;
}

RankModel Trainer::rank_model() {
  return RankModel{.config = &cfg_.model, .model = model_.get(), .comms = &comms_, .shard = shard_,
                   .dp_rank = sdp_rank_, .full = &full_layout_};
}


// --reset-iteration (Megatron-DeepSpeed's load_checkpoint): the loaded run's
// iteration and sample counts are not restored; everything else is.
void Trainer::reset_iteration_after_load() {
  if (!cfg_.ckpt.reset_iteration || state_.iteration == 0) return;
  DS_LOG("--reset-iteration: loaded at iteration {} ({} samples consumed); training starts at iteration 0 from the "
         "start of the data, with the loaded weights, optimizer state, learning-rate schedule and loss scale",
         state_.iteration, state_.consumed_samples);
  state_.iteration = 0;
  state_.consumed_samples = 0;
  state_.consumed_tokens = 0;
}

namespace {

// zero_optimization.load_from_fp32_weights false: DeepSpeed's ZeRO 1/2
// optimizer, and its bf16 optimizer at stage 0, restore the f32 master weights
// from the model's 16-bit weights when a checkpoint loads with its optimizer
// state: the saved values rounded to the compute dtype. Its other optimizers
// (fp32, fp16 at stage 0, stage 3) never read the key.
bool masters_from_16bit(const TrainConfig& cfg) {
  const Precision p = cfg.precision.precision;
  const int stage = cfg.zero.stage;
  return !cfg.zero.load_from_fp32_weights && p != Precision::FP32 &&
         (stage == 1 || stage == 2 || (stage == 0 && p == Precision::BF16));
}

void round_to_16bit(float* x, int64_t n, Precision p) {
  if (p == Precision::BF16)
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
  else
    for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

}  // namespace

void Trainer::load_or_init() {
  if (!cfg_.ckpt.load_dir.empty()) {
    // Each rank reads only the weights its store keeps (its tp slices and
    // stage; with ZeRO-3 its partition), never the whole model.
    CheckpointData d = checkpoint_data(zero_rank_, zero_ranks_);
    d.weights_only = cfg_.ckpt.finetune || cfg_.ckpt.no_load_optim;
    const bool from_16bit = masters_from_16bit(cfg_) && !d.weights_only;
    d.receive_params = [&](const CheckpointData::ParamsReader& read) {
      if (!from_16bit) return model_->store().init_params(model_->layout().total, read);
      model_->store().init_params(model_->layout().total, [&](int64_t begin, int64_t end, float* out) {
        read(begin, end, out);
        round_to_16bit(out, end - begin, cfg_.precision.precision);
      });
    };
    if (!cfg_.zero.load_from_fp32_weights)
      DS_LOG("zero_optimization.load_from_fp32_weights false: {}", from_16bit
             ? "the f32 master weights start from the checkpoint's 16-bit weights (its f32 values rounded)"
             : "no effect here (DeepSpeed reads it only for a full load at ZeRO stage 1/2 in fp16 or bf16, or at "
               "stage 0 in bf16)");
    if (load_checkpoint(cfg_.ckpt.load_dir, state_, d)) {
      model_->store().params_updated();
      if (d.weights_only) {
        start_after_weights_only_load();
        return reset_iteration_after_load();
      }
      if (scaler_) scaler_->restore(state_.loss_scale, state_.good_steps, static_cast<int>(state_.hysteresis_left));
      opt_->set_step_count(d.opt_step);
      opt_->optimizer().load_scalars(d.opt_scalars);
      fill_legacy_lr_clock(cfg_, state_);
      const std::string lr_note = reconcile_lr_schedule(cfg_, state_);
      if (!lr_note.empty()) DS_LOG("{}", lr_note);
      DS_LOG("loaded checkpoint from {} at iteration {}", cfg_.ckpt.load_dir, state_.iteration);
      return reset_iteration_after_load();
    }
    DS_WARN("--load {}: no checkpoint found ('latest' missing); starting from {}", cfg_.ckpt.load_dir,
            cfg_.ckpt.init_from.empty() ? std::string("scratch") : "the --init-from weights of " + cfg_.ckpt.init_from);
  }
  if (!cfg_.ckpt.init_from.empty()) {
    // Each rank reads the HF tensors that hold some of what its store keeps,
    // one at a time, never the whole model.
    const HfShardReader reader(cfg_.model, full_layout_, cfg_.ckpt.init_from, cfg_.ckpt.init_from_vocab,
                               [&](const ModelLayout& l, int64_t begin, int64_t end, float* out) {
                                 init_params(cfg_.model, l, cfg_.seed, cfg_.model.init_method_std, out, begin, end);
                               });
    if (reader.fresh_head())
      DS_LOG("{} has no v_head.weight: the value head starts as nn.Linear's default, U(-1/sqrt({}), 1/sqrt({}))",
             cfg_.ckpt.init_from, cfg_.model.hidden_size, cfg_.model.hidden_size);
    const ModelLayout& local = model_->layout();
    model_->store().init_params(local.total, [&](int64_t begin, int64_t end, float* out) {
      reader.read(local, begin, end, out);
    });
    model_->store().params_updated();
    DS_LOG("initialised weights from {}", cfg_.ckpt.init_from);
    return;
  }
  model_->init_weights(cfg_.seed, cfg_.model.init_method_std);
}

// --finetune / --no-load-optim (Megatron's load_checkpoint): the weights are
// loaded; the optimizer starts fresh, and so do the learning-rate schedule and
// the loss scale (Megatron keeps both with the optimizer). --finetune also
// starts the iteration and the data position over.
void Trainer::start_after_weights_only_load() {
  const TrainState saved = state_;
  state_ = TrainState{};
  if (cfg_.ckpt.finetune) {
    DS_LOG("--finetune: loaded the weights from {} (saved at iteration {}); the iteration, data position, optimizer "
           "state, learning-rate schedule and loss scale start fresh",
           cfg_.ckpt.load_dir, saved.iteration);
    return;
  }
  state_.iteration = saved.iteration;
  state_.consumed_samples = saved.consumed_samples;
  state_.consumed_tokens = saved.consumed_tokens;
  state_.skipped_steps = saved.skipped_steps;
  DS_LOG("--no-load-optim: loaded the weights from {} at iteration {}; the optimizer state, learning-rate schedule "
         "and loss scale start fresh",
         cfg_.ckpt.load_dir, state_.iteration);
}

// The global batch and micro-batches of the step that begins now: the
// configured ones, or on Megatron's batch-size ramp-up those of the consumed
// samples (lib/config/batch_rampup.h).
void Trainer::set_step_batch() {
  step_batch_ = cfg_.lengths.rampup.batch_at(state_.consumed_samples, cfg_.batch.train_batch_size);
  step_ga_ = micro_batches_at(state_.consumed_samples);
}

int64_t Trainer::micro_batches_at(int64_t consumed) const {
  const BatchConfig& b = cfg_.batch;
  return cfg_.lengths.rampup.batch_at(consumed, b.train_batch_size) / (b.micro_batch_size * dp_);
}

double Trainer::phase_ms() {
  if (!cfg_.log.wall_clock_breakdown) return 0;
  device_runtime(dev_).synchronize();  // the phase's kernels have finished
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - phase_start_).count();
  phase_start_ = now;
  return ms;
}

// The step's tokens as Megatron-DeepSpeed counts them: its rows (the samples,
// or seqlen_reshape's rows: data_efficiency_curriculum_learning_numel) times
// actual_seqlen.
int64_t Trainer::step_tokens() const {
  return step_batch_ / cfg_.batch.micro_batch_size * step_rows_ * actual_seqlen();
}

// Megatron-DeepSpeed's train(): (T (L - n) + R n) // L while R < T.
int64_t Trainer::actual_seqlen() const {
  const int64_t n = static_cast<int64_t>(cfg_.random_ltd.layer_ids.size()), L = cfg_.model.num_layers;
  if (!cfg_.random_ltd.active() || ltd_reserved_ >= seqlen_) return seqlen_;
  return (seqlen_ * (L - n) + ltd_reserved_ * n) / L;
}

int64_t Trainer::next_seqlen() {
  // Megatron-DeepSpeed asks the scheduler for global step iteration + 1.
  if (curriculum_) return curriculum_->update(state_.iteration + 1);
  if (!cfg_.data_sampling.active()) return cfg_.model.seq_length;
  // The data-sampling curriculum's seqlen_truncate: the length of the global
  // batch the step's micro-batches were drawn from (Megatron-DeepSpeed
  // truncates each micro-batch; dstrain's step trains one length, so the
  // micro-batches of a step must agree, which they do unless a cluster is
  // smaller than its share of a global batch).
  const int64_t L = data_->curriculum_seqlen(state_.consumed_samples, 0, dp_);
  for (int m = 1; m < step_ga_; ++m) {
    const int64_t Lm = data_->curriculum_seqlen(state_.consumed_samples, m, dp_);
    DS_USER_CHECK(Lm == L, "data-sampling curriculum: iteration {} mixes sequence lengths {} and {} (its "
                  "micro-batches come from two global batches of the sampler, as a cluster is smaller than its "
                  "share of a batch); dstrain trains one length per step", state_.iteration + 1, L, Lm);
  }
  return L > 0 ? L : cfg_.model.seq_length;
}

// The step's update, two ways with the same bits (docs/distributed.md, "host
// synchronisations per step"; docs/cuda.md, "CUDA graphs"):
// - device_update_ (one process, the optimizer on the device): the host
//   writes the update's step scalars (the schedule's learning rate and weight
//   decay, the bias corrections of Adam's next step) into the step block
//   before the step; after end_step_stats, step_gate decides on the device
//   from the statistics (clip coefficient, skip on NaN/Inf or fp16 overflow)
//   and AdamW reads the block, doing nothing on a skipped step. The read
//   comes last and tells the host what the device did; only then does Adam's
//   step count (and the schedule) advance. With --cuda-graph this whole step
//   is the captured region.
// - otherwise (several processes, or the optimizer offloaded to the host):
//   the host reads first, applies gate_step to the same statistics and runs
//   the update with those values, or skips it (no collective of a skipped
//   update runs on any rank).
float Trainer::train_step() {
  const auto& b = cfg_.batch;
  set_step_batch();
  // DeepSpeed's compression scheduler counts the steps applied in this run
  // (not saved in checkpoints) and turns a technique on once that count
  // reaches its schedule_offset.
  if (cfg_.compression.act_quant) model_->set_activation_quantization_active(applied_steps_ >= cfg_.compression.act_offset);
  // DeepSpeed's engine checks at its step 0 too: with offset 0 the weights
  // are quantized before the first forward of a run that starts at iteration 0.
  if (wq_ && cfg_.compression.wq_offset == 0 && state_.iteration == 0 && wq_->qsteps() == 0)
    wq_->quantize(model_->compute_params());
  phase_ms();
  seqlen_ = next_seqlen();  // every sample keeps its first seqlen_ positions
  // seqlen_reshape re-cuts each micro-batch's samples into rows of seqlen_.
  step_rows_ = cfg_.data_sampling.reshapes()
                   ? seqlen_reshape_rows(b.micro_batch_size, cfg_.model.seq_length, seqlen_)
                   : b.micro_batch_size;
  if (cfg_.random_ltd.active()) {  // the engine's global_steps: every step before this one, skipped ones too
    ltd_reserved_ = random_ltd_reserved(cfg_.random_ltd.schedule, state_.iteration);
    model_->set_random_ltd_reserved(ltd_reserved_);
  }
  // fp16: the loss (hence every gradient) is multiplied by the loss scale.
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  // All-reduced gradients are the mean over the data-parallel ranks (each
  // rank's share divided by dp); gradients that stay local (the 1-bit
  // family's compressed phase) are the rank's own mean, as DeepSpeed's
  // engine leaves them when it skips the all-reduce.
  const int64_t grad_ranks = opt_->gradients_stay_local() ? 1 : dp_;
  StepPlan plan{
      .loss_weight =
          static_cast<float>(scale / static_cast<double>(b.micro_batch_size * seqlen_ * step_ga_ * grad_ranks)),
      // Dropout masks are keyed by (seed, iteration) and each micro-batch's
      // global first sample, identical in every layout (docs/dropout.md).
      .key = {.train = true, .seed = cfg_.seed, .iteration = state_.iteration, .first_sample = 0, .step = {}},
      .hyper = step_hyper(),
      .loss_scale = scale,
      .scale_in_block = false,
      .micro_batches = static_cast<int>(step_ga_),
      .phases = cfg_.log.wall_clock_breakdown};
  const StepHyper& h = plan.hyper;
  if (device_update_) stage_update_terms(h);
  // The losses, the norm and the overflow flag stay on the device until one
  // read (read_step_block).
  runner_->run(plan);
  if (!runner_->body_marks_phases()) step_times_.forward_backward += phase_ms();
  const StepRead r = read_step_block();
  // The host's gate on what it read: the device applied the same function to
  // the same values (device_update_), the update below uses it otherwise.
  // A rank that keeps its gradients local clips by its own norm; the world's
  // sum is NaN/Inf when any rank's is, so every rank still skips together.
  const float sumsq = own_sumsq_ >= 0 && std::isfinite(r.sumsq) ? own_sumsq_ : r.sumsq;
  const StepGate gate = gate_step(sumsq, r.overflow, r.loss, scale, cfg_.optim.grad_clip, skip_rule());
  step_times_.grads_reduce += phase_ms();
  step_times_.steps += 1;
  const float loss = r.loss;
  last_moe_loss_ = r.moe_loss;
  last_kd_loss_ = r.kd_loss;
  // The schedule counts applied steps only (DeepSpeed and Megatron do not
  // advance the learning rate on a skipped step).
  const int64_t tokens_before = state_.consumed_tokens;
  const bool overflow = skip_for_overflow(r.overflow != 0.f);  // fp16: the loss scaler's rule
  const bool nonfinite = note_nan_iteration(loss, gate.norm);
  const bool skip = overflow || nonfinite;
  DS_CHECK(skip == gate.skip, "step gate: the trainer's rule skips ({}) where gate_step does not ({})", skip,
           gate.skip);
  if (device_update_)
    DS_CHECK(r.skipped == skip && std::memcmp(&r.grad_scale, &gate.grad_scale, sizeof(float)) == 0,
             "step gate: the device decided skip {} with grad scale {}, the host skip {} with grad scale {} on the "
             "same statistics",
             r.skipped, r.grad_scale, skip, gate.grad_scale);
  if (skip) {
    if (!overflow) state_.skipped_steps += 1;  // no update: the schedule does not advance either
    state_.iteration += 1;
    state_.consumed_samples += step_batch_;
    state_.consumed_tokens += step_tokens();
    last_grad_norm_ = NAN;
    return loss;
  }
  if (device_update_) {
    opt_->count_step();  // the device applied it (the read said so)
  } else {
    opt_->step(h, gate.grad_scale);
    step_times_.optimizer += phase_ms();
  }
  advance_lr_clock(cfg_.optim, state_.lr_clock, step_batch_, tokens_before);
  // MoQ: the fp16 weights the next forward reads, quantized once the steps
  // applied before this one reach the offset (DeepSpeed's _take_model_step).
  if (wq_ && applied_steps_ >= cfg_.compression.wq_offset) wq_->quantize(model_->compute_params());
  applied_steps_ += 1;
  state_.iteration += 1;
  state_.consumed_samples += step_batch_;
  state_.consumed_tokens += step_tokens();
  last_grad_norm_ = gate.norm;
  last_lr_ = h.lr;
  return loss;
}

// The step's work up to its read, whichever runner runs it and whatever
// feeds it (step_runner.h).
void Trainer::step_body(const StepPlan& p, const MicroBatchFeed& feed) {
  if (device_update_) copy_update_terms();
  opt_->zero_grads();
  begin_step_stats();
  passes_->train(feed, p.micro_batches, p.loss_weight, p.key);  // the losses went to the step's statistics
  tied_embedding_all_reduce();
  if (p.phases) step_times_.forward_backward += phase_ms();
  end_step_stats();
  if (device_update_) {
    if (p.phases) step_times_.grads_reduce += phase_ms();
    update_on_device(p.hyper, p.loss_scale, p.scale_in_block);
    if (p.phases) step_times_.optimizer += phase_ms();
  }
}

MicroBatch Trainer::host_train_batch(int m) {
  heartbeat_.beat_if_started();
  const int64_t L = curriculum_ || cfg_.data_sampling.active() ? seqlen_ : 0;  // 0: the whole sample
  return local_batch(data_->train_batch(state_.consumed_samples, m, dp_rank_, dp_, L));
}

// One step with the timeline on; logs its host synchronisations (GPU: device
// and stream synchronisations, blocking copies and communication polls; CPU:
// blocking collectives and waits for a communication thread) and writes the
// timeline as a Chrome trace.
float Trainer::profiled_step() {
  timeline_.clear();
  timeline_.enable(true);
  const int64_t syncs = host_sync_count();
  const int64_t replays = runner_->graph_counters().replays;
  const double t0 = timeline_.now_us();
  float loss = train_step();
  const double t1 = timeline_.now_us();
  const int64_t n = host_sync_count() - syncs;
  profiled_syncs_ = n;
  timeline_.add({"step", "compute", 2, t0, t0, t1});
  timeline_.enable(false);
  const std::string path = fmt::format("{}/timeline_rank{}.json", cfg_.log.profile_dir, comms_.grid.rank);
  timeline_.write_chrome_trace(path, comms_.grid.rank);
  int n_comm = 0, n_a2a = 0;
  double a2a_us = 0;
  for (const Timeline::Event& e : timeline_.events()) {
    if (e.name.starts_with("expert all_to_all")) {
      n_a2a += 1;
      a2a_us += e.end_us - e.begin_us;
    } else {
      n_comm += e.cat == "comm" ? 1 : 0;
    }
  }
  if (n_a2a > 0)
    DS_LOG("profile: iteration {}: {} expert all-to-alls took {:.1f} ms of the step's {:.1f} ms ({:.1f}%)",
           state_.iteration, n_a2a, a2a_us / 1e3, (t1 - t0) / 1e3, 100.0 * a2a_us / (t1 - t0));
  DS_LOG("profile: iteration {}: {} host synchronisations in the step{} ({}), {} overlapped gradient collectives "
         "(overlap_comm {}); timeline in {}", state_.iteration, n, runner_->graph_counters().replays > replays ? " (a CUDA graph replay)" : "",
         dev_.is_cuda() ? "device/stream synchronisations, blocking copies and communication polls"
                        : "blocking collectives and waits for a communication thread",
         n_comm, cfg_.zero.overlap_comm ? "on" : "off", path);
  return loss;
}

bool Trainer::note_nan_iteration(float loss, double grad_norm) {
  // With fp16 a non-finite gradient norm is an overflow (the scaler skips the
  // step and lowers the scale); a non-finite loss is divergence in any dtype.
  const bool nonfinite = !std::isfinite(loss) || (!scaler_ && !std::isfinite(grad_norm));
  if (!nonfinite) {
    nan_streak_ = 0;
    return false;
  }
  nan_iters_ += 1;
  nan_streak_ += 1;
  DS_WARN("iteration {}: {} is not finite (loss {}, grad norm {}); no update applied ({} in a row, limit {})",
          state_.iteration + 1, std::isfinite(loss) ? "the gradient norm" : "the loss", loss, grad_norm, nan_streak_,
          cfg_.max_nan_iterations);
  if (nan_streak_ >= cfg_.max_nan_iterations)
    throw UserError(fmt::format(
        "training diverged: the loss or gradient norm was NaN/Inf in {} iterations in a row (iterations {}-{}); "
        "their updates were not applied and no checkpoint holds them. Lower --lr, check the data, or resume from the "
        "last "
        "checkpoint (--max-nan-iterations sets the limit)",
        nan_streak_, state_.iteration + 2 - nan_streak_, state_.iteration + 1));
  return true;
}

bool Trainer::state_nonfinite(const std::vector<Tensor>& params) {
  Tensor flag = Tensor::zeros({1}, DType::F32, dev_);
  Tensor host_flag;  // for optimizer state in host memory (offload_optimizer on a GPU run)
  std::vector<Tensor> checked = opt_->optimizer_states();  // every named optimizer state
  checked.insert(checked.begin(), params.begin(), params.end());
  for (const Tensor& t : checked) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.device() == dev_) {
      ops::nonfinite_check({.flag = flag, .x = t}, Stream{});
      continue;
    }
    if (!host_flag.defined()) host_flag = Tensor::zeros({1}, DType::F32, t.device());
    ops::nonfinite_check({.flag = host_flag, .x = t}, Stream{});
  }
  if (opt_->offloaded_state_nonfinite()) {  // the NVMe tier's state, read through a sub-group at a time
    if (!host_flag.defined()) host_flag = Tensor::zeros({1}, DType::F32);
    host_flag.data<float>()[0] += 1.f;
  }
  if (host_flag.defined()) ops::add({.out = flag, .a = flag, .b = host_flag.to(dev_)}, Stream{});
  if (comms_.world->size() > 1) comms_.world->all_reduce(flag);
  const bool nonfinite = flag.to(Device::cpu()).data<float>()[0] != 0.f;
  comms_.world->raise_if_failed();  // NCCL: never decide on a value an aborted op left
  return nonfinite;
}

bool Trainer::out_of_time() {
  if (cfg_.exit_duration_in_mins <= 0) return false;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60.0;
  double done = minutes > cfg_.exit_duration_in_mins ? 1.0 : 0.0;
  // Every rank must take the same decision (Megatron all-reduces it too).
  if (comms_.world->size() > 1) done = comms_.world->all_reduce_scalar(done, dev_, ReduceOp::Max);
  return done > 0;
}

double Trainer::evaluate() {
  if (!data_->has_valid() || cfg_.log.eval_iters <= 0) return NAN;
  runner_->release("evaluation", state_.iteration);
  double sum = 0;
  int64_t n = 0;
  const int64_t ga = micro_batches_at(state_.consumed_samples);  // Megatron: the current count
  for (int64_t it = 0; it < cfg_.log.eval_iters; ++it) {
    // pipeline: forwards through the stages; the loss sum is on the last stage
    sum += passes_->forward_only(
        [&](int micro) {
          heartbeat_.beat_if_started();
          return data_->to_device(
              local_batch(data_->valid_batch((it * ga + micro) * cfg_.batch.micro_batch_size * dp_, dp_rank_, dp_)));
        },
        static_cast<int>(ga));
    n += ga;
  }
  return from_last_stage(dp_mean(sum / static_cast<double>(n)));
}

double Trainer::forward_loss(const MicroBatch& host) {
  runner_->release("evaluation", state_.iteration);
  heartbeat_.beat_if_started();
  return from_last_stage(passes_->forward_only([&](int) { return data_->to_device(local_batch(host)); }, 1));
}

double Trainer::from_last_stage(double v) {
  if (shard_.pp == 1) return v;
  return comms_.pp->broadcast_scalar(v, dev_, shard_.pp - 1);
}

void Trainer::tied_embedding_all_reduce() {
  if (comms_.embedding->size() == 1 || model_->dims().untied) return;
  const ParamSpec& p = model_->layout().find("embed.wte");  // unit 0 starts at offset 0 on both stages
  Tensor g = store_ ? store_->deferred_grads(0) : model_->grads();
  comms_.embedding->all_reduce(g.view(p.offset, {p.numel}));
  if (store_) store_->flush_deferred();
}

// Every rank of the sequence-data-parallel group holds the mean over the
// same number of tokens (B x T/SP), so their mean is the global one.
double Trainer::dp_mean(double local) {
  if (sdp_ == 1) return local;
  if (dev_.is_cuda()) {
    // all_reduce_scalar's f32 all-reduce with one host synchronisation
    // instead of two: the value goes up through pinned staging (no wait),
    // the all-reduce is stream-ordered (bounded by the NCCL watchdog; polled
    // with DS_NCCL_BLOCKING_WAIT=1), and the read of the sum is the wait.
    const float v = static_cast<float>(local);
    Tensor t = Tensor::empty({1}, DType::F32, dev_);
    device_runtime(dev_).upload_async(t.raw(), &v, sizeof v);
    comms_.sdp->all_reduce(t);
    const double sum = static_cast<double>(t.to(Device::cpu()).data<float>()[0]);
    comms_.sdp->raise_if_failed();
    return sum / sdp_;
  }
  return comms_.sdp->all_reduce_scalar(local, dev_) / sdp_;
}

MicroBatch Trainer::local_batch(MicroBatch mb) const {
  const int sp = comms_.grid.sp;
  if (sp == 1) return mb;
  mb.tokens = sequence_shard(mb.tokens, sp, comms_.grid.sp_rank);
  mb.targets = sequence_shard(mb.targets, sp, comms_.grid.sp_rank);
  return mb;
}

void Trainer::save() {
  if (cfg_.ckpt.save_dir.empty()) return;
  const Heartbeat::Paused paused(heartbeat_);  // ranks wait for the writers
  runner_->release("checkpoint save", state_.iteration);
  if (cfg_.optim.scheduler == LrScheduler::Megatron) state_.lr_schedule = lr_schedule_values(cfg_.optim);
  // Stage 0 keeps identical optimizer state on every rank: rank 0 writes one shard.
  const bool sharded = cfg_.zero.stage >= 1;
  // Collective: a checkpoint (and `latest`) never points at non-finite
  // weights (each rank checks the f32 weights it updates).
  if (state_nonfinite(opt_->master_ranges()))
    throw UserError(fmt::format("iteration {}: the weights or optimizer moments hold NaN/Inf; refusing to write a "
                                "checkpoint to {} (the last one written stays 'latest')",
                                state_.iteration, cfg_.ckpt.save_dir));
  CheckpointData d = checkpoint_data(sharded ? zero_rank_ : 0, sharded ? zero_ranks_ : 1);
  d.tokenizer = &tokenizer_copy_;
  // model.safetensors is written one weight at a time as it is gathered to
  // rank 0 (FullTensorStream): rank 0 inside its write_checkpoint_files, the
  // others right after theirs, in the same order.
  FullTensorStream stream(rank_model());
  if (comms_.grid.rank == 0) d.stream_params = [&](const std::string& name) { return stream.next(name); };
  // What killed saves left is removed before any rank writes (a pid names a process on rank 0's host only).
  if (comms_.grid.rank == 0) remove_stale_temporaries(cfg_.ckpt.save_dir);
  comms_.world->barrier();
  // Expert parallelism (stage 0): each rank of the first expert-parallel
  // group writes its experts' state.
  const bool writes = sharded || sdp_rank_ == 0 || (shard_.ep > 1 && comms_.grid.edp_rank == 0);
  if (writes) write_checkpoint_files(cfg_.ckpt.save_dir, state_, d, cfg_.resolved);
  if (comms_.grid.rank != 0)
    for (const std::string& name : model_file_order(full_layout_)) stream.next(name);
  comms_.world->barrier();
  if (comms_.grid.rank == 0) commit_checkpoint(cfg_.ckpt.save_dir, state_.iteration);
  comms_.world->barrier();
  DS_LOG("saved checkpoint to {}/{}", cfg_.ckpt.save_dir, step_dir_name(state_.iteration));
}

void Trainer::log_iteration(float loss, double grad_norm, double ms) {
  IterStats s;
  s.iteration = state_.iteration;
  s.train_iters = cfg_.train_iters;
  s.consumed_samples = state_.consumed_samples;
  s.global_batch = step_batch_;
  s.ms_per_iter = ms;
  s.lr = last_lr_;
  s.loss = loss;
  s.loss_scale = state_.loss_scale;
  s.grad_norm = grad_norm;
  if (moe_) s.moe_loss = last_moe_loss_;
  if (teacher_) {
    s.kd_loss = last_kd_loss_;
    s.kd_label = cfg_.distill.mos ? "mos loss" : "kd loss";
  }
  s.skipped = state_.skipped_steps;
  s.nan_iters = nan_iters_;
  if (curriculum_ || cfg_.data_sampling.active()) s.curriculum_seqlen = seqlen_;
  s.random_ltd_reserved = ltd_reserved_;
  double tokens = static_cast<double>(step_batch_ / cfg_.batch.micro_batch_size * step_rows_) * seqlen_;
  s.tokens_per_s = tokens / (ms / 1000.0);
  s.tflops = s.tokens_per_s * flops_per_token_ / 1e12;
  s.mfu = peak_tflops_ > 0 ? s.tflops / peak_tflops_ : -1;
  s.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (dev_.is_cuda()) s.max_mem_gb = static_cast<double>(device_runtime(dev_).max_allocated_bytes()) / 1e9;
  DS_LOG("{}", format_iteration(s));
  if (cfg_.log.wall_clock_breakdown) DS_LOG("{}", format_step_times(step_times_));
  step_times_ = StepTimes{};
  csv_.train(s);
}

bool Trainer::tokens_left() const {
  const int64_t goal = cfg_.lengths.train_tokens;
  return goal <= 0 || state_.consumed_tokens < goal;
}

bool Trainer::signalled() {
  if (!cfg_.exit_signal_handler) return false;
  double got = exit_signal_received() ? 1.0 : 0.0;
  // Every rank must take the same decision: SIGTERM may reach them at different iterations.
  if (comms_.world->size() > 1) got = comms_.world->all_reduce_scalar(got, dev_, ReduceOp::Max);
  return got > 0;
}

float Trainer::iterate() {
  auto t0 = std::chrono::steady_clock::now();
  // --profile: the run's second step (the first allocates and warms up), or
  // its only one.
  // --cuda-graph: the first replay after the capture (warm-up steps, then
  // the captured one), if the run is that long.
  const int64_t first = first_iteration_;
  const int64_t profiled = cfg_.cuda_graph && cfg_.train_iters - first > cfg_.cuda_graph_warmup + 1
                               ? first + cfg_.cuda_graph_warmup + 1
                               : first + 1;
  const bool profile = cfg_.log.profile && (state_.iteration == profiled ||
                                            (state_.iteration == first && cfg_.train_iters - first == 1));
  float loss = profile ? profiled_step() : train_step();
  heartbeat_.beat();  // the first one opts in: start-up and the first step are not judged
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  window_ms_ += ms;
  ++window_n_;
  if (profile_.record(ms)) {  // an autotuning experiment ends at its last profile step
    profile_.write(*comms_.world, dev_, {cfg_.batch.train_batch_size, cfg_.model.seq_length, flops_per_token_});
    autotune_done_ = true;
    return loss;
  }
  const bool log_line =
      state_.iteration % cfg_.log.log_interval == 0 || state_.iteration == cfg_.train_iters || !tokens_left();
  tensorboard_iteration(loss, log_line, window_ms_ / window_n_);
  if (log_line) {
    log_iteration(loss, last_grad_norm_, window_ms_ / window_n_);
    window_ms_ = 0;
    window_n_ = 0;
  }
  return loss;
}

std::vector<float> Trainer::run() {
  std::vector<float> losses;
  // 0 iterations is only meaningful as an export of the initial or loaded weights.
  DS_USER_CHECK(cfg_.train_iters > 0 || !cfg_.ckpt.export_hf.empty() || cfg_.ckpt.hf_convert,
                "training would run 0 iterations: give --train-iters (training.train_iters) or --train-samples "
                "(training.train_samples {}, at least one global batch of {}); with --export-hf, 0 iterations "
                "exports the initial or loaded weights", cfg_.lengths.train_samples, cfg_.batch.train_batch_size);
  if (cfg_.exit_signal_handler) install_exit_signal_handler();
  struct PauseAtEnd {  // the caller's final barrier waits for the slowest rank
    Heartbeat& hb;
    ~PauseAtEnd() { hb.pause(); }
  } pause_at_end{heartbeat_};
  if (state_.iteration >= cfg_.train_iters || !tokens_left())
    DS_LOG("nothing left to train: iteration {} of {}, {} of {} tokens consumed", state_.iteration, cfg_.train_iters,
           state_.consumed_tokens, cfg_.lengths.train_tokens);
  while (state_.iteration < cfg_.train_iters && tokens_left()) {
    losses.push_back(iterate());
    if (autotune_done_) return losses;
    if (cfg_.log.eval_interval > 0 && state_.iteration % cfg_.log.eval_interval == 0 &&
        state_.iteration != cfg_.train_iters) {
      double v = evaluate();
      if (!std::isnan(v)) {
        DS_LOG("{}", format_validation(state_.iteration, v));
        csv_.valid(state_.iteration, v);
        tb_.valid(train_point(NAN), v);
      }
    }
    if (cfg_.ckpt.save_interval > 0 && state_.iteration % cfg_.ckpt.save_interval == 0) save();
    if (out_of_time() && state_.iteration < cfg_.train_iters) {
      if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
      DS_LOG("exiting at iteration {}: training ran longer than --exit-duration-in-mins {}", state_.iteration,
             cfg_.exit_duration_in_mins);
      return losses;
    }
    if (signalled()) {
      if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
      DS_LOG("exiting at iteration {}: SIGTERM received (--exit-signal-handler)", state_.iteration);
      return losses;
    }
    if (cfg_.exit_interval > 0 && state_.iteration % cfg_.exit_interval == 0 && state_.iteration < cfg_.train_iters) {
      if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
      DS_LOG("exiting at iteration {} (--exit-interval {})", state_.iteration, cfg_.exit_interval);
      return losses;
    }
  }
  if (cfg_.ckpt.hf_convert) {  // hf2megads: the --init-from weights as iteration 0
    save();
    DS_LOG("converted {} into {} (iteration {})", cfg_.ckpt.init_from, cfg_.ckpt.save_dir, state_.iteration);
    DS_LOG("peak resident memory of this rank: {} bytes (getrusage; start-up, import and save)", peak_rss_bytes());
    return losses;
  }
  double v = evaluate();
  if (!std::isnan(v)) {
    DS_LOG("{}", format_validation(state_.iteration, v));
    csv_.valid(state_.iteration, v);
    tb_.valid(train_point(NAN), v);
  }
  if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
  if (!cfg_.ckpt.export_hf.empty()) {
    export_hf(cfg_.ckpt.export_hf);
    DS_LOG("exported Hugging Face model to {}", cfg_.ckpt.export_hf);
  }
  if (store_)
    DS_LOG("ZeRO-{} peak live (transient, elements): full unit gradients {}, gathered parameters {}",
           cfg_.zero.stage, store_->peak_live_grads(), cfg_.zero.stage == 3 ? store_->peak_live_params() : 0);
  DS_LOG("peak resident memory of this rank: {} bytes (getrusage; start-up, training, evaluation, save and export)",
         peak_rss_bytes());
  return losses;
}

// Our weight `name` as the export writes it: an adapted weight with its LoRA
// deltas fused in (W + scaling / dim * left^T right per block; DeepSpeed-Chat's
// convert_lora_to_linear_layer), its left and right taken from the stream
// right after it (hf_export_requests lists them there).
Tensor lora_fused_weight(const ModelConfig& cfg, const std::string& name,
                         const std::function<Tensor(const std::string&)>& next) {
  Tensor w = next(name);
  const auto targets = lora_targets_of(cfg, name);
  if (targets.empty()) return w;
  w = w.device().is_cpu() ? w.clone() : w.to(Device::cpu());
  const int64_t K = w.size(1);
  const LoraConfig& lora = cfg.lora;
  const float s = lora.scaling / static_cast<float>(lora.dim);
  for (const auto& [k, t] : targets) {
    const Tensor L = next(lora_name(*t, k, "left")).to(Device::cpu());
    const Tensor R = next(lora_name(*t, k, "right")).to(Device::cpu());
    Tensor delta = Tensor::zeros({t->rows, K}, DType::F32);
    const Tensor block = w.view(t->row0 * K, {t->rows, K});
    ops::matmul_backward({.dinp = Tensor(), .dweight = delta, .dbias = Tensor(), .dout = L, .inp = R, .weight = block},
                         Stream{});
    ops::scale({.x = delta, .s = s}, Stream{});
    ops::add({.out = block, .a = block, .b = delta}, Stream{});
  }
  return w;
}

Tensor Trainer::lora_fused(FullTensorStream& stream, const std::string& name) {
  Tensor w = lora_fused_weight(cfg_.model, name, [&](const std::string& n) { return stream.next(n); });
  // MoQ: a quantized weight is exported as the model computes with it (the
  // f16 values DeepSpeed's checkpoint holds), not as its f32 master.
  if (wq_ && wq_->quantized(name)) {
    const ParamSpec* p = model_->layout().try_find(name);
    DS_CHECK(p && p->numel == w.numel(), "MoQ export: '{}' is not whole on this rank", name);
    ops::cast({.out = w.reshape({w.numel()}), .inp = model_->compute_params().view(p->offset, {p->numel})}, Stream{});
  }
  return w;
}

void Trainer::export_hf(const std::string& dir) {
  const Heartbeat::Paused paused(heartbeat_);
  // One weight at a time, gathered to rank 0 as it writes (as a save
  // does): the others take part in the same gathers in the same order.
  FullTensorStream stream(rank_model());
  if (comms_.grid.rank == 0) {
    // The tokenizer's ids where its files name them; otherwise the GPT-2 default (-1).
    const data::TokenizerInfo& tok = cfg_.data.tokenizer;
    export_hf_streamed(cfg_.model, full_layout_, [&](const std::string& name) { return lora_fused(stream, name); },
                       dir, HfTokenIds{.bos = tok.bos_id, .eos = tok.eos_id}, &tokenizer_copy_);
  } else {
    for (const std::string& name : hf_export_requests(cfg_.model, full_layout_)) stream.next(name);
  }
}

}  // namespace ds
