// The full model gathered one weight at a time across tensor, pipeline,
// expert and ZeRO-3 shards for checkpoints and exports (model_state.h).
#include "lib/ckpt/model_state.h"

#include "lib/model/tp_shard.h"

namespace ds {
FullTensorStream::FullTensorStream(const RankModel& r) : r_(r) {
  for (int s = r.shard.pp - 1; s >= 0; --s)  // the first stage holding a weight wins (the tied wte: stage 0)
    for (const ParamSpec& p : build_layout(*r.config, r.shard.tp_gathered().at(0, s)).params) owner_[p.name] = s;
}

Tensor FullTensorStream::next(const std::string& name) {
  auto it = owner_.find(name);
  DS_CHECK(it != owner_.end(), "FullTensorStream: no stage holds '{}'", name);
  const int owner = it->second, tp = r_.shard.tp, tp_rank = r_.shard.tp_rank;
  const bool root = r_.shard.pp_rank == 0 && tp_rank == 0;  // global rank 0 among the streaming ranks
  const ParamSpec& f = r_.full->find(name);
  const Device dev = r_.model->device();
  auto to_host = [](const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); };
  Tensor out;
  if (r_.shard.pp_rank == owner) {
    const ParamSpec& p = r_.model->layout().find(name);
    const Tensor mine = Tensor::empty({p.numel}, DType::F32, dev);
    r_.model->store().gather_f32({p.offset, p.offset + p.numel}, mine);  // collective over dp where sharded
    Tensor whole = mine;
    if (p.ep_split && r_.shard.ep > 1) {  // the first expert-parallel group gathers the experts
      if (r_.comms->grid.edp_rank != 0) return Tensor();
      whole = Tensor::empty({r_.shard.ep * p.numel}, DType::F32, dev);
      r_.comms->ep->all_gather(mine, whole);
    }
    if (r_.dp_rank != 0) return Tensor();  // the first replica gathers over tp and sends
    Tensor full;
    if (p.split == TpSplit::Replicated || tp == 1) {
      if (tp_rank == 0) full = to_host(whole).clone().reshape(f.shape);
    } else {
      // (an expert weight split over tp too: every tp rank's slices of all experts)
      Tensor all = Tensor::empty({tp * whole.numel()}, DType::F32, dev);
      r_.comms->tp->all_gather(whole, all);
      if (tp_rank == 0) {
        const Tensor all_h = to_host(all);
        full = Tensor::empty(f.shape, DType::F32);
        place_tp_slices(p, tp, all_h.data<float>(), whole.numel(), full.data<float>());
      }
    }
    if (tp_rank == 0 && owner == 0) out = full;
    if (tp_rank == 0 && owner != 0) r_.comms->pp->send(dev.is_cpu() ? full : full.to(dev), 0);
  }
  if (r_.dp_rank != 0) return Tensor();
  if (root && owner != 0) {
    Tensor recv = Tensor::empty(f.shape, DType::F32, dev);
    r_.comms->pp->recv(recv, owner);
    out = to_host(recv);
  }
  return root && r_.dp_rank == 0 ? out : Tensor();
}

OptimizerStates checkpoint_states(Optimizer& opt) {
  OptimizerStates out;
  for (const OptimizerStateSpec& s : opt.state_specs())
    out.push_back({s.name, opt.state_elsewhere() ? Tensor::zeros({0}, DType::F32) : opt.state(s.name),
                   s.non_negative});
  return out;
}

CheckpointData rank_checkpoint(const RankModel& r, const Tensor& params, Optimizer& opt, Range opt_range,
                               int shard_index, int shards) {
  CheckpointData d;
  d.layout = r.full;
  d.params = params;
  d.opt_state = checkpoint_states(opt);  // (state in a tier: the caller sets tier_read / tier_write)
  d.opt_begin = opt_range.begin;
  d.opt_end = opt_range.end;
  d.opt_step = opt.step_count();
  d.opt_type = opt.type();
  d.opt_scalars = opt.saved_scalars();
  d.rank = shard_index;
  d.world = shards;
  d.opt_layout = &r.model->layout();
  d.shard = r.shard;
  d.model = r.config;  // lets a checkpoint of another layout be reshaped on load (reshape.h)
  return d;
}

}  // namespace ds
