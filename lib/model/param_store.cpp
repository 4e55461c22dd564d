// Parameter units of a layout and the flat (unsharded) parameter store.
#include "lib/model/param_store.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/parallel/flat_gather.h"
#include "lib/ops/ops.h"

namespace ds {

std::vector<Range> unit_ranges(const ModelLayout& layout, int num_layers) {
  std::vector<Range> units(num_layers + 2, Range{-1, -1});
  for (const ParamSpec& p : layout.params) {
    const int u = unit_of(p);
    DS_CHECK(u >= 0 && u < num_layers + 2, "parameter '{}' has layer {} outside -1..{}", p.name, p.layer, num_layers);
    Range& r = units[u];
    if (r.begin < 0) r = {p.offset, p.offset};
    DS_CHECK(r.end == p.offset, "parameter '{}' is not contiguous with the rest of its unit {}", p.name, u);
    r.end = p.offset + p.numel;
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].begin < 0) {  // not on this pipeline stage: an empty unit where it would be
      const int64_t at = u == 0 ? 0 : units[u - 1].end;
      units[u] = {at, at};
    }
    DS_CHECK(u == 0 || units[u].begin == units[u - 1].end, "parameter units {} and {} are not adjacent", u - 1, u);
  }
  return units;
}

FlatParamStore::FlatParamStore(const ModelLayout& layout, int num_layers, Device dev, int64_t alloc_elems,
                               DType compute, FlatStoreOptions opts)
    : units_(unit_ranges(layout, num_layers)), total_(layout.total), opts_(opts) {
  DS_CHECK(opts.grad == DType::F32 || opts.grad == compute, "gradients in {} with compute dtype {}",
           dtype_name(opts.grad), dtype_name(compute));
  const int64_t n = std::max(alloc_elems, layout.total);
  groups_ = opts.groups;
  if (groups_.empty() && opts.dp)
    groups_.push_back(ShardGroup{.name = "", .ep_shared = false, .dp = opts.dp, .space = GroupSpace::identity(total_),
                                 .part = opts.part});
  int64_t covered = 0;
  for (const ShardGroup& g : groups_) {
    DS_CHECK(g.part.total == g.space.total() && g.part.dp == (g.dp ? g.dp->size() : 1),
             "sharding group '{}': partition of {} elements over {} ranks for a space of {} on {} ranks", g.name,
             g.part.total, g.part.dp, g.space.total(), g.dp ? g.dp->size() : 1);
    covered += g.space.total();
  }
  DS_CHECK(groups_.empty() || covered == total_, "the sharding groups cover {} of the model's {} elements", covered,
           total_);
  gather_.resize(groups_.size());
  // Mixed precision with sharding groups: the f32 master is each group's owned range.
  full_master_ = compute == DType::F32 || groups_.empty();
  int64_t held = 0;
  if (full_master_) {
    master_.push_back({{0, n}, 0});
    held = n;
  } else {
    for (const ShardGroup& g : groups_) {
      group_off_.push_back(held);
      for (GroupSpace::Piece q : g.space.pieces(g.owned())) {
        q.at = held + (q.at - g.owned().begin);
        master_.push_back(q);
      }
      held += g.owned().size();
    }
  }
  {
    MemTagScope tag(MemTag::Params);
    params_ = Tensor::zeros({held}, DType::F32, dev);
    if (compute != DType::F32) compute_ = Tensor::zeros({total_}, compute, dev);
  }
  MemTagScope tag(MemTag::Grads);
  if (!opts.forward_only) grads_ = Tensor::zeros({n}, opts.grad, dev);
  unit_f32_.resize(units_.size());
}

int64_t FlatParamStore::param_bytes() const {
  return static_cast<int64_t>(params_.nbytes() + (compute_.defined() ? compute_.nbytes() : 0));
}

void FlatParamStore::wait_gathers() {
  for (FlatGather& g : gather_) g.wait_all();
}

Tensor& FlatParamStore::params() {
  wait_gathers();
  DS_CHECK(full_master(), "FlatParamStore::params(): this rank keeps the f32 master of its owned ranges only");
  return params_;
}

Range FlatParamStore::master_range() const {
  DS_CHECK(master_.size() <= 1 && groups_.size() <= 1, "FlatParamStore::master_range with {} sharding groups",
           groups_.size());
  return master_.empty() ? Range{0, 0} : master_[0].flat;
}

Tensor FlatParamStore::master(Range r) {
  for (const GroupSpace::Piece& q : master_)
    if (q.flat.begin <= r.begin && r.end <= q.flat.end) return params_.view(q.at + r.begin - q.flat.begin, {r.size()});
  DS_CHECK(r.size() == 0, "master range [{}, {}) is not inside one owned piece", r.begin, r.end);
  return params_.view(0, {0});
}

Tensor FlatParamStore::group_master(size_t g) {
  DS_CHECK(!full_master() && g < groups_.size(), "FlatParamStore::group_master({}) without a sharded master", g);
  return params_.view(group_off_[g], {groups_[g].owned().size()});
}

Tensor& FlatParamStore::compute_params() {
  wait_gathers();
  return compute_;
}

void FlatParamStore::gather_owned() {
  DS_CHECK(gathers(), "FlatParamStore::gather_owned without a data-parallel group");
  const Tensor& buf = compute_.defined() ? compute_ : params_;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ShardGroup& g = groups_[i];
    if (g.part.dp == 1) continue;
    const GroupSpace* space = &g.space;
    const Tensor b = buf.view(0, {total_});
    if (opts_.overlap_param_gather)
      gather_[i].start(*g.dp, g.part, b, opts_.allgather_bucket, space);
    else
      all_gather_flat(*g.dp, g.part, b, opts_.allgather_bucket, space);
  }
}

Tensor FlatParamStore::acquire_params(int unit) {
  const Range& r = units_.at(unit);
  for (FlatGather& g : gather_)
    if (g.pending()) g.wait(r);  // overlap_param_gather: this unit's chunks only
  return (compute_.defined() ? compute_ : params_).view(r.begin, {r.size()});
}

// The compute copy of the master's range is cast from it; with a sharded
// master the owners' ranges are then all-gathered in the compute dtype (half
// the bytes of gathering f32, and the same bits as casting after it).
void FlatParamStore::params_updated() {
  wait_gathers();
  if (!compute_.defined() || total_ == 0) return;
  for (const GroupSpace::Piece& q : master_) {
    const int64_t k = std::min(q.flat.end, total_) - q.flat.begin;  // a full master may run past total_
    if (k > 0) ops::cast({.out = compute_.view(q.flat.begin, {k}), .inp = params_.view(q.at, {k})}, Stream{});
  }
  if (!full_master()) gather_owned();
}

Tensor FlatParamStore::acquire_grads(int unit) {
  const Range& r = units_.at(unit);
  DS_CHECK(grads_.defined(), "unit {}: gradients acquired on a forward-only model", unit);
  notify_grads(unit, false);
  if (grads_.dtype() == DType::F32) return grads_.view(r.begin, {r.size()});
  DS_CHECK(!unit_f32_[unit].defined(), "unit {}: gradient acquired twice", unit);
  return unit_f32_[unit] = Tensor::zeros({r.size()}, DType::F32, grads_.device());
}

void FlatParamStore::abandon_pass() {
  for (Tensor& t : unit_f32_) t = Tensor();
}

// Compute-dtype accumulation: the unit's f32 gradient of this micro-batch is
// rounded to the accumulator's dtype and added (what a framework whose
// backward writes bf16 gradients does), before the observer may reduce it.
void FlatParamStore::grads_ready(int unit) {
  if (grads_.dtype() != DType::F32) {
    DS_CHECK(unit_f32_[unit].defined(), "unit {}: gradient ready but never acquired", unit);
    const Range& r = units_.at(unit);
    if (r.size() > 0) {
      Tensor dst = grads_.view(r.begin, {r.size()});
      Tensor g = Tensor::empty({r.size()}, grads_.dtype(), grads_.device());
      ops::cast({.out = g, .inp = unit_f32_[unit]}, Stream{});
      ops::add({.out = dst, .a = dst, .b = g}, Stream{});
    }
    unit_f32_[unit] = Tensor();
  }
  notify_grads(unit, true);
}

void ParamStore::init_params(int64_t total, const InitFill& fill) {
  Tensor host = Tensor::empty({total}, DType::F32);
  fill(0, total, host.data<float>());
  set_full_params(host);
}

void init_fill_into(const ParamStore::InitFill& fill, Range r, const Tensor& dst, Tensor& staging) {
  DS_CHECK(dst.numel() == r.size(), "init_fill_into: {} elements for a range of {}", dst.numel(), r.size());
  if (dst.device().is_cpu() && dst.dtype() == DType::F32) {
    for (int64_t b = r.begin; b < r.end; b += kInitChunk)
      fill(b, std::min(r.end, b + kInitChunk), dst.data<float>() + (b - r.begin));
    return;
  }
  if (!staging.defined()) staging = Tensor::empty({kInitChunk}, DType::F32);
  for (int64_t b = r.begin; b < r.end; b += kInitChunk) {
    const int64_t e = std::min(r.end, b + kInitChunk);
    fill(b, e, staging.data<float>());
    const Tensor v = staging.view(0, {e - b});
    Tensor out = dst.view(b - r.begin, {e - b});
    if (dst.dtype() == DType::F32)
      out.copy_from(v);
    else
      ops::cast({.out = out, .inp = v.device() == dst.device() ? v : v.to(dst.device())}, Stream{});
  }
}

void FlatParamStore::init_params(int64_t total, const InitFill& fill) {
  DS_CHECK(total == total_, "init_params: {} elements, the store has {}", total, total_);
  wait_gathers();
  Tensor staging;
  for (const GroupSpace::Piece& q : master_) {  // the f32 buffer: each flat piece it holds
    const int64_t end = std::min(q.flat.end, total_);  // a full master may run past total_
    if (end > q.flat.begin) init_fill_into(fill, {q.flat.begin, end}, params_.view(q.at, {end - q.flat.begin}), staging);
  }
  if (!compute_.defined() || total_ == 0) return;
  if (full_master_)  // the compute copy of every weight, cast from the f32 ones
    ops::cast({.out = compute_, .inp = params_.view(0, {total_})}, Stream{});
  else  // a sharded master holds only its pieces
    init_fill_into(fill, {0, total_}, compute_, staging);
}

void FlatParamStore::set_full_params(const Tensor& full) {
  wait_gathers();
  DS_CHECK(full.numel() == total_, "set_full_params: {} elements, model has {}", full.numel(), total_);
  for (const GroupSpace::Piece& q : master_) {
    const int64_t k = std::min(q.flat.end, total_) - q.flat.begin;  // a full master may run past total_
    if (k > 0) params_.view(q.at, {k}).copy_from(full.view(q.flat.begin, {k}));
  }
  if (compute_.defined() && total_ > 0)
    ops::cast({.out = compute_, .inp = full.device() == compute_.device() ? full : full.to(compute_.device())},
              Stream{});
}

void FlatParamStore::get_full_params(const Tensor& out) {
  wait_gathers();
  if (full_master()) {
    if (!out.defined()) return;
    Tensor o = out;
    o.copy_from(params_.view(0, {total_}));
    return;
  }
  // Sharded master: each rank contributes its ranges (collective).
  Tensor f = Tensor::zeros({total_}, DType::F32, params_.device());
  unpack_pieces(master_, params_, 0, f, 0);
  for (const ShardGroup& g : groups_)
    if (g.part.dp > 1)
      all_gather_flat(*g.dp, g.part, f, opts_.allgather_bucket, &g.space);
  if (!out.defined()) return;
  Tensor o = out;
  o.copy_from(f);
}

void FlatParamStore::gather_f32(Range r, const Tensor& out) {
  wait_gathers();
  if (full_master()) return Tensor(out).copy_from(params_.view(r.begin, {r.size()}));
  // ZeRO-1 in mixed precision: each rank's master covers its owned range of each group.
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ShardGroup& g = groups_[i];
    for (const GroupSpace::Piece& q : g.space.within(r))
      gather_from_shards(g.dp, g.part, g.rank(), group_master(i), {q.at, q.at + q.flat.size()},
                         out.view(q.flat.begin - r.begin, {q.flat.size()}));
  }
}

void gather_from_shards(Communicator* dp, const ZeroPartition& part, int rank, const Tensor& shard, Range r,
                        const Tensor& out) {
  gather_from_shards(dp, part, rank, r, out, [&](int64_t lo, const Tensor& dst) {
    Tensor(dst).copy_from(shard.view(lo, {dst.numel()}));
  });
}

void gather_from_shards(Communicator* dp, const ZeroPartition& part, int rank, Range r, const Tensor& out,
                        const std::function<void(int64_t lo, const Tensor& dst)>& own_piece) {
  const int n = dp ? dp->size() : 1;
  for (int q = 0; q < n; ++q) {
    const Range own = part.owned(q);
    const Range piece{std::max(r.begin, own.begin), std::min(r.end, own.end)};
    if (piece.begin >= piece.end) continue;
    Tensor dst = out.view(piece.begin - r.begin, {piece.size()});
    if (q == rank) own_piece(piece.begin - own.begin, dst);
    if (n > 1) dp->broadcast(dst, q);
  }
}

}  // namespace ds
