// ZeRO stage 0-3 gradient reduction and sharded optimizer step.
#include "lib/runtime/zero_optimizer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

ZeroOptimizer::ZeroOptimizer(GptModel& model, Communicator* dp, const ZeroConfig& z, const ZeroPartition& part,
                             ZeroParamStore* store, const OptimizerSpec& optimizer)
    : model_(model), dp_(dp), z_(z), part_(part), store_(store) {
  DS_USER_CHECK(z.stage >= 0 && z.stage <= 3, "zero_optimization.stage {} is not supported (0, 1, 2 or 3)", z.stage);
  DS_CHECK((z.stage >= 2) == (store != nullptr), "ZeRO stage {} with{} a sharded store", z.stage,
           store ? "" : "out");
  DS_CHECK(model.layout().total == part.total, "model of {} elements, partition total {}", model.layout().total,
           part.total);
  rank_ = dp ? dp->rank() : 0;
  range_ = z.stage == 0 ? Range{0, part.total} : part.owned_real(rank_);
  offload_ = z.offload_optimizer != OffloadDevice::None && model.device().is_cuda();
  nvme_ = z.offload_optimizer == OffloadDevice::NVMe;
  DS_USER_CHECK(!nvme_ || z.stage == 3, "offload_optimizer.device nvme needs ZeRO stage 3 (stage {})", z.stage);
  const bool mixed = model.compute_dtype() != DType::F32;
  // ZeRO-1: the flat store all-gathers the updated weights, and in mixed
  // precision it keeps the f32 master of exactly the range the optimizer updates.
  if (!store && z.stage == 1 && part.dp > 1 && model.flat_store().shard_groups().size() == 1) {
    DS_CHECK(model.flat_store().gathers(), "ZeRO-1 over {} ranks with a flat store that has no data-parallel group",
             part.dp);
    const Range m = mixed ? model.flat_store().master_range() : range_;
    DS_CHECK(m.begin == range_.begin && m.end == range_.end,
             "ZeRO-1: the flat store's f32 master covers [{}, {}), the optimizer updates [{}, {})", m.begin, m.end,
             range_.begin, range_.end);
  }
  // Mixed precision, flat store: the fused update writes the updated range of
  // the compute copy itself (stage 1 then all-gathers the compute copy).
  fused_lowp_ = !store && !offload_ && mixed;
  const std::vector<ShardGroup>* sharding =
      store ? &store->groups() : (z.stage == 1 ? &model.flat_store().shard_groups() : nullptr);
  params_in_tier_ = nvme_ && z.offload_param == OffloadDevice::NVMe;
  DS_CHECK(!params_in_tier_ || (store_ && store_->params_elsewhere()),
           "offload_param nvme with a store that keeps its parameter shard");
  const StateHome home = nvme_ ? StateHome::Elsewhere : StateHome::Own;
  if (sharding && sharding->size() > 1) {
    DS_USER_CHECK(!offload_, "offload_optimizer with expert parallelism on a GPU is not supported yet; use no "
                             "offload (or offload_optimizer nvme at stage 3 on the CPU backend)");
    range_ = {0, 0};
    for (size_t i = 0; i < sharding->size(); ++i) {
      const ShardGroup& g = (*sharding)[i];
      GroupOpt o{.g = g,
                 .layout = std::make_unique<const ModelLayout>(packed_layout(model.layout(), g.space)),
                 .owned = g.owned(),
                 .pieces = {},
                 .opt = nullptr,
                 .tier = nullptr};
      o.pieces = g.space.pieces(o.owned);
      o.opt = make_optimizer(optimizer, *o.layout, model.device(), o.owned.begin, o.owned.end, home);
      if (g.dp && g.part.dp > 1) {
        Communicator* c = g.dp;
        o.opt->set_shard_sum([c](const Tensor& t) { c->all_reduce(t); });
      }
      o.tier = make_tier(*o.opt, o.owned.size(), g.name);
      if (params_in_tier_) store_->set_param_tier(i, o.tier.get());
      groups_.push_back(std::move(o));
    }
  } else {
    opt_ = make_optimizer(optimizer, model.layout(), offload_ ? Device::cpu() : model.device(), range_.begin,
                          range_.end, home);
    grads_in_tier_ = nvme_ && store_ && store_->grads_elsewhere();
    tier_ = make_tier(*opt_, range_.size(), "", grads_in_tier_);
    if (params_in_tier_) store_->set_param_tier(0, tier_.get());
    if (grads_in_tier_) {
      if (tier_) tier_->set_read_only_tail(1);  // the update reads the gradients, the reductions write them
      store_->set_grad_tier(tier_.get(), tier_ ? tier_->n_states() - 1 : 0);
    }
  }
  // ZeRO 1-3 over several ranks: the range is a shard of the data-parallel
  // group (Lamb adds its per-tensor sums over it).
  if (opt_ && z.stage >= 1 && dp && part.dp > 1) opt_->set_shard_sum([dp](const Tensor& t) { dp->all_reduce(t); });
  // The 1-bit family (stage 0) exchanges its compressed momentum over the group.
  if (opt_ && z.stage == 0) opt_->set_data_parallel(dp);
  overlap_ = z.overlap_comm && !store && dp && part.dp > 1;
  if (overlap_) {
    buckets_ = make_buckets(part.total, z.reduce_bucket_size);
    const std::vector<Range>& units = model.units();
    for (const Range& b : buckets_) {
      bucket_units_.emplace_back();
      for (size_t u = 0; u < units.size(); ++u)
        if (units[u].size() > 0 && units[u].begin < b.end && b.begin < units[u].end)
          bucket_units_.back().push_back(static_cast<int>(u));
    }
    unit_ready_.assign(units.size(), 0);
  }
  unit_begin_us_.assign(model.units().size(), 0.0);
  model.store().set_grads_hook([this](int unit, bool ready) { on_grads(unit, ready); });
}

std::unique_ptr<NvmeStateTier> ZeroOptimizer::make_tier(const Optimizer& opt, int64_t n, const std::string& group,
                                                        bool grads) {
  const std::vector<OptimizerStateSpec> specs = opt.state_specs();
  if (!nvme_ || n == 0 || (specs.empty() && !params_in_tier_ && !grads)) return nullptr;
  NvmeTierOptions o{.dir = z_.nvme.nvme_path,
                    .name = group.empty() ? fmt::format("dstrain-optimizer-{}-{}.swp", ::getpid(), rank_)
                                          : fmt::format("dstrain-optimizer-{}-{}-{}.swp", ::getpid(), rank_, group),
                    .aio = z_.nvme.aio,
                    .sub_group_size = z_.sub_group_size,
                    .buffer_count = z_.nvme.buffer_count,
                    .pipeline_read = z_.nvme.pipeline_read,
                    .pipeline_write = z_.nvme.pipeline_write};
  std::vector<float> initial;
  if (params_in_tier_) initial.push_back(0.f);  // state 0: the parameter shard (written by init / load)
  for (size_t i = 0; i < specs.size(); ++i) initial.push_back(opt.initial_state_value(i));
  if (grads) initial.push_back(0.f);  // last: the gradient shard
  return std::make_unique<NvmeStateTier>(o, std::move(initial), n);
}

// Sub-group by sub-group through the NVMe tier (nvme_tier.h): the same bits
// as the whole update (Optimizer::step_part).
void ZeroOptimizer::step_through_tier(Optimizer& opt, NvmeStateTier* tier, const Tensor& params, const Tensor& grads,
                                      int64_t n, const StepHyper& h, float grad_scale) {
  opt.count_step();  // as Optimizer::step: one step for the whole range
  auto update = [&](int64_t lo, int64_t hi, const std::vector<Tensor>& states) {
    // offload_param nvme: the sub-group's parameters are the tier's state 0.
    const Tensor p = params_in_tier_ ? states[0] : params.view(lo, {hi - lo});
    // The gradient shard in the tier: its last state (read-only there).
    const Tensor g = grads_in_tier_ && tier ? states.back() : grads.view(lo, {hi - lo});
    const std::vector<Tensor> opt_states(states.begin() + tier_state_offset(),
                                         states.end() - (grads_in_tier_ && tier ? 1 : 0));
    DS_CHECK(opt.step_part(lo, hi, {.params = p, .grads = g, .params_lowp = Tensor(),
                                    .states = opt_states},
                           h, grad_scale),
             "offload_optimizer nvme: optimizer {} does not update a range in parts", opt.type());
  };
  if (tier)
    tier->for_each(update, true);
  else
    update(0, n, {});  // an optimizer without state (SGD without momentum)
}

void ZeroOptimizer::set_timeline(Timeline* t) {
  timeline_ = t;
  if (store_) store_->set_timeline(t);
}

void ZeroOptimizer::begin_last_micro_batch() {
  if (!overlap_ || gradients_stay_local()) return;
  DS_CHECK(pending_.empty(), "gradient reductions of the previous step still pending");
  armed_ = true;
  std::fill(unit_ready_.begin(), unit_ready_.end(), 0);
  next_bucket_ = static_cast<int>(buckets_.size()) - 1;
}

void ZeroOptimizer::abandon_step() {
  for (CommHandle& h : pending_) h.wait();
  pending_.clear();
  armed_ = false;
}

void ZeroOptimizer::set_expert_reduce(std::vector<Range> ranges, Communicator* dense_dp) {
  DS_CHECK(std::is_sorted(ranges.begin(), ranges.end(),
                          [](const Range& a, const Range& b) { return a.end <= b.begin; }),
           "expert ranges are not sorted and disjoint");
  DS_CHECK(!store_ || grouped(), "expert parallelism at ZeRO stage {} without sharding groups", z_.stage);
  experts_apart_ = true;
  expert_ranges_ = std::move(ranges);
  dense_dp_ = dense_dp;
}

template <class Fn>
void ZeroOptimizer::for_each_group_piece(Range r, Fn fn) const {
  int64_t at = r.begin;
  for (const Range& e : expert_ranges_) {
    if (e.end <= at) continue;
    if (e.begin >= r.end) break;
    if (e.begin > at) fn(Range{at, e.begin}, false);
    const int64_t end = std::min(e.end, r.end);
    fn(Range{std::max(at, e.begin), end}, true);
    at = end;
  }
  if (at < r.end) fn(Range{at, r.end}, false);
}

void ZeroOptimizer::all_reduce_range(Range r, std::vector<CommHandle>* async) {
  Tensor g = model_.grads();
  for_each_group_piece(r, [&](Range piece, bool expert) {
    Communicator* c = expert ? dp_ : dense_dp_;
    if (!c || c->size() == 1) return;
    const Tensor v = g.view(piece.begin, {piece.size()});
    if (async)
      async->push_back(c->iall_reduce(v));
    else
      c->all_reduce(v);
  });
}

// Issues bucket `b`'s all-reduce (asynchronous; the timeline gets its times).
void ZeroOptimizer::issue_bucket(int b) {
  if (experts_apart_) return all_reduce_range(buckets_[b], &pending_);  // expert parallelism: one per group piece
  Tensor g = model_.grads().view(buckets_[b].begin, {buckets_[b].size()});
  if (!timeline_ || !timeline_->enabled()) {
    pending_.push_back(dp_->iall_reduce(g));
    return;
  }
  Timeline* tl = timeline_;
  Communicator* dp = dp_;
  const double issued = tl->now_us();
  pending_.push_back(dp->submit(
      "all_reduce",
      [tl, dp, g, b, issued] {
        const double t0 = tl->now_us();
        dp->all_reduce(g);
        tl->add({fmt::format("all_reduce bucket {}", b), "comm", 1, issued, t0, tl->now_us()});
      },
      {g}));
}

void ZeroOptimizer::on_grads(int unit, bool ready) {
  if (timeline_ && timeline_->enabled()) {
    if (!ready) {
      unit_begin_us_[unit] = timeline_->now_us();
    } else {
      const double t = unit_begin_us_[unit];
      timeline_->add({fmt::format("backward unit {}", unit), "compute", 0, t, t, timeline_->now_us()});
    }
  }
  if (!armed_ || !ready) return;
  if (std::find(held_units_.begin(), held_units_.end(), unit) != held_units_.end()) return;
  unit_ready_[unit] = 1;
  while (next_bucket_ >= 0) {
    bool complete = true;
    for (int u : bucket_units_[next_bucket_]) complete = complete && unit_ready_[u];
    if (!complete) break;
    issue_bucket(next_bucket_--);
  }
}

void ZeroOptimizer::set_norm_counted(std::vector<Range> counted) {
  counted_only_ = true;
  counted_ = std::move(counted);
}

void ZeroOptimizer::zero_grads() {
  if (store_)
    store_->zero_grads();
  else
    model_.grads().zero_();
}

// Gradient collectives: on the GPU the bucket all-reduces use the
// asynchronous forms, so the compute stream, not the host, waits for them
// (the same NCCL operations; the caller polls before it reads anything back).
void ZeroOptimizer::reduce_gradients_into(const Tensor& sumsq) {
  if (store_) {
    store_->finish_reductions();  // reduce-scattered during the backward pass
    if (grouped()) return group_norm_share(sumsq);  // each group reduce-scattered over its own ranks
  } else if (armed_) {  // overlap: what the backward did not issue, then wait for all
    while (next_bucket_ >= 0) issue_bucket(next_bucket_--);
    for (CommHandle& h : pending_) h.wait();
    pending_.clear();
    armed_ = false;
  } else if (gradients_stay_local()) {
    // 1-bit Adam after its warm-up: no all-reduce; the norm below is rank 0's own gradients'.
  } else if (experts_apart_) {
    Tensor g = model_.grads();
    std::vector<CommHandle> hs;
    for (const Range& b : make_buckets(part_.total, z_.reduce_bucket_size))
      all_reduce_range(b, g.device().is_cpu() ? nullptr : &hs);
    for (CommHandle& h : hs) h.wait();
  } else if (part_.dp > 1) {
    Tensor g = model_.grads();
    std::vector<CommHandle> hs;
    for (const Range& b : make_buckets(part_.total, z_.reduce_bucket_size)) {
      if (g.device().is_cpu())
        dp_->all_reduce(g.view(b.begin, {b.size()}));
      else
        hs.push_back(dp_->iall_reduce(g.view(b.begin, {b.size()})));
    }
    for (CommHandle& h : hs) h.wait();
  }
  if (experts_apart_) return expert_norm_share(sumsq);
  // Stages 0/1: the data-parallel ranks hold identical sums; one counts them.
  if (!store_ && rank_ != 0) return;
  add_own_sumsq(sumsq);
}

void ZeroOptimizer::local_norm_into(const Tensor& sumsq) {
  DS_CHECK(!store_ && !experts_apart_, "local gradient norms are for stage 0 without expert parallelism");
  add_own_sumsq(sumsq);
}

void ZeroOptimizer::add_own_sumsq(const Tensor& sumsq) {
  if (store_ && z_.stage == 3) return add_shard_sumsq(sumsq);
  Tensor g = store_ ? store_->grad_shard() : model_.grads();
  if (!counted_only_) {
    if (g.numel() > 0) ops::sum_squares({.out = sumsq, .x = g}, Stream{});
    return;
  }
  const int64_t base = store_ ? part_.owned_real(rank_).begin : 0;
  for (const Range& r : counted_) {
    const int64_t b = std::max(r.begin, base), e = std::min(r.end, base + g.numel());
    if (e > b) ops::sum_squares({.out = sumsq, .x = g.view(b - base, {e - b})}, Stream{});
  }
}

// Stage 3 sums the squares of its gradient shard in windows of at most
// kNormWindow elements of each unit's piece, in unit order (the counted parts
// of each under tp), whether the shard is in memory or in the NVMe tier, so
// both give the same bits: the tier is read one window at a time into a
// scratch buffer, which the NaN/Inf check (fp16) then reuses.
void ZeroOptimizer::add_shard_sumsq(const Tensor& sumsq) {
  constexpr int64_t kNormWindow = int64_t{1} << 20;
  NvmeStateTier* tier = grads_in_tier_ ? store_->grad_tier() : nullptr;
  const Tensor g = grads_in_tier_ ? Tensor() : store_->grad_shard();
  const int64_t base = part_.owned_real(rank_).begin;
  if (grads_in_tier_) {
    tier_grads_nonfinite_ = Tensor::zeros({1}, DType::F32);
    if (tier && !norm_window_.defined()) norm_window_ = Tensor::empty({kNormWindow}, DType::F32);
  }
  for (const Range& piece : store_->own_unit_pieces()) {
    for (int64_t at = piece.begin; at < piece.end; at += kNormWindow) {
      const int64_t n = std::min(kNormWindow, piece.end - at);
      Tensor x;
      if (tier) {
        x = norm_window_.view(0, {n});
        tier->read(store_->grad_state(), at, at + n, x.data<float>());
        ops::nonfinite_check({.flag = tier_grads_nonfinite_, .x = x}, Stream{});
      } else {
        x = g.view(at, {n});
      }
      if (!counted_only_) {
        ops::sum_squares({.out = sumsq, .x = x}, Stream{});
        continue;
      }
      for (const Range& r : counted_) {
        const int64_t b = std::max(r.begin, base + at), e = std::min(r.end, base + at + n);
        if (e > b) ops::sum_squares({.out = sumsq, .x = x.view(b - base - at, {e - b})}, Stream{});
      }
    }
  }
}

// Stages 0/1 (every rank holds its summed gradients whole): each expert
// counts once, on the first rank of its expert-data-parallel group; each
// dense weight once, on the first data-parallel rank.
void ZeroOptimizer::expert_norm_share(const Tensor& sumsq) {
  const bool dense = !dense_dp_ || dense_dp_->rank() == 0;
  const bool experts = rank_ == 0;
  if (!dense && !experts) return;
  const Tensor g = model_.grads();
  const std::vector<Range> all{{0, part_.total}};
  for (const Range& r : counted_only_ ? counted_ : all) {
    if (r.size() <= 0) continue;
    for_each_group_piece(r, [&](Range piece, bool expert) {
      if ((expert ? experts : dense) && piece.size() > 0)
        ops::sum_squares({.out = sumsq, .x = g.view(piece.begin, {piece.size()})}, Stream{});
    });
  }
}

void ZeroOptimizer::grads_nonfinite_into(const Tensor& flag) {
  if (store_ && grouped()) {
    for (size_t i = 0; i < groups_.size(); ++i) {
      const Tensor g = store_->grad_shard(i);
      if (g.numel() > 0) ops::nonfinite_check({.flag = flag, .x = g}, Stream{});
    }
    return;
  }
  if (grads_in_tier_) {  // found by the norm's pass over the tier (add_shard_sumsq)
    DS_CHECK(tier_grads_nonfinite_.defined(), "ZeRO-3: the gradient tier's NaN/Inf check before its norm pass");
    if (tier_grads_nonfinite_.data<float>()[0] != 0.f) flag.data<float>()[0] = 1.f;
    return;
  }
  Tensor g = store_ ? store_->grad_shard() : model_.grads().view(0, {model_.layout().total});
  if (g.numel() > 0) ops::nonfinite_check({.flag = flag, .x = g}, Stream{});
}

// ZeRO-1: each group's owned pieces are packed (gradients; in fp32 the
// weights themselves), updated by the group's optimizer and written back;
// the gather_owned after it all-gathers every group over its ranks. ZeRO-2:
// the store keeps each group's gradient (and, mixed, master) shard packed
// already; fp32 weights are packed as for ZeRO-1. ZeRO-3: the store's
// parameter shards are the masters. The update is element-wise
// per element as with one group, so the values are the same; only which
// rank computes them moves.
void ZeroOptimizer::step_groups(const StepHyper& h, float grad_scale) {
  const bool mixed = model_.compute_dtype() != DType::F32;
  const Device dev = model_.device();
  for (size_t i = 0; i < groups_.size(); ++i) {
    GroupOpt& o = groups_[i];
    const int64_t n = o.owned.size();
    if (n == 0) {
      o.opt->step_empty_range();
      continue;
    }
    auto packed = [&](const Tensor& flat_buf) {
      Tensor t = Tensor::empty({n}, flat_buf.dtype(), dev);
      pack_pieces(o.pieces, flat_buf, 0, t, o.owned.begin);
      return t;
    };
    auto unpack = [&](const Tensor& t, const Tensor& flat_buf) { unpack_pieces(o.pieces, t, o.owned.begin, flat_buf, 0); };
    const Tensor g = store_ ? store_->grad_shard(i) : packed(model_.grads());
    if (nvme_) {  // stage 3: the store's parameter shard (or the tier's state 0)
      step_through_tier(*o.opt, o.tier.get(), store_->master_params(i), g, n, h, grad_scale);
    } else if (store_ && (mixed || z_.stage == 3)) {  // the store's master (stage 3: parameter) shard
      o.opt->step({.params = store_->master_params(i), .grads = g}, h, grad_scale);
    } else if (mixed) {
      const Tensor lowp = Tensor::empty({n}, model_.compute_dtype(), dev);
      o.opt->step({.params = model_.flat_store().group_master(i), .grads = g, .params_lowp = lowp}, h, grad_scale);
      unpack(lowp, model_.compute_params());
    } else {
      const Tensor w = store_ ? store_->full_params() : model_.flat_store().params();
      const Tensor p = packed(w);
      o.opt->step({.params = p, .grads = g}, h, grad_scale);
      unpack(p, w);
    }
  }
  if (store_)
    store_->after_step();
  else
    model_.flat_store().gather_owned();
}

// Sharding groups: each group's gradient shard (or, ZeRO-1, the full
// gradients' owned pieces) counts the pieces this rank owns, within the
// counted ranges under tp / pp. Every element of a group is owned by one
// rank of its group, so each counts once.
void ZeroOptimizer::group_norm_share(const Tensor& sumsq) {
  const std::vector<Range> all{{0, model_.layout().total}};
  for (size_t i = 0; i < groups_.size(); ++i) {
    const GroupOpt& o = groups_[i];
    const Tensor shard = store_ ? store_->grad_shard(i) : Tensor();
    for (const GroupSpace::Piece& q : o.pieces)
      for (const Range& c : counted_only_ ? counted_ : all) {
        const int64_t b = std::max(c.begin, q.flat.begin), e = std::min(c.end, q.flat.end);
        if (e <= b) continue;
        const Tensor x = store_ ? shard.view(q.at - o.owned.begin + (b - q.flat.begin), {e - b})
                                : model_.grads().view(b, {e - b});
        ops::sum_squares({.out = sumsq, .x = x}, Stream{});
      }
  }
}

void ZeroOptimizer::step(const StepHyper& h, float grad_scale) {
  if (grouped()) return step_groups(h, grad_scale);
  if (range_.size() > 0) {
    Tensor p = master_range();
    Tensor g = grads_in_tier_ ? Tensor()  // read per sub-group from the tier
               : store_       ? store_->grad_shard()
                              : model_.grads().view(range_.begin, {range_.size()});
    if (offload_ && !offload_pipe_)
      offload_pipe_ = std::make_unique<OffloadPipeline>(make_offload_copier(model_.device()), offload_bucket(z_),
                                                        z_.offload_pin_memory);
    if (offload_ && tier_) {  // a GPU model, the state on NVMe: sub-group by sub-group through host buffers
      using At = OffloadPipeline::ParamsAt;
      const At at = params_in_tier_ ? At::Tier : store_->params_on_host() ? At::Host : At::Device;
      offload_pipe_->step_tier(*opt_, *tier_, at, p, g, h, grad_scale);
    } else if (nvme_ && !offload_) {
      step_through_tier(*opt_, tier_.get(), p, g, range_.size(), h, grad_scale);
    } else if (offload_) {  // bucket by bucket, copies overlapping the CPU update (offload_pipeline.h)
      // offload_param cpu: the parameter shard on the host is the master the update writes.
      if (!host_master_.defined()) host_master_ = store_ && store_->params_on_host() ? p : offload_pipe_->host_copy(p);
      offload_pipe_->step(*opt_, p, g, host_master_, h, grad_scale);
    } else {
      const Tensor lowp = fused_lowp_ ? model_.compute_params().view(range_.begin, {range_.size()}) : Tensor();
      opt_->step({.params = p, .grads = g, .params_lowp = lowp}, h, grad_scale);
    }
  } else {
    opt_->step_empty_range();
  }
  after_update();
}

void ZeroOptimizer::step_gated(const StepHyper& h, const Tensor& scalars) {
  DS_CHECK(!grouped(), "ZeroOptimizer::step_gated with several sharding groups");
  DS_CHECK(!offload_, "ZeroOptimizer::step_gated with offload_optimizer (the update runs on the host)");
  DS_CHECK(opt_->has_gated_step(), "optimizer {} has no device-gated step", opt_->type());
  if (range_.size() > 0) {
    Tensor g = store_ ? store_->grad_shard() : model_.grads().view(range_.begin, {range_.size()});
    const Tensor lowp = fused_lowp_ ? model_.compute_params().view(range_.begin, {range_.size()}) : Tensor();
    opt_->step_gated({.params = master_range(), .grads = g, .params_lowp = lowp}, h, scalars);
  }
  // A skipped step leaves the master weights as they were, so this rewrites
  // the same values.
  after_update();
}

void ZeroOptimizer::after_update() {
  if (store_) {
    store_->after_step();
  } else {
    if (model_.compute_dtype() != DType::F32 && !fused_lowp_)
      model_.store().params_updated();  // casts the updated master range (ZeRO-1: and all-gathers)
    else if (z_.stage == 1 && part_.dp > 1)
      model_.flat_store().gather_owned();  // asynchronous with overlap_param_gather
  }
}

Tensor ZeroOptimizer::master_range() {
  if (range_.size() == 0) return Tensor();
  return store_ ? store_->master_params() : model_.flat_store().master(range_);
}

std::vector<Tensor> ZeroOptimizer::master_ranges() {
  if (!grouped()) return {master_range()};
  std::vector<Tensor> out;
  const bool mixed = model_.compute_dtype() != DType::F32;
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (mixed || (store_ && z_.stage == 3)) {
      out.push_back(store_ ? store_->master_params(i) : model_.flat_store().group_master(i));
      continue;
    }
    const Tensor w = store_ ? store_->full_params() : model_.flat_store().params();
    for (const GroupSpace::Piece& q : groups_[i].pieces)  // fp32: the weights' owned pieces
      out.push_back(w.view(q.flat.begin, {q.flat.size()}));
  }
  return out;
}

std::vector<Tensor> ZeroOptimizer::optimizer_states() {
  if (!grouped()) return opt_->states();
  std::vector<Tensor> out;
  for (const GroupOpt& o : groups_)
    for (const Tensor& t : o.opt->states()) out.push_back(t);
  return out;
}

void ZeroOptimizer::set_step_count(int64_t n) {
  if (!grouped()) return opt_->set_step_count(n);
  for (GroupOpt& o : groups_) o.opt->set_step_count(n);
}

void ZeroOptimizer::count_step() {
  if (!grouped()) return opt_->count_step();
  for (GroupOpt& o : groups_) o.opt->count_step();
}

std::vector<ZeroOptimizer::StatePart> ZeroOptimizer::state_parts() {
  if (!grouped())
    return {StatePart{.group = "", .ep_shared = false, .pieces = {range_}, .opt = opt_.get(), .tier = tier_.get()}};
  std::vector<StatePart> out;
  for (GroupOpt& o : groups_) {
    StatePart p{.group = o.g.name, .ep_shared = o.g.ep_shared, .pieces = {}, .opt = o.opt.get(), .tier = o.tier.get()};
    for (const GroupSpace::Piece& q : o.pieces) p.pieces.push_back(q.flat);
    out.push_back(std::move(p));
  }
  return out;
}

int64_t ZeroOptimizer::offload_host_bytes() const {
  int64_t b = 0;
  for (const NvmeStateTier* t : nvme_tiers()) b += t->host_bytes();
  if (offload_ && tier_)  // a GPU model's step through the tier: its gradient (and master) buffers
    b += OffloadPipeline::tier_host_bytes_for(range_.size(), tier_->sub_group(),
                                              !params_in_tier_ && !store_->params_on_host());
  else if (offload_)  // the host master copy (none with offload_param cpu) and the gradient buckets
    b += OffloadPipeline::host_bytes_for(range_.size(), offload_bucket(z_), !(store_ && store_->params_on_host()));
  return b;
}

std::vector<NvmeStateTier*> ZeroOptimizer::nvme_tiers() const {
  std::vector<NvmeStateTier*> out;
  if (tier_) out.push_back(tier_.get());
  for (const GroupOpt& o : groups_)
    if (o.tier) out.push_back(o.tier.get());
  return out;
}

bool ZeroOptimizer::offloaded_state_nonfinite() {
  Tensor flag = Tensor::zeros({1}, DType::F32);
  for (NvmeStateTier* tier : nvme_tiers())
    tier->for_each(
        [&](int64_t, int64_t, const std::vector<Tensor>& states) {
          // (not the gradient shard: a skipped fp16 step leaves NaN/Inf there by design)
          const size_t n = states.size() - (grads_in_tier_ && tier == tier_.get() ? 1 : 0);
          for (size_t i = 0; i < n; ++i) ops::nonfinite_check({.flag = flag, .x = states[i]}, Stream{});
        },
        false);
  return flag.data<float>()[0] != 0.f;
}

ModelStateBytes ZeroOptimizer::model_state_bytes() const {
  ModelStateBytes b;
  FlatParamStore* flat = store_ ? nullptr : &model_.flat_store();
  b.params = store_ ? store_->param_bytes() : flat->param_bytes();
  b.grads = store_ ? store_->grad_bytes() : flat->grad_bytes();
  // Offloaded optimizer state is host memory: not part of the device model state.
  b.optimizer = offload_ || !opt_ ? 0 : opt_->state_bytes();
  for (const GroupOpt& o : groups_) b.optimizer += o.opt->state_bytes();
  return b;
}

}  // namespace ds
