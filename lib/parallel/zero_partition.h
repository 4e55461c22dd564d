// ZeRO as pure arithmetic over flat buffers: which range of the (padded) flat
// buffer each data-parallel rank owns, how buffers are cut into buckets for
// all-reduce and reduce-scatter, the ZeRO-3 fetch plan over parameter units,
// and the per-rank model-state bytes of each stage. No communication here, so
// every rule is unit tested on CPU; the executors in lib/parallel and the
// trainer call these. Semantics and formulas: docs/zero.md.
#pragma once
#include <cstdint>
#include <vector>

namespace ds {

// Half-open range [begin, end) of elements.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// ZeRO partition of a flat buffer of `total` elements over `dp` ranks. The
// buffer is padded to padded_total = the smallest multiple of dp * align that
// is >= total; shard = padded_total / dp (a multiple of align); rank r owns
// the padded range [r*shard, (r+1)*shard).
struct ZeroPartition {
  int64_t total = 0, padded_total = 0, shard = 0;
  int dp = 1;
  Range owned(int rank) const;       // padded coordinates (may extend past total)
  Range owned_real(int rank) const;  // clipped to [0, total) (may be empty: begin == end)
};

// align is in elements (64 f32 = 256 bytes). Requires total >= 0, dp >= 1, align >= 1.
ZeroPartition make_zero_partition(int64_t total, int dp, int64_t align = 64);

// Consecutive ranges of at most bucket_elems elements covering [0, total), for
// bucketed all-reduce (ZeRO 0/1). bucket_elems <= 0 -> one bucket. total 0 -> none.
std::vector<Range> make_buckets(int64_t total, int64_t bucket_elems);

// Bucketed reduce-scatter that keeps each rank's shard contiguous: [0, shard)
// is cut into chunks of L = max(1, bucket_elems / dp) elements rounded down to
// a multiple of `align` (but at least `align`: alignment wins over a tiny
// bucket); only the last chunk may be shorter. For chunk c, rank r's piece of
// the full buffer is [r*shard + c.begin, r*shard + c.end), so one collective
// per chunk moves dp * c.size() elements (<= bucket_elems unless the bucket is
// smaller than dp * align). Returned ranges are offsets within a shard.
// bucket_elems <= 0 -> one chunk [0, shard). shard 0 -> none.
std::vector<Range> make_shard_chunks(const ZeroPartition& p, int64_t bucket_elems, int64_t align = 64);

// ZeRO-3 fetch plan over parameter units (each a contiguous range of the flat
// buffer, e.g. one transformer layer, listed in forward execution order).
//  - persistent[i]: unit i has fewer than persistence_threshold elements; it is
//    kept whole on every rank and never gathered or released.
//  - prefetch_depth: how many of the following non-persistent units are
//    gathered ahead while one runs. It is the largest k for which, at every
//    position in forward AND backward (reverse) order, (a) prefetching keeps
//    adding units while those already queued total fewer than
//    prefetch_bucket_size elements (so the last one may overshoot, as
//    DeepSpeed's coordinator does), and (b) the running unit plus the k units
//    ahead hold at most max_live_parameters elements. prefetch_bucket_size <= 0
//    disables prefetch (depth 0).
//  - peak_live: the most gathered elements resident at once under this plan
//    (the largest running unit + its k successors, plus all persistent units);
//    with a unit larger than max_live_parameters it exceeds that limit, since
//    a unit must be whole to run.
struct Zero3Plan {
  std::vector<bool> persistent;
  int prefetch_depth = 1;  // units fetched ahead
  int64_t peak_live = 0;   // elements
};
Zero3Plan make_zero3_plan(const std::vector<Range>& units, int64_t prefetch_bucket_size,
                          int64_t max_live_parameters, int64_t persistence_threshold);

// Model-state bytes per rank of our implementation (pure arithmetic: the
// trainer's start-up log, --estimate-memory, tests).
enum class StatePrecision {
  FP32,       // fp32 params and grads; optimizer = Adam m, v (the params are the master copy)
  Mixed,      // bf16/fp16 compute copy + fp32 master params, fp32 gradient accumulation
              // (data_types.grad_accum_dtype fp32, our default; Megatron's main grads)
  MixedLowp,  // as Mixed, gradients accumulated and reduced in the compute dtype
              // (grad_accum_dtype bf16/fp16; DeepSpeed's default for bf16/fp16)
};
bool is_mixed(StatePrecision p);
struct ModelStateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};
// Per rank; n = n_params, shard = make_zero_partition(n, dp).shard (padded),
// s = min(n, shard) (rank 0's real range; the optimizer state and the stage-1
// master never cover padding; later ranks may hold less).
// Gradients: G = 4 bytes per element (FP32, Mixed) or 2 (MixedLowp), over n
// elements at stages 0/1 and the padded shard at 2/3 (collectives need equal
// pieces). Optimizer: Adam m, v = 8 bytes over n (stage 0) or s.
// Parameters:
//   FP32:   4*n (stages 0-2; the params are the master), 4*shard (stage 3)
//   mixed:  stage 0: 2*n compute copy + 4*n f32 master
//           stage 1: 2*n + 4*s (the f32 master of the rank's optimizer range)
//           stage 2: 2*n + 4*shard (the master shard, padded)
//           stage 3: 4*shard (the f32 shard is the master; gathered compute
//                    copies are transient)
// offload_optimizer: the optimizer state lives in host memory, so it is
// reported as 0 here (device bytes); see host_optimizer_bytes for the host side.
// optimizer_bytes: the optimizer's state bytes per element of its range
// (Adam 8: m and v; Adagrad, Lion, SGD with momentum 4; SGD without 0).
ModelStateBytes zero_model_state_bytes(int64_t n_params, int dp, int stage, StatePrecision prec,
                                       bool offload_optimizer, int optimizer_bytes = 8);

// Host bytes per rank of the optimizer state when offload_optimizer is on
// (what zero_model_state_bytes leaves out of the device figure).
int64_t host_optimizer_bytes(int64_t n_params, int dp, int stage, StatePrecision prec, int optimizer_bytes = 8);

}  // namespace ds
