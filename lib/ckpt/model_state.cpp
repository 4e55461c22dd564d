// Gathering and scattering the full model across tensor, pipeline and ZeRO-3
// shards for checkpoints and exports (model_state.h).
#include "lib/ckpt/model_state.h"

#include "lib/model/tp_shard.h"

namespace ds {
namespace {

// Full model from every stage's tp-gathered weights `stage_buf` (layout
// `stage`): the stages send to pipeline rank 0, which places them.
// Collective over pp; undefined off rank 0 unless all_ranks.
Tensor gather_stages(const RankModel& r, const ModelLayout& stage, const Tensor& stage_buf, bool all_ranks) {
  const ModelLayout& full = *r.full;
  Tensor out = Tensor::empty({full.total}, DType::F32, stage_buf.device());
  auto place = [&](const ModelLayout& from, const Tensor& buf, bool first) {
    for (const ParamSpec& p : from.params) {
      if (!first && p.name == "embed.wte") continue;  // the tied copy: the first stage's is the same
      const ParamSpec& f = full.find(p.name);
      out.view(f.offset, {f.numel}).copy_from(buf.view(p.offset, {p.numel}));
    }
  };
  Communicator& pp = *r.comms->pp;
  if (r.shard.pp_rank == 0) place(stage, stage_buf, true);
  for (int s = 1; s < r.shard.pp; ++s) {
    if (r.shard.pp_rank == s) pp.send(stage_buf.view(0, {stage.total}), 0);
    if (r.shard.pp_rank != 0) continue;
    const ModelLayout ls = build_layout(*r.config, r.shard.tp_gathered().at(0, s));
    Tensor buf = Tensor::empty({ls.total}, DType::F32, stage_buf.device());
    pp.recv(buf, s);
    place(ls, buf, false);
  }
  if (all_ranks) pp.broadcast(out, 0);
  return all_ranks || r.comms->grid.rank == 0 ? out : Tensor();
}

// Expert parallelism: this rank's weights `local_buf` (its layout, E / EP
// experts of each MoE layer) -> the same tp rank and stage's weights with
// every expert (`out`, layout `gathered`). Collective over the expert-
// parallel group.
void gather_experts(const RankModel& r, const ModelLayout& gathered, const Tensor& local_buf, const Tensor& out) {
  const ModelLayout& local = r.model->layout();
  Communicator& ep = *r.comms->ep;
  for (const ParamSpec& p : local.params) {
    const ParamSpec& g = gathered.find(p.name);
    const Tensor mine = local_buf.view(p.offset, {p.numel});
    Tensor to = out.view(g.offset, {g.numel});
    if (p.ep_split)
      ep.all_gather(mine, to);  // block i of the experts from expert-parallel rank i
    else
      to.copy_from(mine);
  }
}

// This rank's shard coordinates with the experts gathered.
ShardCoords experts_gathered(ShardCoords s) {
  s.ep = 1;
  s.ep_rank = 0;
  return s;
}

}  // namespace

Tensor gather_local_params(const RankModel& r, bool all_ranks) {
  GptModel& m = *r.model;
  const int64_t n = m.layout().total;
  if (m.has_flat_buffers() && m.flat_store().full_master()) return m.params().view(0, {n});
  Tensor out;
  if (all_ranks || r.dp_rank == 0) out = Tensor::empty({n}, DType::F32, m.device());
  m.store().get_full_params(out);
  return out;
}

Tensor gather_full_params(const RankModel& r, bool all_ranks) {
  if (r.shard.tp == 1 && r.shard.pp == 1 && r.shard.ep == 1) return gather_local_params(r, all_ranks);
  GptModel& m = *r.model;
  Tensor local = gather_local_params(r, true);
  ModelLayout with_experts;  // expert parallelism: this tp rank and stage's weights, every expert
  const ModelLayout* mine = &m.layout();
  if (r.shard.ep > 1) {
    with_experts = build_layout(*r.config, experts_gathered(r.shard));
    Tensor all = Tensor::empty({with_experts.total}, DType::F32, m.device());
    gather_experts(r, with_experts, local, all);
    local = all;
    mine = &with_experts;
  }
  Communicator* tp = r.shard.tp > 1 ? r.comms->tp : nullptr;
  if (r.shard.pp > 1) {
    const ModelLayout stage = build_layout(*r.config, r.shard.tp_gathered());
    Tensor st = Tensor::empty({stage.total}, DType::F32, m.device());
    gather_tp_params(tp, *mine, stage, r.config->num_layers, local, st);
    return gather_stages(r, stage, st, all_ranks);
  }
  Tensor out;
  if (all_ranks || r.comms->grid.rank == 0) out = Tensor::empty({r.full->total}, DType::F32, m.device());
  gather_tp_params(tp, *mine, *r.full, r.config->num_layers, local, out);
  return out;
}

void scatter_full_params(const RankModel& r, const Tensor& full) {
  GptModel& m = *r.model;
  if (r.shard.tp == 1 && r.shard.pp == 1 && r.shard.ep == 1) return m.store().set_full_params(full);
  Tensor local = Tensor::empty({m.layout().total}, DType::F32, m.device());
  slice_tp_params(m.layout(), *r.full, full, local);
  m.store().set_full_params(local);
}

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
      Tensor all = Tensor::empty({tp * p.numel}, DType::F32, dev);
      r_.comms->tp->all_gather(mine, all);
      if (tp_rank == 0) {
        const Tensor all_h = to_host(all);
        full = Tensor::empty(f.shape, DType::F32);
        place_tp_slices(p, tp, all_h.data<float>(), p.numel, full.data<float>());
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

CheckpointData rank_checkpoint(const RankModel& r, const Tensor& params, Optimizer& opt, Range opt_range,
                               int shard_index, int shards) {
  CheckpointData d;
  d.layout = r.full;
  d.params = params;
  for (const OptimizerStateSpec& s : opt.state_specs())
    d.opt_state.push_back({s.name, opt.state(s.name), s.non_negative});
  d.opt_begin = opt_range.begin;
  d.opt_end = opt_range.end;
  d.opt_step = opt.step_count();
  d.opt_type = opt.type();
  d.rank = shard_index;
  d.world = shards;
  d.opt_layout = &r.model->layout();
  d.shard = r.shard;
  d.model = r.config;  // lets a checkpoint of another layout be reshaped on load (reshape.h)
  return d;
}

}  // namespace ds
