// The training step's block and its update (docs/distributed.md, "host
// synchronisations per step"; docs/cuda.md, "CUDA graphs"): the statistics
// the step adds up on the device and reads once, the host's step scalars of
// the AdamW update, and the update gated on the device (step_gate, then
// AdamW reading the step block) that one-process steps and --cuda-graph run
// before the read. train_step (trainer.cpp) puts them in order.
#include <cstring>
#include <tuple>

#include "lib/core/device_runtime.h"
#include "lib/ops/ops.h"
#include "lib/optim/lr_schedule.h"
#include "lib/train/trainer.h"

namespace ds {

StepHyper Trainer::step_hyper() const {
  StepHyper h;
  h.lr = lr_at(cfg_.optim, state_.lr_clock);
  h.beta1 = cfg_.optim.beta1;
  h.beta2 = cfg_.optim.beta2;
  if (const auto betas = betas_at(cfg_.optim, state_.lr_clock)) std::tie(h.beta1, h.beta2) = *betas;
  h.eps = cfg_.optim.eps;
  h.weight_decay = cfg_.optim.weight_decay;
  return h;
}

void Trainer::stage_update_terms(const StepHyper& h) {
  float v[kStepHostSlots];
  step_host_slots(opt_->optimizer().next_terms(h), scaler_ ? static_cast<float>(scaler_->scale()) : 1.f, v);
  // GPU: the previous step's read waited for the device, so no copy from
  // the pinned buffer is in flight.
  float* dst = pinned_terms_ ? pinned_terms_.get() : step_scalars().data<float>() + AdamWSlot::Lr;
  std::memcpy(dst, v, sizeof v);
}

void Trainer::copy_update_terms() {
  if (pinned_terms_)
    device_runtime(dev_).copy_pinned_async(step_scalars().view(AdamWSlot::Lr, {kStepHostSlots}).raw(),
                                           pinned_terms_.get(), kStepHostSlots * sizeof(float));
}

// The gate and the update, after end_step_stats, with no host read: the
// graph holds them with --cuda-graph (with a dynamic fp16 loss scale the gate
// then reads the scale from the step block).
void Trainer::update_on_device(const StepHyper& h, double loss_scale, bool scale_in_block) {
  ops::step_gate({.scalars = step_scalars(), .stats = step_stats().view(0, {3}), .loss_scale = loss_scale,
                  .scale_in_block = scale_in_block, .max_norm = cfg_.optim.grad_clip, .rule = skip_rule()});
  opt_->step_gated(h, step_scalars());
}

// step_stats() = [gradient sum of squares, overflow flag, loss, MoE loss, KD loss]: each rank's
// share, zeroed (asynchronously); the model adds its micro-batches' mean
// losses to the loss slot. Every loss is computed by each tp rank of the last
// pipeline stage: tp rank 0 reports it, weighted so that the sum over the
// world is the mean over the step's micro-batches (1 / grad_accum) and the
// sequence-data-parallel ranks (1 / sdp; each holds the mean over the same
// number of tokens, B x T / SP, so their mean is the global one).
void Trainer::begin_step_stats() {
  Tensor stats = step_stats();
  stats.zero_();
  const double share = 1.0 / static_cast<double>(step_ga_ * sdp_);
  model_->set_loss_sink(stats.view(2, {1}), shard_.tp_rank == 0 ? static_cast<float>(share) : 0.f);
  // Megatron-DeepSpeed's "moe loss": loss_coeff x the sum of the layers' l_aux.
  model_->set_moe_loss_sink(stats.view(3, {1}),
                            shard_.tp_rank == 0 ? static_cast<float>(share * cfg_.model.moe.loss_coeff) : 0.f);
  if (teacher_) model_->set_kd_loss_sink(stats.view(4, {1}), static_cast<float>(share));
}

// end_step_stats: reduces the gradients, adds this rank's share of their sum
// of squares and (fp16) its overflow flag to step_stats(), sums those over
// the world in one all-reduce (stream-ordered on the GPU); read_step_block
// reads them back with the device's gate: the step's one host
// synchronisation, which the host needs for its counters (skipped steps,
// the loss scaler, Adam's step count) and the log. On the CPU backend the
// all-reduce is the blocking collective the read waits for.
void Trainer::end_step_stats() {
  const Tensor stats = step_stats();
  opt_->reduce_gradients_into(stats.view(0, {1}));
  if (scaler_) opt_->grads_nonfinite_into(stats.view(1, {1}));
  // Gradients that stay local (the 1-bit family's compressed phases): each
  // rank clips its own by their own norm over its model-parallel ranks, as
  // DeepSpeed's optimizer wrapper does on every data-parallel rank (the
  // world's sum above, rank 0's, is what the log shows and decides a skip).
  own_sumsq_ = -1;
  if (opt_->gradients_stay_local() && sdp_ > 1) {
    Tensor own = Tensor::zeros({1}, DType::F32, Device::cpu());  // (the 1-bit family runs on the CPU backend)
    opt_->local_norm_into(own);
    if (comms_.tp->size() > 1) comms_.tp->all_reduce(own);
    if (comms_.pp->size() > 1) comms_.pp->all_reduce(own);
    own_sumsq_ = own.data<float>()[0];
  }
  model_->set_loss_sink(Tensor());
  model_->set_moe_loss_sink(Tensor());
  if (teacher_) model_->set_kd_loss_sink(Tensor());
  Communicator& world = *comms_.world;
  if (world.size() > 1) world.all_reduce(stats);
}

Trainer::StepRead Trainer::read_step_block() {
  Communicator& world = *comms_.world;
  // Several GPU ranks: the compute stream waits on NCCL operations. The NCCL
  // watchdog bounds each of them (a dead peer ends the process), so the read
  // below cannot hang for good; without it (DS_NCCL_BLOCKING_WAIT=1) a plain
  // device synchronisation could, so the host first polls the stream with
  // NCCL's error and DS_COMM_TIMEOUT checks. The world all-reduce is the
  // step's last collective: polling it covers every earlier one.
  if (dev_.is_cuda() && world.size() > 1 && !world.watchdog_guarded()) world.synchronize();
  const Tensor host = step_block_.to(Device::cpu());
  world.raise_if_failed();  // values from an aborted operation (on any group) are never used
  const float* v = host.data<float>();
  const float* sc = v + kStepStats;
  return StepRead{.sumsq = v[0], .overflow = v[1], .loss = v[2], .moe_loss = v[3], .kd_loss = v[4], .grad_scale = sc[AdamWSlot::GradScale],
                  .skipped = sc[AdamWSlot::Skip] != 0.f};
}

void Trainer::PinnedDelete::operator()(float* p) const {
  device_runtime(DeviceType::CUDA).free_pinned(p);  // allocated for --device cuda only
}

}  // namespace ds
