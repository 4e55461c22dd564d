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
  const bool shard_master = compute != DType::F32 && opts.dp;
  if (shard_master)
    DS_CHECK(opts.part.total == total_ && opts.part.dp == opts.dp->size(),
             "master partition of {} elements over {} ranks for a model of {} on {} ranks", opts.part.total,
             opts.part.dp, total_, opts.dp->size());
  master_ = shard_master ? opts.part.owned_real(opts.dp->rank()) : Range{0, n};
  {
    MemTagScope tag(MemTag::Params);
    params_ = Tensor::zeros({master_.size()}, DType::F32, dev);
    if (compute != DType::F32) compute_ = Tensor::zeros({total_}, compute, dev);
  }
  MemTagScope tag(MemTag::Grads);
  if (!opts.forward_only) grads_ = Tensor::zeros({n}, opts.grad, dev);
  unit_f32_.resize(units_.size());
}

int64_t FlatParamStore::param_bytes() const {
  return static_cast<int64_t>(params_.nbytes() + (compute_.defined() ? compute_.nbytes() : 0));
}

Tensor& FlatParamStore::params() {
  gather_.wait_all();
  DS_CHECK(full_master(), "FlatParamStore::params(): this rank keeps the f32 master of [{}, {}) only",
           master_.begin, master_.end);
  return params_;
}

Tensor FlatParamStore::master(Range r) {
  DS_CHECK(master_.begin <= r.begin && r.end <= master_.end, "master range [{}, {}) outside [{}, {})", r.begin,
           r.end, master_.begin, master_.end);
  return params_.view(r.begin - master_.begin, {r.size()});
}

Tensor& FlatParamStore::compute_params() {
  gather_.wait_all();
  return compute_;
}

void FlatParamStore::gather_owned() {
  DS_CHECK(opts_.dp, "FlatParamStore::gather_owned without a data-parallel group");
  if (opts_.part.dp == 1) return;
  const Tensor& buf = compute_.defined() ? compute_ : params_;
  if (opts_.overlap_param_gather)
    gather_.start(*opts_.dp, opts_.part, buf.view(0, {total_}), opts_.allgather_bucket);
  else
    all_gather_flat(*opts_.dp, opts_.part, buf.view(0, {total_}), opts_.allgather_bucket);
}

Tensor FlatParamStore::acquire_params(int unit) {
  const Range& r = units_.at(unit);
  if (gather_.pending()) gather_.wait(r);  // overlap_param_gather: this unit's chunks only
  return (compute_.defined() ? compute_ : params_).view(r.begin, {r.size()});
}

// The compute copy of the master's range is cast from it; with a sharded
// master the owners' ranges are then all-gathered in the compute dtype (half
// the bytes of gathering f32, and the same bits as casting after it).
void FlatParamStore::params_updated() {
  gather_.wait_all();
  if (!compute_.defined() || total_ == 0) return;
  const Range own{master_.begin, std::min(master_.end, total_)};
  if (own.size() > 0) ops::cast({.out = compute_.view(own.begin, {own.size()}), .inp = master(own)}, Stream{});
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

void FlatParamStore::set_full_params(const Tensor& full) {
  gather_.wait_all();
  DS_CHECK(full.numel() == total_, "set_full_params: {} elements, model has {}", full.numel(), total_);
  const Range own{master_.begin, std::min(master_.end, total_)};
  if (own.size() > 0) master(own).copy_from(full.view(own.begin, {own.size()}));
  if (compute_.defined() && total_ > 0)
    ops::cast({.out = compute_, .inp = full.device() == compute_.device() ? full : full.to(compute_.device())},
              Stream{});
}

void FlatParamStore::get_full_params(const Tensor& out) {
  gather_.wait_all();
  if (full_master()) {
    if (!out.defined()) return;
    Tensor o = out;
    o.copy_from(params_.view(0, {total_}));
    return;
  }
  // Sharded master: each rank contributes its range (collective).
  Tensor f = Tensor::zeros({total_}, DType::F32, params_.device());
  if (master_.size() > 0) f.view(master_.begin, {master_.size()}).copy_from(params_);
  if (opts_.part.dp > 1) all_gather_flat(*opts_.dp, opts_.part, f, opts_.allgather_bucket);
  if (!out.defined()) return;
  Tensor o = out;
  o.copy_from(f);
}

void FlatParamStore::gather_f32(Range r, const Tensor& out) {
  gather_.wait_all();
  if (full_master()) return Tensor(out).copy_from(params_.view(r.begin, {r.size()}));
  // ZeRO-1 in mixed precision: each rank's master covers its own range.
  gather_from_shards(opts_.dp, opts_.part, opts_.dp->rank(), params_, r, out);
}

void gather_from_shards(Communicator* dp, const ZeroPartition& part, int rank, const Tensor& shard, Range r,
                        const Tensor& out) {
  const int n = dp ? dp->size() : 1;
  for (int q = 0; q < n; ++q) {
    const Range own = part.owned(q);
    const Range piece{std::max(r.begin, own.begin), std::min(r.end, own.end)};
    if (piece.begin >= piece.end) continue;
    Tensor dst = out.view(piece.begin - r.begin, {piece.size()});
    if (q == rank) dst.copy_from(shard.view(piece.begin - own.begin, {piece.size()}));
    if (n > 1) dp->broadcast(dst, q);
  }
}

}  // namespace ds
