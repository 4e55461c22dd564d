// ZeRO-2/3 parameter store: what a data-parallel rank really holds.
//   stage 2: the full parameters (n; fp32, or with bf16/f16 the compute copy
//            plus an fp32 master SHARD) + an fp32 gradient SHARD (shard).
//            A unit's full gradient exists only from its acquire_grads to its
//            grads_ready; then it is reduce-scattered into the shard and freed.
//   stage 3: as stage 2, but the parameters too are only a shard (the fp32
//            master the optimizer updates). A unit's full parameters are
//            gathered before each use and freed after, with prefetch of the
//            next units of the pass per make_zero3_plan; units smaller than
//            stage3_param_persistence_threshold stay resident on every rank.
//            Gathers are asynchronous: a prefetched unit's broadcasts run on
//            the communication thread/stream while the current unit computes.
// Shards follow the global flat ZeroPartition (rank r owns [r*shard,
// (r+1)*shard) of the padded buffer), so optimizer state and checkpoints are
// the same as for stages 1 and 2. A unit's piece on rank r is its
// intersection with that range (uneven across ranks): gathers are one
// broadcast per owning rank, reductions a reduce-scatter of the pieces padded
// to the largest one. See docs/zero.md.
// Gradient reduce-scatters are asynchronous (the group's communication
// thread, or NCCL's stream): a unit's reduce-scatter is issued at its
// grads_ready and the backward goes on; completed ones are added into the
// shard in issue order (so the sums are bit-identical to blocking) at the next
// grads_ready, and finish_reductions() (ZeroOptimizer::reduce_gradients_into)
// waits for the rest. Without overlap_comm each one is waited for at once.
// overlap_param_gather (stage 2): the all-gather after the step is issued and
// acquire_params(u) completes the chunks that write into unit u (FlatGather).
// Sharding groups (stage 2 with expert parallelism): the dense weights are
// partitioned over every data-parallel rank and the experts over the
// expert-data-parallel ones, each in its group space (ShardGroup,
// lib/model/param_store.h): every group has its own gradient shard (and
// master shard), a unit's reduce-scatter runs once per group over that
// group's ranks with the pieces packed from the unit's gradient, and the
// post-step all-gather runs per group. Stage 3 keeps a parameter shard per
// group too, and gathers a unit once per group (a unit's pieces of a group
// that are not one flat range go through a packed buffer).
// Mixed precision (compute dtype bf16/f16): the f32 parameters above are the
// master weights; what acquire_params returns is a compute-dtype copy (stage
// 2: one full copy; after each step the owner casts its updated master range
// and the copy is all-gathered in the compute dtype; stage 3: each gathered
// unit is gathered in f32 and cast). A unit's full gradient is f32 while its
// backward runs; the gradient shard, and the reduce-scatters into it, are f32
// or, with data_types.grad_accum_dtype bf16/fp16, the compute dtype (the unit
// gradient is rounded to it before it is sent).
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/param_store.h"
#include "lib/parallel/flat_gather.h"
#include "lib/parallel/zero_partition.h"
#include "lib/runtime/nvme_tier.h"
#include "lib/runtime/offload_pipeline.h"
#include "lib/runtime/timeline.h"
#include "lib/runtime/zero_config.h"

namespace ds {

class ZeroParamStore : public ParamStore {
 public:
  // dp may be null for a single data-parallel rank.
  // groups: the sharding groups; empty: one group, `part` over `dp`.
  ZeroParamStore(const ModelLayout& layout, int num_layers, Device dev, Communicator* dp, const ZeroConfig& z,
                 const ZeroPartition& part, DType compute = DType::F32, DType grad = DType::F32,
                 std::vector<ShardGroup> groups = {});

  void begin_pass(const std::vector<int>& order) override;
  void end_pass() override;
  Tensor acquire_params(int unit) override;
  void release_params(int unit) override;
  Tensor acquire_grads(int unit) override;
  void grads_ready(int unit) override;
  void set_full_params(const Tensor& full) override;
  // Stage 3: the partition and the persistent units only (stage 2 keeps the
  // whole compute copy, so it takes the whole buffer).
  void init_params(int64_t total, const InitFill& fill) override;
  // `out` may be undefined on ranks that do not need the result (they still take part).
  void get_full_params(const Tensor& out) override;
  void gather_f32(Range r, const Tensor& out) override;

  // Optimizer side. Both views cover this rank's real range owned_real(rank)
  // (of group g's space with several sharding groups). In fp32 at stage 2
  // with several groups the master is full_params()' owned pieces (no view).
  // (undefined with offload_param nvme: the shard is state 0 of the tier;
  // host memory with offload_param cpu on a GPU, params_on_host())
  Tensor master_params(size_t g = 0);
  // offload_param cpu with a GPU model (stage 3): the parameter shard lives
  // in host memory; gathers copy the rank's piece to the device.
  bool params_on_host() const { return param_dev_.is_cpu() && dev_.is_cuda(); }
  // offload_param nvme: the tier whose state 0 holds this rank's parameter
  // shard of sharding group g (its owned real range of the group's space);
  // gathers, loads and saves read and write it there. Null: this rank owns
  // no element of the group.
  void set_param_tier(size_t g, NvmeStateTier* tier);
  bool params_elsewhere() const { return param_elsewhere_; }
  // offload_optimizer nvme at stage 3 with one sharding group and f32
  // accumulation (ZeRO-Infinity swaps the gradients too): the gradient shard
  // is state `state` of the optimizer's tier, never in memory. Each unit's
  // piece is written there as its reduction completes (the step's first
  // micro-batch) or read, added to and written back (later ones), in the
  // order and with the adds of the in-memory shard; the optimizer reads it
  // per sub-group. grad_shard() is then undefined.
  bool grads_elsewhere() const { return grad_elsewhere_; }
  void set_grad_tier(NvmeStateTier* tier, int state);
  NvmeStateTier* grad_tier() const { return grad_tier_; }
  int grad_state() const { return grad_state_; }
  // One sharding group: this rank's piece of each unit, in unit order, as
  // ranges of its gradient shard (empty pieces left out).
  std::vector<Range> own_unit_pieces() const;
  Tensor grad_shard(size_t g = 0);
  const std::vector<ShardGroup>& groups() const { return sgroups_; }
  Tensor full_params() { return full_; }  // stage 2 in fp32: the whole f32 weights
  void zero_grads();
  // Waits for every issued gradient reduce-scatter and adds it into the shard.
  void finish_reductions() { retire(true); }
  void set_timeline(Timeline* t) { timeline_ = t; }
  // After the optimizer step: stage 2 all-gathers the parameters; stage 3
  // refreshes the persistent units only (the next pass gathers the rest).
  void after_step();

  // Pipeline with tied embeddings: `unit`'s gradient accumulates over the
  // micro-batches in a full unit buffer (deferred_grads) instead of being
  // reduced at each grads_ready; flush_deferred() reduce-scatters it into the
  // shard once the caller has all-reduced it over the embedding group.
  void defer_unit(int unit);
  Tensor deferred_grads(int unit) const { return deferred_[unit]; }
  void flush_deferred();

  // Persistent bytes this rank holds (not the transient unit buffers).
  int64_t param_bytes() const {
    auto n = [](const Tensor& t) { return t.defined() ? t.numel() : int64_t(0); };
    int64_t b = 4 * n(full_) + 2 * n(compute_);
    for (const Group& g : g_) b += 4 * (n(g.master) + (params_on_host() ? 0 : n(g.shard)));  // device bytes
    return b;
  }
  int64_t grad_bytes() const {
    int64_t b = 0;
    for (const Group& g : g_) b += g.gshard.defined() ? static_cast<int64_t>(g.gshard.nbytes()) : 0;
    return b;
  }
  const Zero3Plan& plan() const { return plan_; }
  int64_t persistent_elems() const;
  // Most elements held at once in gathered parameter units (incl. persistent)
  // and in full unit gradients, since construction.
  int64_t peak_live_params() const { return peak_params_; }
  int64_t peak_live_grads() const { return peak_grads_; }

 private:
  // One sharding group's state.
  struct Group {
    int rank = 0;
    Tensor gshard;  // (shard) summed gradient shard, f32 or the compute dtype (grad_accum_dtype)
    Tensor master;  // stage 2 with bf16/f16: (shard) f32 master of this rank's range, zero padded
    Tensor shard;   // stage 3: (shard) this rank's parameters, zero padded
    FlatGather gather;  // stage 2 with overlap_param_gather: the post-step all-gather in flight
    std::vector<Range> unit_span;  // per unit: the group-space range of its elements
  };
  std::vector<ShardGroup> sgroups_;
  std::vector<Group> g_;
  // Group-space range of `unit` owned by `rank` in group gi (may be empty);
  // with one group the flat range.
  Range piece(int unit, int rank, size_t gi = 0) const;
  // Group-space range q of `unit`'s elements (inside unit_span) between the
  // unit buffer u (flat unit order) and a packed buffer.
  void pack_unit(size_t gi, int unit, Range q, const Tensor& u, const Tensor& dst) const;
  void wait_gathers();
  bool param_elsewhere_ = false;
  std::vector<NvmeStateTier*> param_tiers_;  // per sharding group (offload_param nvme)
  bool grad_elsewhere_ = false;
  NvmeStateTier* grad_tier_ = nullptr;  // (set_grad_tier) and its state
  int grad_state_ = 0;
  std::vector<char> unit_reduced_;  // per unit: reduced since zero_grads (its piece is in the tier)
  Tensor grad_scratch_;             // f32, a piece read from the tier and added to
  // `src` (the accumulator's dtype) added into group gi's shard at `offset`;
  // first: the first reduction of this piece since zero_grads.
  void add_into_shard(size_t gi, int64_t offset, const Tensor& src, bool first);
  static constexpr int64_t kTierChunk = 4 << 20;  // elements per piece written into the tier at init
  void read_own(size_t gi, int64_t lo, const Tensor& dst);  // shard positions [lo, lo + n) into dst
  void write_own(size_t gi, const Tensor& shard);           // the whole owned range
  void gather_unit(int unit, const Tensor& out);
  void gather_unit_compute(int unit, const Tensor& out);  // gather_unit, then cast to the compute dtype
  void refresh_compute();  // stage 2, mixed: compute_ <- master_ (own range), then all-gathered
  void fetch(int unit);     // issues the unit's gather (asynchronous)
  void complete(int unit);  // waits for it (and casts to the compute dtype)
  struct InFlight {  // a unit's issued gather
    std::vector<CommHandle> hs;
    Tensor f32;  // (unit) the gathered f32 values (the unit buffer itself in fp32)
    // Pieces of a group that are not one flat range: received into a packed
    // buffer, unpacked into f32 once the broadcasts completed.
    struct Packed {
      size_t group = 0;
      Range q;  // group-space range
      Tensor buf;
    };
    std::vector<Packed> packed;
    bool pending = false;
  };
  // Group-space range q of `unit`'s elements from a packed buffer into the unit buffer u.
  void unpack_unit(size_t gi, int unit, Range q, const Tensor& src, const Tensor& u) const;
  std::vector<InFlight> in_flight_;
  void free_gathered(int unit);
  bool needed_soon(int unit) const;
  void reduce_unit(int unit, const Tensor& g);
  // Pending reduce-scatters, oldest first: `recv`'s first `count` elements
  // are added at g_[group].gshard[offset] once `h` completed.
  struct PendingReduce {
    CommHandle h;
    Tensor recv;
    int64_t offset = 0, count = 0;
    size_t group = 0;
    bool first = false;  // the piece's first reduction since zero_grads
  };
  void retire(bool all);  // all: wait for every one; else only the completed front
  std::deque<PendingReduce> pending_;
  void gather_params(const Tensor& buf);  // stage 2: all-gathers buf (n) per group, asynchronously if so configured
  Timeline* timeline_ = nullptr;

  ZeroConfig z_;
  ZeroPartition part_;
  int stage_ = 2;
  Device dev_;
  Device param_dev_;  // where the stage-3 parameter shard lives (params_on_host)
  std::unique_ptr<OffloadCopier> pinner_;  // offload_param.pin_memory: owns the page-locking of the shards
  std::vector<Range> units_;
  Zero3Plan plan_;
  DType compute_dtype_ = DType::F32;
  Tensor full_;    // stage 2 in fp32: (n) full parameters (the master is its own range)
  Tensor compute_; // stage 2 with bf16/f16: (n) the compute-dtype weights the forward reads
  std::vector<Tensor> gathered_;  // stage 3: gathered or persistent full units (compute dtype)
  std::vector<Tensor> unit_grads_;
  std::vector<Tensor> deferred_;  // per unit: persistent full gradient (defer_unit) or undefined
  std::vector<int> order_;
  size_t cursor_ = 0;
  int64_t live_params_ = 0, live_grads_ = 0, peak_params_ = 0, peak_grads_ = 0;
};

}  // namespace ds
