// Training loop implementation.
#include "lib/train/trainer.h"

#include <chrono>
#include <cmath>

#include "lib/ckpt/hf.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
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

Trainer::Trainer(const TrainConfig& cfg) : cfg_(cfg) {
  DS_USER_CHECK(cfg_.device == "cpu", "--device {}: this build trains on cpu only for now", cfg_.device);
  dev_ = Device::cpu();
  if (cfg_.precision.precision != Precision::FP32)
    DS_WARN("bf16/fp16 is enabled but the CPU backend trains in fp32; the setting is ignored on cpu");
  resolve_vocab(cfg_);
  data_ = std::make_unique<DataPipeline>(cfg_, dev_);
  model_ = std::make_unique<GptModel>(cfg_.model, dev_);
  opt_ = std::make_unique<AdamW>(model_->layout(), dev_, 0, model_->layout().total);
  int64_t n_matmul = model_->layout().total;
  if (const ParamSpec* p = model_->layout().try_find("embed.wpe")) n_matmul -= p->numel;
  flops_per_token_ = flops_per_token(cfg_.model, n_matmul);
  peak_tflops_ = cfg_.log.cpu_peak_tflops;
  load_or_init();
  if (cfg_.log.csv_enabled) csv_.open(cfg_.log.csv_path, cfg_.log.csv_job_name);
  DS_LOG("model: {} layers, hidden {}, heads {}, ffn {}, vocab {} (padded {}), {} parameters",
         model_->dims().L, model_->dims().C, model_->dims().NH, model_->dims().F, model_->dims().V,
         model_->dims().Vp, model_->layout().total);
  DS_LOG("batch: global {} = micro {} x grad accum {} x data parallel {}; {} train samples per epoch",
         cfg_.batch.train_batch_size, cfg_.batch.micro_batch_size, cfg_.batch.grad_accum_steps, cfg_.batch.dp_size,
         data_->train_samples_per_epoch());
  DS_LOG("model state: {} bytes per rank (params + grads + Adam m, v, all fp32 = 16 bytes/param)",
         4 * (model_->params().numel() + model_->grads().numel() + opt_->m().numel() + opt_->v().numel()));
}

void Trainer::load_or_init() {
  if (!cfg_.ckpt.load_dir.empty()) {
    CheckpointData d{&model_->layout(), model_->params(), opt_->m(), opt_->v(), 0, model_->layout().total, 0, 0, 1};
    if (load_checkpoint(cfg_.ckpt.load_dir, state_, d)) {
      opt_->set_step_count(d.opt_step);
      DS_LOG("loaded checkpoint from {} at iteration {}", cfg_.ckpt.load_dir, state_.iteration);
      return;
    }
    DS_WARN("--load {}: no checkpoint found ('latest' missing); starting from scratch", cfg_.ckpt.load_dir);
  }
  if (!cfg_.ckpt.init_from.empty()) {
    import_hf(cfg_.model, model_->layout(), model_->params(), cfg_.ckpt.init_from);
    DS_LOG("initialised weights from {}", cfg_.ckpt.init_from);
    return;
  }
  model_->init_weights(cfg_.seed, cfg_.model.init_method_std);
}

float Trainer::train_step() {
  const auto& b = cfg_.batch;
  model_->grads().zero_();
  const float loss_weight =
      1.0f / static_cast<float>(b.micro_batch_size * cfg_.model.seq_length * b.grad_accum_steps);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < b.grad_accum_steps; ++micro) {
    MicroBatch mb = data_->train_batch(state_.consumed_samples, static_cast<int>(micro), 0, 1);
    loss_sum += model_->forward_backward(mb.tokens, mb.targets, loss_weight);
  }
  double norm = std::sqrt(grad_sum_squares(model_->grads()));
  float coef = clip_coefficient(norm, cfg_.optim.grad_clip);
  AdamWHyper h;
  h.lr = lr_at(cfg_.optim, state_.iteration, cfg_.train_iters);
  h.beta1 = cfg_.optim.beta1;
  h.beta2 = cfg_.optim.beta2;
  h.eps = cfg_.optim.eps;
  h.weight_decay = cfg_.optim.weight_decay;
  opt_->step(model_->params(), model_->grads(), h, coef);
  state_.iteration += 1;
  state_.consumed_samples += b.train_batch_size;
  float loss = static_cast<float>(loss_sum / b.grad_accum_steps);
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
      MicroBatch mb = data_->valid_batch(first, 0, 1);
      sum += model_->forward_loss(mb.tokens, mb.targets);
      ++n;
    }
  }
  return sum / static_cast<double>(n);
}

void Trainer::save() {
  if (cfg_.ckpt.save_dir.empty()) return;
  CheckpointData d{&model_->layout(), model_->params(), opt_->m(), opt_->v(), 0, model_->layout().total,
                   opt_->step_count(), 0, 1};
  save_checkpoint(cfg_.ckpt.save_dir, state_, d, cfg_.resolved);
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
  }
  double v = evaluate();
  if (!std::isnan(v)) {
    DS_LOG("{}", format_validation(state_.iteration, v));
    csv_.valid(state_.iteration, v);
  }
  if (cfg_.ckpt.save_interval <= 0 || state_.iteration % cfg_.ckpt.save_interval != 0) save();
  if (!cfg_.ckpt.export_hf.empty()) {
    export_hf(cfg_.model, model_->layout(), model_->params(), cfg_.ckpt.export_hf);
    DS_LOG("exported Hugging Face model to {}", cfg_.ckpt.export_hf);
  }
  return losses;
}

}  // namespace ds
