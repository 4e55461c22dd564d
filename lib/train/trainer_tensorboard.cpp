// The trainer's TensorBoard reporting: Megatron-DeepSpeed's scalars, written by
// the last rank, every tensorboard_log_interval iterations.
#include <algorithm>
#include <cmath>

#include "lib/core/log.h"
#include "lib/train/trainer.h"

namespace ds {
namespace {

// Adds |x|-statistics of t (f32; copied to the host when on a device) to s[k].
void accumulate(const Tensor& t, int k, OptimizerStats& s, bool sqrt_too) {
  if (!t.defined() || t.numel() == 0) return;
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  const float* x = h.data<float>();
  double sq = 0, l1 = 0, mx = 0, sq_r = 0, l1_r = 0, mx_r = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double a = std::fabs(static_cast<double>(x[i]));
    sq += a * a;
    l1 += a;
    mx = std::max(mx, a);
    if (sqrt_too) {  // sqrt(v): v >= 0
      const double r = std::sqrt(a);
      sq_r += r * r;
      l1_r += r;
      mx_r = std::max(mx_r, r);
    }
  }
  s.sq[k] += sq;
  s.l1[k] += l1;
  s.max[k] = std::max(s.max[k], mx);
  if (sqrt_too) {
    s.sq[k + 1] += sq_r;
    s.l1[k + 1] += l1_r;
    s.max[k + 1] = std::max(s.max[k + 1], mx_r);
  }
}

}  // namespace

void Trainer::open_tensorboard() {
  const LoggingConfig& l = cfg_.log;
  const std::string dir = l.tensorboard_dir_in_effect();
  if (dir.empty() || comms_.grid.rank != comms_.world->size() - 1) return;
  tb_.open(dir, TensorBoardOptions{.learning_rate = l.tb_learning_rate, .loss_scale = l.tb_loss_scale,
                                   .batch_size = l.tb_batch_size, .timers = l.tb_timers,
                                   .validation_ppl = l.tb_validation_ppl, .world_size = l.tb_world_size});
  DS_LOG("TensorBoard: writing {}", dir);
}

TrainPoint Trainer::train_point(float loss) const {
  return TrainPoint{.iteration = state_.iteration,
                    .samples = state_.consumed_samples,
                    .tokens = state_.consumed_tokens,
                    .lr = last_lr_,
                    .loss = loss,
                    .loss_scale = state_.loss_scale,
                    .grad_norm = last_grad_norm_,
                    .batch_size = static_cast<double>(step_batch_),
                    .seq_length = static_cast<double>(actual_seqlen()),
                    .world_size = static_cast<double>(comms_.world->size()),
                    .curriculum_seqlen = curriculum_ || cfg_.data_sampling.active() ? static_cast<double>(seqlen_) : 0.0,
                    .random_ltd_reserved = static_cast<double>(ltd_reserved_),
                    .moe_loss = moe_ && !std::isnan(loss) ? last_moe_loss_ : NAN,
                    .fp16 = cfg_.precision.precision == Precision::FP16};
}

void Trainer::tensorboard_iteration(float loss, bool log_line, double ms) {
  const LoggingConfig& l = cfg_.log;
  if (l.tensorboard_dir_in_effect().empty()) return;
  const TrainPoint p = train_point(loss);
  if (state_.iteration % l.tensorboard_log_interval == 0) {
    tb_.train(p);
    if (l.tb_optimizer_states) {
      const OptimizerStats s = optimizer_stats();  // every rank takes part
      tb_.optimizer(p, s);
    }
  }
  if (log_line) {
    tb_.iteration_time(p, ms);
    tb_.flush();
  }
}

// Megatron-DeepSpeed's statistics: each rank's Adam state and weights, summed
// (maxima: max) over data parallelism when ZeRO partitions the state, then
// over tensor and pipeline parallelism.
OptimizerStats Trainer::optimizer_stats() {
  OptimizerStats s;
  // Optimizers without Adam's moments (SGD, Adagrad) report 0 for them; Lion's
  // exp_avg is its momentum.
  const int off = opt_->tier_state_offset();
  for (const ZeroOptimizer::StatePart& p : opt_->state_parts()) {  // every sharding group's optimizer
    Optimizer& o = *p.opt;
    if (!p.tier) {
      if (o.has_state("exp_avg_sq")) accumulate(o.state("exp_avg_sq"), 0, s, true);
      if (o.has_state("exp_avg")) accumulate(o.state("exp_avg"), 2, s, false);
      continue;
    }
    const std::vector<OptimizerStateSpec> specs = o.state_specs();  // the state on NVMe, a sub-group at a time
    p.tier->for_each(
        [&](int64_t, int64_t, const std::vector<Tensor>& states) {
          for (size_t i = 0; i < specs.size(); ++i) {
            if (specs[i].name == "exp_avg_sq") accumulate(states[off + i], 0, s, true);
            if (specs[i].name == "exp_avg") accumulate(states[off + i], 2, s, false);
          }
          if (off) accumulate(states[0], 3, s, false);  // the parameter shard
        },
        false);
  }
  for (const Tensor& m : opt_->master_ranges()) accumulate(m, 3, s, false);
  auto reduce = [&](Communicator* c) {
    if (!c || c->size() == 1) return;
    Tensor sums = Tensor::empty({8}, DType::F32), maxima = Tensor::empty({4}, DType::F32);
    for (int k = 0; k < 4; ++k) {
      sums.data<float>()[k] = static_cast<float>(s.sq[k]);
      sums.data<float>()[4 + k] = static_cast<float>(s.l1[k]);
      maxima.data<float>()[k] = static_cast<float>(s.max[k]);
    }
    Tensor ds = sums.to(dev_), dm = maxima.to(dev_);
    c->all_reduce(ds, ReduceOp::Sum);
    c->all_reduce(dm, ReduceOp::Max);
    sums = ds.to(Device::cpu());
    maxima = dm.to(Device::cpu());
    for (int k = 0; k < 4; ++k) {
      s.sq[k] = sums.data<float>()[k];
      s.l1[k] = sums.data<float>()[4 + k];
      s.max[k] = maxima.data<float>()[k];
    }
  };
  if (cfg_.zero.stage > 0) reduce(comms_.sdp);
  reduce(comms_.tp);
  reduce(comms_.pp);
  return s;
}

}  // namespace ds
