// Training loop implementation.
#include "lib/train/trainer.h"

#include <chrono>
#include <cmath>

#include "lib/ckpt/hf.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/model/tp_shard.h"
#include "lib/optim/lr_schedule.h"

namespace ds {

void resolve_vocab(TrainConfig& cfg) {
  ModelConfig& m = cfg.model;
  if (!cfg.data.vocab_file.empty()) {
    int64_t v = vocab_size_from_file(cfg.data.vocab_file);
    DS_USER_CHECK(m.vocab_size == 0 || m.vocab_size == v,
                  "model.vocab_size {} does not match --vocab-file '{}' ({} entries)", m.vocab_size,
                  cfg.data.vocab_file, v);
    m.vocab_size = static_cast<int>(v);
  }
  DS_USER_CHECK(m.vocab_size > 0, "the vocabulary size is unknown: give --vocab-file (or model.vocab_size)");
  m.padded_vocab_size = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, cfg.parallel.tp);
  cfg.resolved["model"]["vocab_size"] = m.vocab_size;
}

Trainer::Trainer(const TrainConfig& cfg, Comms& comms) : cfg_(cfg), comms_(comms) {
  DS_USER_CHECK(cfg_.device == "cpu", "--device {}: this build trains on cpu only for now", cfg_.device);
  dev_ = Device::cpu();
  if (cfg_.precision.precision != Precision::FP32)
    DS_WARN("bf16/fp16 is enabled but the CPU backend trains in fp32; the setting is ignored on cpu");
  resolve_vocab(cfg_);
  data_ = std::make_unique<DataPipeline>(cfg_, dev_);
  DS_USER_CHECK(comms_.grid.pp == 1,
                "pipeline model parallelism (PP {}) is not implemented yet; use data and tensor parallelism",
                comms_.grid.pp);
  dp_ = comms_.grid.dp;
  dp_rank_ = comms_.grid.dp_rank;
  tp_ = comms_.grid.tp;
  tp_rank_ = comms_.grid.tp_rank;
  full_layout_ = build_layout(cfg_.model);
  const TpComm tp{tp_ > 1 ? comms_.tp : nullptr, tp_, tp_rank_};
  const ModelLayout local = build_layout(cfg_.model, tp_, tp_rank_);
  DS_USER_CHECK(cfg_.batch.dp_size == dp_, "batch: the config was resolved for {} data-parallel ranks, the job has {}",
                cfg_.batch.dp_size, dp_);
  ZeroPartition part = make_zero_partition(local.total, dp_);
  Communicator* dp_comm = dp_ > 1 ? comms_.dp : nullptr;
  if (cfg_.zero.stage >= 2) {
    store_ = std::make_unique<ZeroParamStore>(local, cfg_.model.num_layers, dev_, dp_comm, cfg_.zero, part);
    model_ = std::make_unique<GptModel>(cfg_.model, dev_, *store_, tp);
  } else {
    model_ = std::make_unique<GptModel>(cfg_.model, dev_, 0, tp);
  }
  opt_ = std::make_unique<ZeroOptimizer>(*model_, dp_comm, cfg_.zero, part, store_.get());
  if (tp_ > 1) {  // gradient norm: split weights per shard, replicated ones on tp rank 0 only
    std::vector<Range> counted{{0, local.total}};
    if (tp_rank_ != 0) {
      counted.clear();
      int64_t at = 0;
      for (const Range& r : replicated_ranges(local)) {
        if (r.begin > at) counted.push_back({at, r.begin});
        at = r.end;
      }
      if (at < local.total) counted.push_back({at, local.total});
    }
    opt_->set_tensor_parallel(comms_.tp, std::move(counted));
  }
  if (cfg_.zero.offload_optimizer_device == "cpu")
    DS_LOG("offload_optimizer.device = cpu: on the CPU backend the optimizer state is already in host memory; "
           "nothing to move");
  int64_t n_matmul = full_layout_.total;
  if (const ParamSpec* p = full_layout_.try_find("embed.wpe")) n_matmul -= p->numel;
  flops_per_token_ = flops_per_token(cfg_.model, n_matmul);
  peak_tflops_ = cfg_.log.cpu_peak_tflops;
  load_or_init();
  if (cfg_.log.csv_enabled && comms_.grid.rank == 0) csv_.open(cfg_.log.csv_path, cfg_.log.csv_job_name);
  DS_LOG("model: {} layers, hidden {}, heads {}, ffn {}, vocab {} (padded {}), {} parameters",
         model_->dims().L, model_->dims().C, model_->dims().NH, model_->dims().F, model_->dims().V,
         model_->dims().Vp, model_->layout().total);
  if (tp_ > 1)
    DS_LOG("tensor parallel: {} ranks, this rank holds {} of the model's {} parameters ({} heads, vocab rows "
           "[{}, {}))",
           tp_, model_->layout().total, full_layout_.total, model_->dims().NH / tp_,
           tp_rank_ * (model_->dims().Vp / tp_), (tp_rank_ + 1) * (model_->dims().Vp / tp_));
  DS_LOG("batch: global {} = micro {} x grad accum {} x data parallel {}; {} train samples per epoch",
         cfg_.batch.train_batch_size, cfg_.batch.micro_batch_size, cfg_.batch.grad_accum_steps, cfg_.batch.dp_size,
         data_->train_samples_per_epoch());
  log_model_state();
}

void Trainer::log_model_state() {
  ModelStateBytes b = opt_->model_state_bytes();
  DS_LOG("model state: {} bytes per rank (ZeRO stage {}, {} data-parallel ranks; params {} + grads {} + Adam m, v {})",
         b.total(), cfg_.zero.stage, dp_, b.params, b.grads, b.optimizer);
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

Tensor Trainer::full_params(bool all_ranks) {
  if (tp_ == 1) return local_params(all_ranks);
  Tensor local = local_params(true);
  Tensor out;
  if (all_ranks || comms_.grid.rank == 0) out = Tensor::empty({full_layout_.total}, DType::F32, dev_);
  gather_tp_params(comms_.tp, model_->layout(), full_layout_, cfg_.model.num_layers, local, out);
  return out;
}

void Trainer::set_params_from_full(const Tensor& full) {
  if (tp_ == 1) return model_->store().set_full_params(full);
  Tensor local = Tensor::empty({model_->layout().total}, DType::F32, dev_);
  slice_tp_params(model_->layout(), full_layout_, full, local);
  model_->store().set_full_params(local);
}

Tensor Trainer::local_params(bool all_ranks) {
  const int64_t n = model_->layout().total;
  if (model_->has_flat_buffers()) return model_->params().view(0, {n});
  Tensor out;
  if (all_ranks || dp_rank_ == 0) out = Tensor::empty({n}, DType::F32, dev_);
  model_->store().get_full_params(out);
  return out;
}

void Trainer::load_or_init() {
  if (!cfg_.ckpt.load_dir.empty()) {
    Range r = opt_->optimizer_range();
    const bool flat = model_->has_flat_buffers() && tp_ == 1;
    Tensor full = flat ? model_->params().view(0, {full_layout_.total})
                       : Tensor::empty({full_layout_.total}, DType::F32, dev_);
    CheckpointData d{&full_layout_, full, opt_->adam().m(), opt_->adam().v(), r.begin, r.end, 0, dp_rank_, dp_};
    d.opt_layout = &model_->layout();
    d.tp = tp_;
    d.tp_rank = tp_rank_;
    if (load_checkpoint(cfg_.ckpt.load_dir, state_, d)) {
      if (!flat) set_params_from_full(full);
      opt_->adam().set_step_count(d.opt_step);
      DS_LOG("loaded checkpoint from {} at iteration {}", cfg_.ckpt.load_dir, state_.iteration);
      return;
    }
    DS_WARN("--load {}: no checkpoint found ('latest' missing); starting from scratch", cfg_.ckpt.load_dir);
  }
  if (!cfg_.ckpt.init_from.empty()) {
    Tensor p = Tensor::empty({full_layout_.total}, DType::F32, dev_);
    import_hf(cfg_.model, full_layout_, p, cfg_.ckpt.init_from);
    set_params_from_full(p);
    DS_LOG("initialised weights from {}", cfg_.ckpt.init_from);
    return;
  }
  model_->init_weights(cfg_.seed, cfg_.model.init_method_std);
}

float Trainer::train_step() {
  const auto& b = cfg_.batch;
  opt_->zero_grads();
  const float loss_weight =
      1.0f / static_cast<float>(b.micro_batch_size * cfg_.model.seq_length * b.grad_accum_steps * dp_);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < b.grad_accum_steps; ++micro) {
    MicroBatch mb = data_->train_batch(state_.consumed_samples, static_cast<int>(micro), dp_rank_, dp_);
    loss_sum += model_->forward_backward(mb.tokens, mb.targets, loss_weight);
  }
  double norm = opt_->reduce_gradients();
  float coef = clip_coefficient(norm, cfg_.optim.grad_clip);
  AdamWHyper h;
  h.lr = lr_at(cfg_.optim, state_.iteration, cfg_.train_iters);
  h.beta1 = cfg_.optim.beta1;
  h.beta2 = cfg_.optim.beta2;
  h.eps = cfg_.optim.eps;
  h.weight_decay = cfg_.optim.weight_decay;
  opt_->step(h, coef);
  state_.iteration += 1;
  state_.consumed_samples += b.train_batch_size;
  float loss = static_cast<float>(dp_mean(loss_sum / b.grad_accum_steps));
  last_grad_norm_ = norm;
  last_lr_ = h.lr;
  return loss;
}

double Trainer::evaluate() {
  if (!data_->has_valid() || cfg_.log.eval_iters <= 0) return NAN;
  double sum = 0;
  int64_t n = 0;
  for (int64_t it = 0; it < cfg_.log.eval_iters; ++it) {
    for (int64_t micro = 0; micro < cfg_.batch.grad_accum_steps; ++micro) {
      int64_t first = (it * cfg_.batch.grad_accum_steps + micro) * cfg_.batch.micro_batch_size;
      int64_t first_dp = first * dp_;
      MicroBatch mb = data_->valid_batch(first_dp, dp_rank_, dp_);
      sum += model_->forward_loss(mb.tokens, mb.targets);
      ++n;
    }
  }
  return dp_mean(sum / static_cast<double>(n));
}

double Trainer::dp_mean(double local) {
  if (dp_ == 1) return local;
  Tensor t = Tensor::empty({1}, DType::F32);
  t.data<float>()[0] = static_cast<float>(local);
  comms_.dp->all_reduce(t);
  return static_cast<double>(t.data<float>()[0]) / dp_;
}

void Trainer::save() {
  if (cfg_.ckpt.save_dir.empty()) return;
  Range r = opt_->optimizer_range();
  // Stage 0 keeps identical optimizer state on every rank: rank 0 writes one shard.
  const bool sharded = cfg_.zero.stage >= 1;
  // ZeRO-3: the parameters are gathered unit by unit; only rank 0 keeps (and writes) them.
  Tensor full = full_params(false);
  CheckpointData d{&full_layout_, full, opt_->adam().m(), opt_->adam().v(), r.begin, r.end,
                   opt_->adam().step_count(), sharded ? dp_rank_ : 0, sharded ? dp_ : 1};
  d.opt_layout = &model_->layout();
  d.tp = tp_;
  d.tp_rank = tp_rank_;
  if (sharded || dp_rank_ == 0) write_checkpoint_files(cfg_.ckpt.save_dir, state_, d, cfg_.resolved);
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
  s.global_batch = cfg_.batch.train_batch_size;
  s.ms_per_iter = ms;
  s.lr = last_lr_;
  s.loss = loss;
  s.loss_scale = state_.loss_scale;
  s.grad_norm = grad_norm;
  s.skipped = state_.skipped_steps;
  double tokens = static_cast<double>(cfg_.batch.train_batch_size) * cfg_.model.seq_length;
  s.tokens_per_s = tokens / (ms / 1000.0);
  s.tflops = s.tokens_per_s * flops_per_token_ / 1e12;
  s.mfu = peak_tflops_ > 0 ? s.tflops / peak_tflops_ : -1;
  DS_LOG("{}", format_iteration(s));
  csv_.train(s);
}

std::vector<float> Trainer::run() {
  std::vector<float> losses;
  double window_ms = 0;
  int64_t window_n = 0;
  while (state_.iteration < cfg_.train_iters) {
    auto t0 = std::chrono::steady_clock::now();
    float loss = train_step();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    losses.push_back(loss);
    window_ms += ms;
    ++window_n;
    if (state_.iteration % cfg_.log.log_interval == 0 || state_.iteration == cfg_.train_iters) {
      log_iteration(loss, last_grad_norm_, window_ms / window_n);
      window_ms = 0;
      window_n = 0;
    }
    if (cfg_.log.eval_interval > 0 && state_.iteration % cfg_.log.eval_interval == 0 &&
        state_.iteration != cfg_.train_iters) {
      double v = evaluate();
      if (!std::isnan(v)) {
        DS_LOG("{}", format_validation(state_.iteration, v));
        csv_.valid(state_.iteration, v);
      }
    }
    if (cfg_.ckpt.save_interval > 0 && state_.iteration % cfg_.ckpt.save_interval == 0) save();
    if (cfg_.exit_interval > 0 && state_.iteration % cfg_.exit_interval == 0 && state_.iteration < cfg_.train_iters) {
      if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
      DS_LOG("exiting at iteration {} (--exit-interval {})", state_.iteration, cfg_.exit_interval);
      return losses;
    }
  }
  double v = evaluate();
  if (!std::isnan(v)) {
    DS_LOG("{}", format_validation(state_.iteration, v));
    csv_.valid(state_.iteration, v);
  }
  if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
  if (!cfg_.ckpt.export_hf.empty()) {
    Tensor full = full_params(false);  // collective with ZeRO-3
    if (comms_.grid.rank == 0) {
      export_hf(cfg_.model, full_layout_, full, cfg_.ckpt.export_hf);
      DS_LOG("exported Hugging Face model to {}", cfg_.ckpt.export_hf);
    }
  }
  if (store_)
    DS_LOG("ZeRO-{} peak live (transient, elements): full unit gradients {}, gathered parameters {}",
           cfg_.zero.stage, store_->peak_live_grads(), cfg_.zero.stage == 3 ? store_->peak_live_params() : 0);
  return losses;
}

}  // namespace ds
