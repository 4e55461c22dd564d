// ZeRO partitions, buckets, the ZeRO-3 fetch plan and model-state bytes.
// Everything is integer arithmetic on element counts; see zero_partition.h.
#include "lib/parallel/zero_partition.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

Range ZeroPartition::owned(int rank) const {
  DS_CHECK(rank >= 0 && rank < dp, "ZeRO partition: rank {} out of range for dp {}", rank, dp);
  return {rank * shard, (rank + 1) * shard};
}

Range ZeroPartition::owned_real(int rank) const {
  Range r = owned(rank);
  r.begin = std::min(r.begin, total);
  r.end = std::min(r.end, total);
  return r;
}

ZeroPartition make_zero_partition(int64_t total, int dp, int64_t align) {
  DS_CHECK(total >= 0, "ZeRO partition: negative total {}", total);
  DS_CHECK(dp >= 1, "ZeRO partition: dp must be >= 1, got {}", dp);
  DS_CHECK(align >= 1, "ZeRO partition: align must be >= 1, got {}", align);
  ZeroPartition p;
  p.total = total;
  p.dp = dp;
  const int64_t unit = static_cast<int64_t>(dp) * align;
  p.padded_total = (total + unit - 1) / unit * unit;
  p.shard = p.padded_total / dp;
  return p;
}

std::vector<Range> make_buckets(int64_t total, int64_t bucket_elems) {
  DS_CHECK(total >= 0, "buckets: negative total {}", total);
  std::vector<Range> out;
  if (total == 0) return out;
  const int64_t step = bucket_elems <= 0 ? total : bucket_elems;
  for (int64_t b = 0; b < total; b += step) out.push_back({b, std::min(b + step, total)});
  return out;
}

std::vector<Range> make_shard_chunks(const ZeroPartition& p, int64_t bucket_elems, int64_t align) {
  DS_CHECK(align >= 1, "shard chunks: align must be >= 1, got {}", align);
  if (p.shard == 0) return {};
  if (bucket_elems <= 0) return {{0, p.shard}};
  int64_t len = std::max<int64_t>(1, bucket_elems / p.dp);
  len = std::max(align, len / align * align);
  return make_buckets(p.shard, len);
}

namespace {

// Checks prefetch depth k over one execution order of unit sizes `s`
// (non-persistent units only): conditions (a) and (b) of make_zero3_plan.
bool depth_fits(const std::vector<int64_t>& s, int k, int64_t bucket, int64_t max_live) {
  const int n = static_cast<int>(s.size());
  for (int i = 0; i < n; ++i) {
    int64_t queued = 0, live = s[i];
    for (int j = 1; j <= k && i + j < n; ++j) {
      if (queued >= bucket) return false;  // (a): the bucket was already full
      queued += s[i + j];
      live += s[i + j];
      if (live > max_live) return false;  // (b)
    }
  }
  return true;
}

// The gathered elements resident at once with depth k (largest window).
int64_t peak_window(const std::vector<int64_t>& s, int k) {
  int64_t peak = 0;
  const int n = static_cast<int>(s.size());
  for (int i = 0; i < n; ++i) {
    int64_t live = 0;
    for (int j = 0; j <= k && i + j < n; ++j) live += s[i + j];
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace

Zero3Plan make_zero3_plan(const std::vector<Range>& units, int64_t prefetch_bucket_size,
                          int64_t max_live_parameters, int64_t persistence_threshold) {
  Zero3Plan plan;
  plan.persistent.resize(units.size());
  std::vector<int64_t> fwd;  // sizes of the gathered (non-persistent) units in forward order
  int64_t persistent_elems = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    DS_CHECK(units[i].size() >= 0, "ZeRO-3 plan: unit {} has negative size", i);
    plan.persistent[i] = units[i].size() < persistence_threshold;
    if (plan.persistent[i])
      persistent_elems += units[i].size();
    else
      fwd.push_back(units[i].size());
  }
  std::vector<int64_t> bwd(fwd.rbegin(), fwd.rend());
  int depth = 0;
  if (prefetch_bucket_size > 0) {
    const int max_depth = std::max(0, static_cast<int>(fwd.size()) - 1);
    while (depth < max_depth && depth_fits(fwd, depth + 1, prefetch_bucket_size, max_live_parameters) &&
           depth_fits(bwd, depth + 1, prefetch_bucket_size, max_live_parameters))
      ++depth;
  }
  plan.prefetch_depth = depth;
  plan.peak_live = std::max(peak_window(fwd, depth), peak_window(bwd, depth)) + persistent_elems;
  return plan;
}

bool is_mixed(StatePrecision p) { return p != StatePrecision::FP32; }

ModelStateBytes zero_model_state_bytes(int64_t n_params, int dp, int stage, StatePrecision prec,
                                       bool offload_optimizer, int optimizer_bytes) {
  DS_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3, got {}", stage);
  const int64_t n = n_params, shard = make_zero_partition(n_params, dp).shard;
  const int64_t s = std::min(n, shard);  // rank 0's real range (shard > n only for DP 1)
  const int64_t grad = prec == StatePrecision::MixedLowp ? 2 : 4;
  ModelStateBytes b;
  if (stage == 3)
    b.params = 4 * shard;
  else if (!is_mixed(prec))
    b.params = 4 * n;
  else  // the compute copy of every weight + the f32 master of what this rank updates
    b.params = 2 * n + 4 * (stage == 0 ? n : stage == 1 ? s : shard);
  b.grads = grad * (stage >= 2 ? shard : n);
  b.optimizer = offload_optimizer ? 0 : optimizer_bytes * (stage >= 1 ? s : n);
  return b;
}

int64_t host_optimizer_bytes(int64_t n_params, int dp, int stage, StatePrecision prec, int optimizer_bytes) {
  return zero_model_state_bytes(n_params, dp, stage, prec, false, optimizer_bytes).optimizer;
}

}  // namespace ds
