// DeepSpeed elasticity rules (elasticity.h). Candidate global batches are a
// base (each micro batch, and their least common multiple) scaled by the
// largest highly composite number that keeps it within max_train_batch_size;
// the candidate that the most GPU counts in [min_gpus, max_gpus] divide into
// whole micro batches wins (ties: the larger batch, or the smaller one with
// prefer_larger_batch false).
#include "lib/core/elasticity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "lib/core/error.h"

namespace ds {
namespace {

// The 38 smallest highly composite numbers (enough for batches up to ~720K).
constexpr int64_t kHcn[] = {1,      2,      4,      6,      12,     24,     36,     48,     60,     120,
                            180,    240,    360,    720,    840,    1260,   1680,   2520,   5040,   7560,
                            10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440,  83160,  110880,
                            166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

// Bounds that keep the search small (a few million steps at most): far above
// any real global batch (the highly composite numbers reach 720720) and list.
constexpr int64_t kMaxElasticBatch = 1000000000;
constexpr size_t kMaxMicroBatchSizes = 64;

std::vector<int64_t> candidate_batches(const std::vector<int64_t>& bases, int64_t max_batch) {
  std::set<int64_t> out;
  for (int64_t base : bases) {
    if (base > max_batch) continue;  // scaling only grows it
    if (base == max_batch) {
      out.insert(base);
      continue;
    }
    const int64_t room = max_batch / base;
    const int64_t* first_above = std::upper_bound(std::begin(kHcn), std::end(kHcn), room);
    // room >= 1 here, so first_above is past kHcn[0]; past the end: the largest.
    out.insert(*(first_above - 1) * base);
  }
  return {out.begin(), out.end()};
}

// The counts c in [lo, hi] that split `batch` into whole micro batches of a
// listed size: the divisors of batch / m for each listed m that divides batch.
std::vector<int64_t> valid_gpu_counts(int64_t batch, const std::vector<int64_t>& micro, int64_t lo, int64_t hi) {
  std::set<int64_t> valid;
  auto keep = [&](int64_t c) {
    if (lo <= c && c <= hi) valid.insert(c);
  };
  for (int64_t mb : micro) {
    if (batch % mb != 0) continue;
    const int64_t most = batch / mb;
    for (int64_t i = 1; i <= most / i; ++i)
      if (most % i == 0) keep(i), keep(most / i);
  }
  return {valid.begin(), valid.end()};
}

// Least common multiple of the micro batches, or 0 when it exceeds `cap`.
int64_t lcm_within(const std::vector<int64_t>& micro, int64_t cap) {
  int64_t l = 1;
  for (int64_t mb : micro) {
    const int64_t step = mb / std::gcd(l, mb);
    if (__builtin_mul_overflow(l, step, &l) || l > cap) return 0;
  }
  return l;
}

// Version 0.1: the batch with the most valid counts.
ElasticBatch compatible_v01(const std::vector<int64_t>& micro, int64_t max_batch, int64_t min_gpus, int64_t max_gpus,
                            bool prefer_larger) {
  const int64_t smallest = *std::min_element(micro.begin(), micro.end());
  if (min_gpus <= 0) min_gpus = 1;
  if (max_gpus <= 0) max_gpus = max_batch / smallest;
  for (int64_t mb : micro)
    DS_USER_CHECK(mb <= max_batch, "config: elasticity.micro_batch_sizes entry {} is larger than the largest "
                  "acceptable batch {} (elasticity.max_train_batch_size)", mb, max_batch);
  std::vector<int64_t> bases = micro;
  if (const int64_t l = lcm_within(micro, max_batch)) bases.push_back(l);  // larger: skipped anyway
  ElasticBatch best;
  best.train_batch_size = smallest;
  size_t best_count = 0;
  for (int64_t batch : candidate_batches(bases, max_batch)) {
    std::vector<int64_t> valid = valid_gpu_counts(batch, micro, min_gpus, max_gpus);
    const bool tie = valid.size() == best_count;
    if (valid.size() > best_count || (tie && prefer_larger && batch > best.train_batch_size) ||
        (tie && !prefer_larger && batch < best.train_batch_size)) {
      best_count = valid.size();
      best.valid_sizes = std::move(valid);
      best.train_batch_size = batch;
    }
  }
  return best;
}

// Among the listed micro batches that divide batch / dp: the first listed, or
// the largest with prefer_larger.
int64_t micro_for_v02(const std::vector<int64_t>& micro, int64_t batch, int64_t dp, bool prefer_larger) {
  int64_t pick = 0;
  for (int64_t mb : micro) {
    if ((batch / dp) % mb != 0) continue;
    if (pick == 0 || (prefer_larger && mb > pick)) pick = mb;
  }
  return pick;
}

// Version 0.2: whole nodes of num_gpus_per_node, model_parallel_size GPUs per replica.
ElasticBatch compatible_v02(const ElasticityConfig& c, int64_t num_gpus) {
  const int64_t gpn = c.num_gpus_per_node, mp = c.model_parallel_size;
  const int64_t dp_per_node = gpn / mp;
  ElasticBatch b = compatible_v01(c.micro_batch_sizes, c.max_train_batch_size / dp_per_node, c.min_gpus / gpn,
                                  c.max_gpus / gpn, c.prefer_larger_batch);
  b.train_batch_size *= dp_per_node;
  for (int64_t& v : b.valid_sizes) v *= dp_per_node;
  const int64_t dp = num_gpus / mp;
  if (std::find(b.valid_sizes.begin(), b.valid_sizes.end(), dp) != b.valid_sizes.end()) {
    b.micro_batch_size = micro_for_v02(c.micro_batch_sizes, b.train_batch_size, dp, c.prefer_larger_batch);
    return b;
  }
  // Not a valid size: the largest (or smallest) batch this size can run within the limit.
  const double cur_dp = static_cast<double>(num_gpus) / static_cast<double>(gpn) * static_cast<double>(dp_per_node);
  std::vector<double> cands;
  for (int64_t mb : c.micro_batch_sizes) {
    const double smallest = static_cast<double>(mb) * cur_dp;
    cands.push_back(std::floor(static_cast<double>(c.max_train_batch_size) / smallest) * smallest);
  }
  const double batch = c.prefer_larger_batch ? *std::max_element(cands.begin(), cands.end())
                                             : *std::min_element(cands.begin(), cands.end());
  b.train_batch_size = static_cast<int64_t>(batch);
  b.valid_sizes = {static_cast<int64_t>(cur_dp)};
  b.micro_batch_size = micro_for_v02(c.micro_batch_sizes, b.train_batch_size, b.valid_sizes[0], c.prefer_larger_batch);
  return b;
}

}  // namespace

std::string join_sizes(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

ElasticityConfig read_elasticity_section(JsonSection& s) {
  ElasticityConfig c;
  c.enabled = s.get<bool>("enabled", c.enabled);
  if (c.enabled) {
    DS_USER_CHECK(s.has("max_train_batch_size"), "config: elasticity is enabled but "
                  "'elasticity.max_train_batch_size' is missing");
    DS_USER_CHECK(s.has("micro_batch_sizes"), "config: elasticity is enabled but 'elasticity.micro_batch_sizes' "
                  "is missing");
  }
  c.max_train_batch_size = s.get<int64_t>("max_train_batch_size", c.max_train_batch_size);
  s.mark("micro_batch_sizes");
  if (s.has("micro_batch_sizes")) {
    const nlohmann::json& v = s.raw().at("micro_batch_sizes");
    DS_USER_CHECK(v.is_array(), "config: 'elasticity.micro_batch_sizes' must be a list of integers, got {}", v.dump());
    c.micro_batch_sizes.clear();
    for (const auto& x : v) {
      DS_USER_CHECK(x.is_number_integer(), "config: 'elasticity.micro_batch_sizes' must hold integers, got {}",
                    v.dump());
      c.micro_batch_sizes.push_back(x.get<int64_t>());
    }
  }
  c.min_gpus = s.get<int64_t>("min_gpus", c.min_gpus);
  c.max_gpus = s.get<int64_t>("max_gpus", c.max_gpus);
  c.min_time = s.get<double>("min_time", c.min_time);
  c.version = s.get<double>("version", c.version);
  c.prefer_larger_batch = s.get<bool>("prefer_larger_batch", c.prefer_larger_batch);
  c.ignore_non_elastic_batch_info = s.get<bool>("ignore_non_elastic_batch_info", c.ignore_non_elastic_batch_info);
  c.model_parallel_size = s.get<int64_t>("model_parallel_size", c.model_parallel_size);
  c.num_gpus_per_node = s.get<int64_t>("num_gpus_per_node", c.num_gpus_per_node);
  if (!c.enabled) return c;
  DS_USER_CHECK(c.max_train_batch_size > 0 && c.max_train_batch_size <= kMaxElasticBatch,
                "config: 'elasticity.max_train_batch_size' must be between 1 and {}, got {}", kMaxElasticBatch,
                c.max_train_batch_size);
  DS_USER_CHECK(!c.micro_batch_sizes.empty() && c.micro_batch_sizes.size() <= kMaxMicroBatchSizes,
                "config: 'elasticity.micro_batch_sizes' must list 1 to {} sizes, got {}", kMaxMicroBatchSizes,
                c.micro_batch_sizes.size());
  for (int64_t mb : c.micro_batch_sizes)
    DS_USER_CHECK(mb > 0, "config: 'elasticity.micro_batch_sizes' must hold positive integers, got [{}]",
                  join_sizes(c.micro_batch_sizes));
  DS_USER_CHECK(c.min_gpus >= 1 && c.max_gpus >= 1, "config: 'elasticity.min_gpus' {} and 'elasticity.max_gpus' {} "
                "must be at least 1", c.min_gpus, c.max_gpus);
  DS_USER_CHECK(c.min_gpus <= c.max_gpus, "config: 'elasticity.min_gpus' {} is larger than 'elasticity.max_gpus' {}",
                c.min_gpus, c.max_gpus);
  DS_USER_CHECK(c.min_time >= 0, "config: 'elasticity.min_time' must be >= 0, got {}", c.min_time);
  DS_USER_CHECK(c.version == 0.1 || c.version == 0.2, "config: 'elasticity.version' {} is not supported (0.1 or 0.2)",
                c.version);
  DS_USER_CHECK(c.model_parallel_size >= 1 && c.num_gpus_per_node >= 1, "config: 'elasticity.model_parallel_size' {} "
                "and 'elasticity.num_gpus_per_node' {} must be at least 1", c.model_parallel_size, c.num_gpus_per_node);
  DS_USER_CHECK(c.model_parallel_size == 1 || c.version == 0.2, "config: 'elasticity.model_parallel_size' {} needs "
                "'elasticity.version' 0.2 (version 0.1 has no model parallelism)", c.model_parallel_size);
  DS_USER_CHECK(c.version != 0.2 || c.num_gpus_per_node % c.model_parallel_size == 0,
                "config: 'elasticity.num_gpus_per_node' {} is not a multiple of 'elasticity.model_parallel_size' {}",
                c.num_gpus_per_node, c.model_parallel_size);
  return c;
}

ElasticBatch compute_elastic_config(const ElasticityConfig& c, int64_t dp_size) {
  DS_USER_CHECK(c.enabled, "elasticity is not enabled (set 'elasticity.enabled': true)");
  ElasticBatch b;
  if (c.version == 0.2) {
    DS_USER_CHECK(dp_size > 0, "elasticity version 0.2 needs the data-parallel size");
    b = compatible_v02(c, dp_size * c.model_parallel_size);  // its GPUs: DP x model parallel
  } else {
    b = compatible_v01(c.micro_batch_sizes, c.max_train_batch_size, c.min_gpus, c.max_gpus, c.prefer_larger_batch);
  }
  if (dp_size <= 0) return b;
  DS_USER_CHECK(std::find(b.valid_sizes.begin(), b.valid_sizes.end(), dp_size) != b.valid_sizes.end(),
                "elasticity: data-parallel size {} is not one of the valid sizes [{}] for global batch {} "
                "(elasticity.micro_batch_sizes [{}], max_train_batch_size {}, min_gpus {}, max_gpus {})",
                dp_size, join_sizes(b.valid_sizes), b.train_batch_size, join_sizes(c.micro_batch_sizes),
                c.max_train_batch_size, c.min_gpus, c.max_gpus);
  std::vector<int64_t> sizes = c.micro_batch_sizes;
  std::sort(sizes.rbegin(), sizes.rend());
  b.micro_batch_size = 0;
  for (int64_t mb : sizes)
    if ((b.train_batch_size / dp_size) % mb == 0) {
      b.micro_batch_size = mb;
      break;
    }
  DS_USER_CHECK(b.micro_batch_size > 0, "elasticity: no micro batch in [{}] divides global batch {} / size {}",
                join_sizes(c.micro_batch_sizes), b.train_batch_size, dp_size);
  return b;
}

}  // namespace ds
