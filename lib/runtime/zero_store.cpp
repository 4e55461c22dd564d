// ZeRO-2/3 parameter store: per-unit gradient reduce-scatter into a shard,
// per-unit parameter gathers with prefetch (stage 3). See zero_store.h.
#include "lib/runtime/zero_store.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"
#include "lib/optim/adamw.h"

namespace ds {

void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& params, int64_t bucket_elems) {
  DS_CHECK(params.numel() == p.total, "all_gather_flat: buffer {} != partition total {}", params.numel(), p.total);
  const int me = dp.rank();
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    const int64_t k = c.size();
    // Rank r's piece of this chunk, clipped to the real elements (padding is zeros).
    auto real = [&](int r) {
      const int64_t b = r * p.shard + c.begin;
      return Range{std::min(b, p.total), std::min(b + k, p.total)};
    };
    Tensor send = Tensor::zeros({k}, DType::F32, params.device());
    Range mine = real(me);
    if (mine.size() > 0) send.view(0, {mine.size()}).copy_from(params.view(mine.begin, {mine.size()}));
    Tensor recv = Tensor::empty({p.dp * k}, DType::F32, params.device());
    dp.all_gather(send, recv);
    for (int r = 0; r < p.dp; ++r) {
      Range rr = real(r);
      if (r != me && rr.size() > 0) params.view(rr.begin, {rr.size()}).copy_from(recv.view(r * k, {rr.size()}));
    }
  }
}

ZeroParamStore::ZeroParamStore(const ModelLayout& layout, int num_layers, Device dev, Communicator* dp,
                               const ZeroConfig& z, const ZeroPartition& part, DType compute)
    : dp_(dp), z_(z), part_(part), stage_(z.stage), dev_(dev), compute_dtype_(compute) {
  DS_CHECK(stage_ == 2 || stage_ == 3, "ZeroParamStore is for ZeRO stages 2 and 3, got {}", stage_);
  DS_CHECK(part.total == layout.total, "partition of {} elements for a model of {}", part.total, layout.total);
  rank_ = dp ? dp->rank() : 0;
  units_ = unit_ranges(layout, num_layers);
  gathered_.resize(units_.size());
  unit_grads_.resize(units_.size());
  deferred_.resize(units_.size());
  gshard_ = Tensor::zeros({part.shard}, DType::F32, dev);
  if (stage_ == 2) {
    full_ = Tensor::zeros({part.total}, DType::F32, dev);
    if (compute != DType::F32) compute_ = Tensor::zeros({part.total}, compute, dev);
    return;
  }
  shard_ = Tensor::zeros({part.shard}, DType::F32, dev);
  plan_ = make_zero3_plan(units_, z.stage3_prefetch_bucket_size, z.stage3_max_live_parameters,
                          z.stage3_param_persistence_threshold);
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u]) {
      gathered_[u] = Tensor::zeros({units_[u].size()}, compute, dev);
      live_params_ += units_[u].size();
    }
  peak_params_ = live_params_;
}

Range ZeroParamStore::piece(int unit, int rank) const {
  const Range& u = units_[unit];
  Range own = part_.owned(rank);
  Range r{std::max(u.begin, own.begin), std::min(u.end, own.end)};
  return r.begin < r.end ? r : Range{0, 0};
}

int64_t ZeroParamStore::persistent_elems() const {
  int64_t n = 0;
  for (size_t u = 0; u < units_.size() && stage_ == 3; ++u)
    if (plan_.persistent[u]) n += units_[u].size();
  return n;
}

// The unit's full parameters into `out` (unit size): each owner broadcasts its piece.
void ZeroParamStore::gather_unit(int unit, const Tensor& out) {
  const int64_t ub = units_[unit].begin;
  const int dp = part_.dp;
  for (int r = 0; r < dp; ++r) {
    Range p = piece(unit, r);
    if (p.size() == 0) continue;
    Tensor dst = out.view(p.begin - ub, {p.size()});
    if (r == rank_) dst.copy_from(shard_.view(p.begin - rank_ * part_.shard, {p.size()}));
    if (dp > 1) dp_->broadcast(dst, r);
  }
}

void ZeroParamStore::gather_unit_compute(int unit, const Tensor& out) {
  if (compute_dtype_ == DType::F32) return gather_unit(unit, out);
  Tensor f = Tensor::empty({units_[unit].size()}, DType::F32, dev_);
  gather_unit(unit, f);
  if (f.numel() > 0) ops::cast({.out = out, .inp = f}, Stream{});
}

void ZeroParamStore::refresh_compute() {
  if (compute_.defined() && full_.numel() > 0) ops::cast({.out = compute_, .inp = full_}, Stream{});
}

void ZeroParamStore::fetch(int unit) {
  if (gathered_[unit].defined()) return;
  Tensor buf = Tensor::empty({units_[unit].size()}, compute_dtype_, dev_);
  gather_unit_compute(unit, buf);
  gathered_[unit] = buf;
  live_params_ += units_[unit].size();
  peak_params_ = std::max(peak_params_, live_params_);
}

void ZeroParamStore::free_gathered(int unit) {
  if (!gathered_[unit].defined() || plan_.persistent[unit]) return;
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
  if (stage_ == 2) return (compute_.defined() ? compute_ : full_).view(units_[unit].begin, {units_[unit].size()});
  DS_CHECK(cursor_ < order_.size() && order_[cursor_] == unit,
           "ZeRO-3: unit {} acquired out of the pass order (position {})", unit, cursor_);
  ++cursor_;
  fetch(unit);
  // Prefetch: the next prefetch_depth gathered units of the pass. Gloo
  // collectives are blocking, so this only moves the gathers earlier.
  int ahead = 0;
  for (size_t j = cursor_; j < order_.size() && ahead < plan_.prefetch_depth; ++j) {
    if (plan_.persistent[order_[j]]) continue;
    fetch(order_[j]);
    ++ahead;
  }
  return gathered_[unit];
}

void ZeroParamStore::release_params(int unit) {
  if (stage_ == 2 || needed_soon(unit)) return;
  free_gathered(unit);
}

Tensor ZeroParamStore::acquire_grads(int unit) {
  DS_CHECK(!unit_grads_[unit].defined(), "unit {}: gradient acquired twice", unit);
  if (deferred_[unit].defined()) return unit_grads_[unit] = deferred_[unit];
  unit_grads_[unit] = Tensor::zeros({units_[unit].size()}, DType::F32, dev_);
  live_grads_ += units_[unit].size();
  peak_grads_ = std::max(peak_grads_, live_grads_);
  return unit_grads_[unit];
}

void ZeroParamStore::grads_ready(int unit) {
  DS_CHECK(unit_grads_[unit].defined(), "unit {}: gradient ready but never acquired", unit);
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
// piece), in rounds of at most reduce_bucket_size elements.
void ZeroParamStore::reduce_unit(int unit, const Tensor& g) {
  const int64_t ub = units_[unit].begin;
  const int dp = part_.dp;
  Range mine = piece(unit, rank_);
  if (dp == 1) {
    Tensor dst = gshard_.view(mine.begin, {mine.size()});
    ops::add({.out = dst, .a = dst, .b = g}, Stream{});
    return;
  }
  int64_t m = 0;
  for (int r = 0; r < dp; ++r) m = std::max(m, piece(unit, r).size());
  const int64_t len = z_.reduce_bucket_size <= 0 ? m : std::max<int64_t>(1, z_.reduce_bucket_size / dp);
  for (int64_t off = 0; off < m; off += len) {
    const int64_t k = std::min(len, m - off);
    Tensor send = Tensor::zeros({dp * k}, DType::F32, dev_);
    for (int r = 0; r < dp; ++r) {
      Range p = piece(unit, r);
      const int64_t c = std::clamp<int64_t>(p.size() - off, 0, k);
      if (c > 0) send.view(r * k, {c}).copy_from(g.view(p.begin + off - ub, {c}));
    }
    Tensor recv = Tensor::empty({k}, DType::F32, dev_);
    dp_->reduce_scatter(send, recv);
    const int64_t c = std::clamp<int64_t>(mine.size() - off, 0, k);
    if (c == 0) continue;
    Tensor dst = gshard_.view(mine.begin - rank_ * part_.shard + off, {c});
    ops::add({.out = dst, .a = dst, .b = recv.view(0, {c})}, Stream{});
  }
}

void ZeroParamStore::set_full_params(const Tensor& full) {
  DS_CHECK(full.numel() == part_.total, "set_full_params: {} elements, model has {}", full.numel(), part_.total);
  if (stage_ == 2) {
    full_.copy_from(full);
    refresh_compute();
    return;
  }
  shard_.zero_();
  Range own = part_.owned_real(rank_);
  if (own.size() > 0) shard_.view(0, {own.size()}).copy_from(full.view(own.begin, {own.size()}));
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u] && units_[u].size() > 0) {
      const Tensor src = full.view(units_[u].begin, {units_[u].size()});
      if (compute_dtype_ == DType::F32) gathered_[u].copy_from(src);
      else
        ops::cast({.out = gathered_[u], .inp = src.device() == dev_ ? src : src.to(dev_)}, Stream{});
    }
}

void ZeroParamStore::get_full_params(const Tensor& out) {
  if (stage_ == 2) {
    Tensor o = out;
    if (o.defined()) o.copy_from(full_);
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const Range& r = units_[u];
    Tensor buf = out.defined() ? out.view(r.begin, {r.size()}) : Tensor::empty({r.size()}, DType::F32, dev_);
    gather_unit(static_cast<int>(u), buf);
  }
}

Tensor ZeroParamStore::master_params() {
  Range own = part_.owned_real(rank_);
  if (stage_ == 2) return full_.view(own.begin, {own.size()});
  return shard_.view(0, {own.size()});
}

Tensor ZeroParamStore::grad_shard() { return gshard_.view(0, {part_.owned_real(rank_).size()}); }

void ZeroParamStore::zero_grads() {
  gshard_.zero_();
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

double ZeroParamStore::grad_norm() {
  Tensor g = grad_shard();
  double local = g.numel() > 0 ? grad_sum_squares(g) : 0.0;
  if (part_.dp == 1) return std::sqrt(local);
  return std::sqrt(dp_->all_reduce_scalar(local, dev_));
}

void ZeroParamStore::after_step() {
  if (stage_ == 2) {
    if (part_.dp > 1) all_gather_flat(*dp_, part_, full_, z_.allgather_bucket_size);
    refresh_compute();
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u)
    if (plan_.persistent[u]) gather_unit_compute(static_cast<int>(u), gathered_[u]);
}

}  // namespace ds
