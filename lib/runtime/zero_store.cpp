// ZeRO-2/3 parameter store: per-unit gradient reduce-scatter into a shard,
// per-unit parameter gathers with prefetch (stage 3). See zero_store.h.
#include "lib/runtime/zero_store.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/ops/ops.h"
#include "lib/optim/adamw.h"

namespace ds {

ZeroParamStore::ZeroParamStore(const ModelLayout& layout, int num_layers, Device dev, Communicator* dp,
                               const ZeroConfig& z, const ZeroPartition& part, DType compute, DType grad,
                               std::vector<ShardGroup> groups)
    : sgroups_(std::move(groups)), z_(z), part_(part), stage_(z.stage), dev_(dev),
      param_dev_(z.stage == 3 && z.offload_param != OffloadDevice::None ? Device::cpu() : dev),
      compute_dtype_(compute) {
  DS_CHECK(grad == DType::F32 || grad == compute, "gradients in {} with compute dtype {}", dtype_name(grad),
           dtype_name(compute));
  DS_CHECK(stage_ == 2 || stage_ == 3, "ZeroParamStore is for ZeRO stages 2 and 3, got {}", stage_);
  DS_CHECK(part.total == layout.total, "partition of {} elements for a model of {}", part.total, layout.total);
  if (sgroups_.empty())
    sgroups_.push_back(ShardGroup{.name = "", .ep_shared = false, .dp = dp, .space = GroupSpace::identity(layout.total),
                                  .part = part});
  units_ = unit_ranges(layout, num_layers);
  gathered_.resize(units_.size());
  in_flight_.resize(units_.size());
  unit_grads_.resize(units_.size());
  deferred_.resize(units_.size());
  g_.resize(sgroups_.size());
  unit_reduced_.assign(units_.size(), 0);
  // ZeRO-Infinity: with the optimizer state on NVMe the gradient shard goes
  // to the same swap file (set_grad_tier; zero_config.h says when).
  grad_elsewhere_ =
      grads_in_nvme_tier(z, grad == DType::F32, static_cast<int>(sgroups_.size()), dev.is_cpu());
  int64_t covered = 0;
  for (size_t i = 0; i < sgroups_.size(); ++i) {
    const ShardGroup& sg = sgroups_[i];
    DS_CHECK(sg.part.total == sg.space.total(), "sharding group '{}': partition of {} for a space of {}", sg.name,
             sg.part.total, sg.space.total());
    covered += sg.space.total();
    Group& g = g_[i];
    g.rank = sg.rank();
    for (const Range& u : units_) {  // a unit's elements are one range of every group's space
      const std::vector<GroupSpace::Piece> in = sg.space.within(u);
      Range span{0, 0};
      if (!in.empty()) span = {in.front().at, in.back().at + in.back().flat.size()};
      int64_t n = 0;
      for (const GroupSpace::Piece& q : in) n += q.flat.size();
      DS_CHECK(n == span.size(), "sharding group '{}': a unit's elements are not contiguous in its space", sg.name);
      g.unit_span.push_back(span);
    }
    MemTagScope tag(MemTag::Grads);
    if (!grad_elsewhere_) g.gshard = Tensor::zeros({sg.part.shard}, grad, dev);
  }
  DS_CHECK(covered == layout.total, "the sharding groups cover {} of the model's {} elements", covered, layout.total);
  MemTagScope tag(MemTag::Params);
  if (stage_ == 2) {
    if (compute == DType::F32) {
      full_ = Tensor::zeros({part.total}, DType::F32, dev);
    } else {  // the f32 master only for this rank's shard of each group (DeepSpeed's layout)
      compute_ = Tensor::zeros({part.total}, compute, dev);
      for (size_t i = 0; i < g_.size(); ++i) g_[i].master = Tensor::zeros({sgroups_[i].part.shard}, DType::F32, dev);
    }
    return;
  }
  // offload_param nvme: the shard lives in the optimizer's swap file
  // (set_param_tier), never in memory; cpu: in host memory (a GPU model's
  // gathers copy the pieces up; on the CPU backend that is where it is).
  param_elsewhere_ = z.offload_param == OffloadDevice::NVMe;
  param_tiers_.assign(g_.size(), nullptr);
  if (!param_elsewhere_)
    for (size_t i = 0; i < g_.size(); ++i) {
      if (params_on_host() && z.param_pin_memory) {  // page-locked through the offload copier
        if (!pinner_) pinner_ = make_offload_copier(dev);
        g_[i].shard = pinner_->host_buffer(sgroups_[i].part.shard, true);
        g_[i].shard.zero_();
      } else {
        g_[i].shard = Tensor::zeros({sgroups_[i].part.shard}, DType::F32, param_dev_);
      }
    }
  // The persistent units below are gathered copies (reported with the
  // ZeRO-3 plan, not as model state).
  MemTagScope untagged(MemTag::None);
  plan_ = make_zero3_plan(units_, z.stage3_prefetch_bucket_size, z.stage3_max_live_parameters,
                          z.stage3_param_persistence_threshold);
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u]) {
      gathered_[u] = Tensor::zeros({units_[u].size()}, compute, dev);
      live_params_ += units_[u].size();
    }
  peak_params_ = live_params_;
}

Range ZeroParamStore::piece(int unit, int rank, size_t gi) const {
  const Range& u = g_[gi].unit_span[static_cast<size_t>(unit)];
  Range own = sgroups_[gi].part.owned(rank);
  Range r{std::max(u.begin, own.begin), std::min(u.end, own.end)};
  return r.begin < r.end ? r : Range{0, 0};
}

void ZeroParamStore::pack_unit(size_t gi, int unit, Range q, const Tensor& u, const Tensor& dst) const {
  const int64_t ub = units_[static_cast<size_t>(unit)].begin;
  for (const GroupSpace::Piece& p : sgroups_[gi].space.pieces(q)) {
    const Tensor src = u.view(p.flat.begin - ub, {p.flat.size()});
    const Tensor d = dst.view(p.at - q.begin, {p.flat.size()});
    if (d.dtype() == src.dtype())
      Tensor(d).copy_from(src);
    else  // compute-dtype accumulation: the reduction runs in that dtype
      ops::cast({.out = d, .inp = src}, Stream{});
  }
}

void ZeroParamStore::wait_gathers() {
  for (Group& g : g_) g.gather.wait_all();
}

int64_t ZeroParamStore::persistent_elems() const {
  int64_t n = 0;
  for (size_t u = 0; u < units_.size() && stage_ == 3; ++u)
    if (plan_.persistent[u]) n += units_[u].size();
  return n;
}

void ZeroParamStore::unpack_unit(size_t gi, int unit, Range q, const Tensor& src, const Tensor& u) const {
  unpack_pieces(sgroups_[gi].space.pieces(q), src, q.begin, u, units_[static_cast<size_t>(unit)].begin);
}

// The unit's full parameters into `out` (unit size): for each group, each
// owner broadcasts its piece (straight into place when the piece is one flat
// range, else through a packed buffer).
void ZeroParamStore::gather_unit(int unit, const Tensor& out) {
  const int64_t ub = units_[unit].begin;
  for (size_t gi = 0; gi < g_.size(); ++gi) {
    const ShardGroup& sg = sgroups_[gi];
    const Group& G = g_[gi];
    const int dp = sg.part.dp;
    for (int r = 0; r < dp; ++r) {
      const Range p = piece(unit, r, gi);
      if (p.size() == 0) continue;
      const std::vector<GroupSpace::Piece> flat = sg.space.pieces(p);
      const bool direct = flat.size() == 1;
      Tensor dst = direct ? out.view(flat[0].flat.begin - ub, {p.size()}) : Tensor::empty({p.size()}, DType::F32, dev_);
      if (r == G.rank) read_own(gi, p.begin - G.rank * sg.part.shard, dst);
      if (dp > 1) sg.dp->broadcast(dst, r);
      if (!direct) unpack_unit(gi, unit, p, dst, out);
    }
  }
}

void ZeroParamStore::gather_unit_compute(int unit, const Tensor& out) {
  if (compute_dtype_ == DType::F32) return gather_unit(unit, out);
  Tensor f = Tensor::empty({units_[unit].size()}, DType::F32, dev_);
  gather_unit(unit, f);
  if (f.numel() > 0) ops::cast({.out = out, .inp = f}, Stream{});
}

// Stage 2, mixed precision: the compute copy of this rank's range is cast
// from its master shard, then the compute copy is all-gathered (in the compute
// dtype: half the bytes of gathering f32, and the same bits as casting after).
void ZeroParamStore::refresh_compute() {
  for (size_t i = 0; i < g_.size(); ++i) {
    const Range own = sgroups_[i].owned();
    for (const GroupSpace::Piece& q : sgroups_[i].space.pieces(own))
      ops::cast({.out = compute_.view(q.flat.begin, {q.flat.size()}),
                 .inp = g_[i].master.view(q.at - own.begin, {q.flat.size()})},
                Stream{});
  }
  gather_params(compute_);
}

void ZeroParamStore::gather_params(const Tensor& buf) {
  for (size_t i = 0; i < g_.size(); ++i) {
    const ShardGroup& sg = sgroups_[i];
    if (sg.part.dp == 1) continue;
    const GroupSpace* space = &sg.space;
    if (z_.overlap_param_gather)
      g_[i].gather.start(*sg.dp, sg.part, buf, z_.allgather_bucket_size, space);
    else
      all_gather_flat(*sg.dp, sg.part, buf, z_.allgather_bucket_size, space);
  }
}

// Issues the unit's gather asynchronously (one broadcast per owning rank, in
// rank order, on the group's communication thread or stream); complete()
// waits for it and casts to the compute dtype. Without overlap_comm the
// gather is completed at once.
void ZeroParamStore::fetch(int unit) {
  if (gathered_[unit].defined()) return;
  Tensor buf = Tensor::empty({units_[unit].size()}, compute_dtype_, dev_);
  InFlight& g = in_flight_[unit];
  g.f32 = compute_dtype_ == DType::F32 ? buf : Tensor::empty({units_[unit].size()}, DType::F32, dev_);
  const int64_t ub = units_[unit].begin;
  const bool timed = timeline_ && timeline_->enabled();
  const double issued = timed ? timeline_->now_us() : 0;
  for (size_t gi = 0; gi < g_.size(); ++gi) {
    const ShardGroup& sg = sgroups_[gi];
    const Group& G = g_[gi];
    for (int r = 0; r < sg.part.dp; ++r) {
      Range p = piece(unit, r, gi);
      if (p.size() == 0) continue;
      const std::vector<GroupSpace::Piece> flat = sg.space.pieces(p);
      Tensor dst;
      if (flat.size() == 1) {
        dst = g.f32.view(flat[0].flat.begin - ub, {p.size()});
      } else {
        dst = Tensor::empty({p.size()}, DType::F32, dev_);
        g.packed.push_back({gi, p, dst});
      }
      if (r == G.rank) read_own(gi, p.begin - G.rank * sg.part.shard, dst);
      if (sg.part.dp == 1) continue;
      Communicator* c = sg.dp;
      if (timed) {
        Timeline* tl = timeline_;
        g.hs.push_back(c->submit("broadcast", [tl, c, dst, r, unit, issued] {
          const double t0 = tl->now_us();
          c->broadcast(dst, r);
          tl->add({fmt::format("gather unit {} from rank {}", unit, r), "comm", 1, issued, t0, tl->now_us()});
        }, {dst}));
      } else {
        g.hs.push_back(c->ibroadcast(dst, r));
      }
    }
  }
  g.pending = true;
  gathered_[unit] = buf;
  live_params_ += units_[unit].size();
  peak_params_ = std::max(peak_params_, live_params_);
  if (!z_.overlap_comm) complete(unit);
}

void ZeroParamStore::complete(int unit) {
  InFlight& g = in_flight_[unit];
  if (!g.pending) return;
  for (CommHandle& h : g.hs) h.wait();
  for (const InFlight::Packed& p : g.packed) unpack_unit(p.group, unit, p.q, p.buf, g.f32);
  if (compute_dtype_ != DType::F32 && g.f32.numel() > 0)
    ops::cast({.out = gathered_[unit], .inp = g.f32}, Stream{});
  g = InFlight{};
}

void ZeroParamStore::free_gathered(int unit) {
  if (!gathered_[unit].defined() || plan_.persistent[unit]) return;
  complete(unit);  // a prefetched unit nobody used: its gather still has to finish
  gathered_[unit] = Tensor();
  live_params_ -= units_[unit].size();
}

void ZeroParamStore::begin_pass(const std::vector<int>& order) {
  order_ = order;
  cursor_ = 0;
}

void ZeroParamStore::end_pass() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (stage_ == 3) free_gathered(static_cast<int>(u));
    DS_CHECK(!unit_grads_[u].defined(), "unit {}: gradient acquired but never marked ready", u);
  }
  order_.clear();
  cursor_ = 0;
}

// Is `unit` among the next max(1, depth) gathered units of the pass?
bool ZeroParamStore::needed_soon(int unit) const {
  int seen = 0;
  const int window = std::max(1, plan_.prefetch_depth);
  for (size_t j = cursor_; j < order_.size() && seen < window; ++j) {
    if (plan_.persistent[order_[j]]) continue;
    if (order_[j] == unit) return true;
    ++seen;
  }
  return false;
}

Tensor ZeroParamStore::acquire_params(int unit) {
  if (stage_ == 2) {
    for (Group& g : g_)
      if (g.gather.pending()) g.gather.wait(units_[unit]);  // this unit's chunks only
    return (compute_.defined() ? compute_ : full_).view(units_[unit].begin, {units_[unit].size()});
  }
  DS_CHECK(cursor_ < order_.size() && order_[cursor_] == unit,
           "ZeRO-3: unit {} acquired out of the pass order (position {})", unit, cursor_);
  ++cursor_;
  fetch(unit);
  // Prefetch: the next prefetch_depth gathered units of the pass are issued
  // now and gathered while this one computes.
  int ahead = 0;
  for (size_t j = cursor_; j < order_.size() && ahead < plan_.prefetch_depth; ++j) {
    if (plan_.persistent[order_[j]]) continue;
    fetch(order_[j]);
    ++ahead;
  }
  complete(unit);
  return gathered_[unit];
}

void ZeroParamStore::release_params(int unit) {
  if (stage_ == 2 || needed_soon(unit)) return;
  free_gathered(unit);
}

Tensor ZeroParamStore::acquire_grads(int unit) {
  DS_CHECK(!unit_grads_[unit].defined(), "unit {}: gradient acquired twice", unit);
  notify_grads(unit, false);
  if (deferred_[unit].defined()) return unit_grads_[unit] = deferred_[unit];
  unit_grads_[unit] = Tensor::zeros({units_[unit].size()}, DType::F32, dev_);
  live_grads_ += units_[unit].size();
  peak_grads_ = std::max(peak_grads_, live_grads_);
  return unit_grads_[unit];
}

void ZeroParamStore::grads_ready(int unit) {
  DS_CHECK(unit_grads_[unit].defined(), "unit {}: gradient ready but never acquired", unit);
  notify_grads(unit, true);
  if (deferred_[unit].defined()) {
    unit_grads_[unit] = Tensor();
    return;
  }
  reduce_unit(unit, unit_grads_[unit]);
  unit_grads_[unit] = Tensor();
  live_grads_ -= units_[unit].size();
}

// Sums the unit's gradient over the ranks and adds each rank's piece into its
// shard: reduce-scatters of dp equal slots (piece r padded to the largest
// piece), in rounds of at most reduce_bucket_size elements, issued
// asynchronously (see zero_store.h). With several sharding groups, once per
// group over its ranks, the pieces packed from the unit's gradient.
void ZeroParamStore::reduce_unit(int unit, const Tensor& g) {
  retire(false);
  for (size_t gi = 0; gi < g_.size(); ++gi) {
    Group& G = g_[gi];
    const ShardGroup& sg = sgroups_[gi];
    const int dp = sg.part.dp;
    const Range mine = piece(unit, G.rank, gi);
    const DType gt = grad_elsewhere_ ? DType::F32 : G.gshard.dtype();
    const int64_t base = G.rank * sg.part.shard;  // group-space position of the shard's first element
    const bool first = !unit_reduced_[unit];
    if (dp == 1) {
      if (mine.size() == 0) continue;
      Tensor src = Tensor::empty({mine.size()}, gt, dev_);
      pack_unit(gi, unit, mine, g, src);  // rounded to the accumulator's dtype, then added
      add_into_shard(gi, mine.begin - base, src, first);
      continue;
    }
    int64_t m = 0;
    for (int r = 0; r < dp; ++r) m = std::max(m, piece(unit, r, gi).size());
    const int64_t len = z_.reduce_bucket_size <= 0 ? m : std::max<int64_t>(1, z_.reduce_bucket_size / dp);
    for (int64_t off = 0; off < m; off += len) {
      const int64_t k = std::min(len, m - off);
      Tensor send = Tensor::zeros({dp * k}, gt, dev_);
      for (int r = 0; r < dp; ++r) {
        Range p = piece(unit, r, gi);
        const int64_t c = std::clamp<int64_t>(p.size() - off, 0, k);
        if (c <= 0) continue;
        pack_unit(gi, unit, {p.begin + off, p.begin + off + c}, g, send.view(r * k, {c}));
      }
      Tensor recv = Tensor::empty({k}, gt, dev_);
      PendingReduce pr;
      pr.recv = recv;
      pr.count = std::clamp<int64_t>(mine.size() - off, 0, k);
      pr.offset = mine.begin - base + off;
      pr.group = gi;
      pr.first = first;
      Communicator* c = sg.dp;
      if (timeline_ && timeline_->enabled()) {
        Timeline* tl = timeline_;
        const double issued = tl->now_us();
        pr.h = c->submit("reduce_scatter", [tl, c, send, recv, unit, issued] {
          const double t0 = tl->now_us();
          c->reduce_scatter(send, recv);
          tl->add({fmt::format("reduce_scatter unit {}", unit), "comm", 1, issued, t0, tl->now_us()});
        }, {send, recv});
      } else {
        pr.h = c->ireduce_scatter(send, recv);
      }
      pending_.push_back(std::move(pr));
    }
  }
  unit_reduced_[unit] = 1;
  if (!z_.overlap_comm) retire(true);
}

void ZeroParamStore::retire(bool all) {
  while (!pending_.empty() && (all || pending_.front().h.ready())) {
    PendingReduce& p = pending_.front();
    p.h.wait();
    if (p.count > 0) add_into_shard(p.group, p.offset, p.recv.view(0, {p.count}), p.first);
    pending_.pop_front();
  }
}

std::vector<Range> ZeroParamStore::own_unit_pieces() const {
  DS_CHECK(g_.size() == 1, "ZeRO: unit pieces of one sharding group, the store has {}", g_.size());
  const int64_t base = g_[0].rank * sgroups_[0].part.shard;
  std::vector<Range> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Range r = piece(static_cast<int>(u), g_[0].rank);
    if (r.size() > 0) out.push_back({r.begin - base, r.end - base});
  }
  return out;
}

void ZeroParamStore::set_grad_tier(NvmeStateTier* tier, int state) {
  DS_CHECK(grad_elsewhere_, "ZeRO: a gradient tier for a store that keeps its gradient shard");
  DS_CHECK(!tier || (state >= 0 && state < tier->n_states() && tier->numel() == sgroups_[0].owned().size()),
           "ZeRO: gradient tier state {} of a tier of {} elements for a shard of {}", state,
           tier ? tier->numel() : 0, sgroups_[0].owned().size());
  grad_tier_ = tier;
  grad_state_ = state;
}

// In memory: dst += src. In the tier: the same add on the piece read back (or
// on zeros, the first time since zero_grads, as the zeroed shard), then
// written, so the values are the in-memory ones bit for bit.
void ZeroParamStore::add_into_shard(size_t gi, int64_t offset, const Tensor& src, bool first) {
  const int64_t n = src.numel();
  if (!grad_elsewhere_) {
    Tensor dst = g_[gi].gshard.view(offset, {n});
    ops::add({.out = dst, .a = dst, .b = src}, Stream{});
    return;
  }
  DS_CHECK(grad_tier_, "ZeRO: a gradient reduction before the gradient tier is set");
  constexpr int64_t kWindow = int64_t{1} << 20;  // elements read, added and written at once (4 MiB)
  if (!grad_scratch_.defined()) grad_scratch_ = Tensor::empty({kWindow}, DType::F32, dev_);
  for (int64_t at = 0; at < n; at += kWindow) {  // element-wise: the windows change no value
    const int64_t k = std::min(kWindow, n - at);
    Tensor buf = grad_scratch_.view(0, {k});
    if (first)
      buf.zero_();
    else
      grad_tier_->read(grad_state_, offset + at, offset + at + k, buf.data<float>());
    ops::add({.out = buf, .a = buf, .b = src.view(at, {k})}, Stream{});
    grad_tier_->write(grad_state_, offset + at, offset + at + k, buf.data<float>());
  }
}

void ZeroParamStore::set_full_params(const Tensor& full) {
  DS_CHECK(full.numel() == part_.total, "set_full_params: {} elements, model has {}", full.numel(), part_.total);
  wait_gathers();
  if (stage_ == 2) {
    if (full_.defined()) {
      full_.copy_from(full);
      return;
    }
    for (size_t i = 0; i < g_.size(); ++i) {
      const Range own = sgroups_[i].owned();
      g_[i].master.zero_();
      pack_pieces(sgroups_[i].space.pieces(own), full, 0, g_[i].master, own.begin);
    }
    if (part_.total > 0) ops::cast({.out = compute_, .inp = full.device() == dev_ ? full : full.to(dev_)}, Stream{});
    return;
  }
  for (size_t i = 0; i < g_.size(); ++i) {
    const Range own = sgroups_[i].owned();
    Tensor shard = param_elsewhere_ ? Tensor::empty({own.size()}, DType::F32, Device::cpu()) : g_[i].shard;
    shard.zero_();
    pack_pieces(sgroups_[i].space.pieces(own), full, 0, shard, own.begin);
    if (param_elsewhere_) write_own(i, shard);
  }
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u] && units_[u].size() > 0) {
      const Tensor src = full.view(units_[u].begin, {units_[u].size()});
      if (compute_dtype_ == DType::F32) gathered_[u].copy_from(src);
      else
        ops::cast({.out = gathered_[u], .inp = src.device() == dev_ ? src : src.to(dev_)}, Stream{});
    }
}

void ZeroParamStore::init_params(int64_t total, const InitFill& fill) {
  DS_CHECK(total == part_.total, "init_params: {} elements, model has {}", total, part_.total);
  wait_gathers();
  Tensor staging;  // init_fill_into: chunk by chunk, never the rank's whole model on the host
  if (stage_ == 2 && full_.defined()) {  // fp32: the weights themselves
    init_fill_into(fill, {0, part_.total}, full_, staging);
    return;
  }
  // Stage 2 in mixed precision: each group's f32 master shard and the whole
  // compute copy; stage 3: each group's parameter shard and the persistent units.
  for (size_t i = 0; i < g_.size(); ++i) {
    const Range own = sgroups_[i].owned();
    if (stage_ == 3 && param_elsewhere_) {  // into the tier a bounded chunk at a time
      Tensor chunk;
      for (const GroupSpace::Piece& q : sgroups_[i].space.pieces(own))
        for (int64_t at = 0; at < q.flat.size(); at += kTierChunk) {
          const int64_t n = std::min(kTierChunk, q.flat.size() - at);
          if (chunk.numel() != n) chunk = Tensor::empty({n}, DType::F32, Device::cpu());
          init_fill_into(fill, {q.flat.begin + at, q.flat.begin + at + n}, chunk, staging);
          param_tiers_[i]->write(0, q.at - own.begin + at, q.at - own.begin + at + n, chunk.data<float>());
        }
      continue;
    }
    Tensor& dst = stage_ == 2 ? g_[i].master : g_[i].shard;
    dst.zero_();
    for (const GroupSpace::Piece& q : sgroups_[i].space.pieces(own))
      init_fill_into(fill, q.flat, dst.view(q.at - own.begin, {q.flat.size()}), staging);
  }
  if (stage_ == 2) {
    if (part_.total > 0) init_fill_into(fill, {0, part_.total}, compute_, staging);
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u] && units_[u].size() > 0) init_fill_into(fill, units_[u], gathered_[u], staging);
}

void ZeroParamStore::gather_f32(Range r, const Tensor& out) {
  wait_gathers();
  if (stage_ == 2 && full_.defined()) return Tensor(out).copy_from(full_.view(r.begin, {r.size()}));
  // Stage 2 in mixed precision keeps an f32 master shard per group, stage 3 a parameter shard.
  for (size_t i = 0; i < g_.size(); ++i) {
    const ShardGroup& sg = sgroups_[i];
    for (const GroupSpace::Piece& q : sg.space.within(r)) {
      const Range want{q.at, q.at + q.flat.size()};
      const Tensor dst = out.view(q.flat.begin - r.begin, {q.flat.size()});
      if (stage_ == 2)
        gather_from_shards(sg.dp, sg.part, g_[i].rank, g_[i].master, want, dst);
      else  // the parameter shard, in memory or in the tier (read_own)
        gather_from_shards(sg.dp, sg.part, g_[i].rank, want, dst,
                           [&](int64_t lo, const Tensor& d) { read_own(i, lo, d); });
    }
  }
}

void ZeroParamStore::get_full_params(const Tensor& out) {
  wait_gathers();
  if (stage_ == 2) {
    Tensor o = out;
    if (full_.defined()) {
      if (o.defined()) o.copy_from(full_);
      return;
    }
    // Mixed precision: the f32 masters are shards; gather them (collective).
    Tensor f = Tensor::zeros({part_.total}, DType::F32, dev_);
    for (size_t i = 0; i < g_.size(); ++i) {
      const ShardGroup& sg = sgroups_[i];
      const Range own = sg.owned();
      unpack_pieces(sg.space.pieces(own), g_[i].master, own.begin, f, 0);
      if (sg.part.dp > 1)
        all_gather_flat(*sg.dp, sg.part, f, z_.allgather_bucket_size, &sg.space);
    }
    if (o.defined()) o.copy_from(f);
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const Range& r = units_[u];
    Tensor buf = out.defined() ? out.view(r.begin, {r.size()}) : Tensor::empty({r.size()}, DType::F32, dev_);
    gather_unit(static_cast<int>(u), buf);
  }
}

Tensor ZeroParamStore::master_params(size_t g) {
  const Range own = sgroups_.at(g).owned();
  if (stage_ == 2) {
    if (full_.defined()) {
      DS_CHECK(sgroups_.size() == 1, "ZeRO-2 fp32 with sharding groups: the master is full_params' pieces");
      return full_.view(own.begin, {own.size()});
    }
    return g_[g].master.view(0, {own.size()});
  }
  if (param_elsewhere_) return Tensor();  // in the tier: the optimizer updates it there
  return g_[g].shard.view(0, {own.size()});
}

void ZeroParamStore::set_param_tier(size_t g, NvmeStateTier* tier) {
  DS_CHECK(param_elsewhere_ && stage_ == 3, "set_param_tier without offload_param nvme at stage 3");
  DS_CHECK(!tier || tier->numel() == sgroups_.at(g).owned().size(),
           "parameter tier of {} elements for a range of {}", tier ? tier->numel() : 0, sgroups_[g].owned().size());
  param_tiers_[g] = tier;
}

// This rank's shard elements [lo, lo + dst.numel()) (shard positions) into dst.
void ZeroParamStore::read_own(size_t gi, int64_t lo, const Tensor& dst) {
  if (!param_elsewhere_) return Tensor(dst).copy_from(g_[gi].shard.view(lo, {dst.numel()}));
  DS_CHECK(param_tiers_[gi] && dst.dtype() == DType::F32, "ZeRO-3: a parameter read before the tier is set");
  if (dst.device().is_cpu()) return param_tiers_[gi]->read(0, lo, lo + dst.numel(), Tensor(dst).data<float>());
  Tensor host = Tensor::empty({dst.numel()}, DType::F32, Device::cpu());  // a GPU model: through the host
  param_tiers_[gi]->read(0, lo, lo + dst.numel(), host.data<float>());
  Tensor(dst).copy_from(host);
}

void ZeroParamStore::write_own(size_t gi, const Tensor& shard) {
  const int64_t n = sgroups_[gi].owned().size();
  if (n == 0) return;
  DS_CHECK(param_tiers_[gi], "ZeRO-3: a parameter write before the tier is set");
  param_tiers_[gi]->write(0, 0, n, shard.data<float>());
}

Tensor ZeroParamStore::grad_shard(size_t g) {
  DS_CHECK(!grad_elsewhere_, "ZeRO: the gradient shard is in the NVMe tier");
  return g_.at(g).gshard.view(0, {sgroups_[g].owned().size()});
}

void ZeroParamStore::zero_grads() {
  DS_CHECK(pending_.empty(), "ZeRO: gradient reductions still pending when the next step zeroes the gradients");
  std::fill(unit_reduced_.begin(), unit_reduced_.end(), 0);
  for (Group& g : g_)
    if (g.gshard.defined()) g.gshard.zero_();
  for (Tensor& d : deferred_)
    if (d.defined()) d.zero_();
}

void ZeroParamStore::defer_unit(int unit) {
  if (!deferred_[unit].defined() && units_[unit].size() > 0)
    deferred_[unit] = Tensor::zeros({units_[unit].size()}, DType::F32, dev_);
}

void ZeroParamStore::flush_deferred() {
  for (size_t u = 0; u < deferred_.size(); ++u)
    if (deferred_[u].defined()) reduce_unit(static_cast<int>(u), deferred_[u]);
}

void ZeroParamStore::after_step() {
  if (stage_ == 2) {
    if (full_.defined()) {
      gather_params(full_);
    } else {
      refresh_compute();
    }
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u]) gather_unit_compute(static_cast<int>(u), gathered_[u]);
}

}  // namespace ds
