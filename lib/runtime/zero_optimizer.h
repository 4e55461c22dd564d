// Data-parallel gradient reduction and the optimizer step for ZeRO stages 0-3.
//   stage 0: bucketed all-reduce of the flat gradients, every rank updates everything.
//   stage 1: same reduction; each rank keeps Adam state for its shard only,
//            updates that shard and all-gathers the parameters (bucketed).
//   stage 2: gradients live per unit only while a unit's backward runs and are
//            reduce-scattered into a gradient shard right away (ZeroParamStore);
//            then as stage 1.
//   stage 3: parameters sharded too (ZeroParamStore gathers units on use); the
//            optimizer updates the parameter shard in place, nothing is gathered
//            after the step except the persistent units.
// Shards are ranges of the padded ZeroPartition, so every collective works on
// equal chunks.
// overlap_comm (stages 0/1, dp > 1): during the backward of the step's last
// micro-batch, each all-reduce bucket is issued asynchronously as soon as
// every parameter unit it covers has its gradient ready (buckets complete from
// the end of the flat buffer); reduce_gradients_into() issues the rest and waits.
// Each bucket is the same collective on the same data as without overlap, so
// the result is bit-identical. Stages 2/3 overlap inside ZeroParamStore. The 1/dp averaging is folded into the loss weight by the trainer.
// offload_optimizer.device = cpu with a CUDA model: Adam m and v and an fp32
// copy of this rank's master range live in host memory and the AdamW update
// runs there (the OpenMP CPU kernel); each step copies the gradient range to
// the host and the updated master range back, in buckets that overlap the
// update (OffloadPipeline, offload_pipeline.h). On the CPU backend nothing
// moves: the optimizer runs as without offload (the trainer says so).
// offload_optimizer.device = nvme (stage 3): the optimizer's state lives in
// a swap file (NvmeStateTier) and the step updates the range one sub-group
// at a time, reading each sub-group's state in and writing it back;
// Optimizer::step_part makes it the same bits as the whole update. With a
// CUDA model the update runs on the host as for cpu, each sub-group's
// gradients and fp32 master copied through two host buffer pairs
// (OffloadPipeline::step_tier); the master shard stays on the device.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/gpt.h"
#include "lib/optim/optimizer.h"
#include "lib/parallel/zero_partition.h"
#include "lib/runtime/nvme_tier.h"
#include "lib/runtime/offload_pipeline.h"
#include "lib/runtime/timeline.h"
#include "lib/runtime/zero_config.h"
#include "lib/runtime/zero_store.h"

namespace ds {

class ZeroOptimizer {
 public:
  // dp may be null for a single data-parallel rank. Stages 2 and 3 need the
  // model to be built on `store` (a ZeroParamStore of the same partition).
  // optimizer: DeepSpeed's optimizer.type and its keys (make_optimizer's registry).
  ZeroOptimizer(GptModel& model, Communicator* dp, const ZeroConfig& z, const ZeroPartition& part,
                ZeroParamStore* store, const OptimizerSpec& optimizer);

  // Tensor / pipeline parallelism: this rank's share of the squared gradient
  // norm (reduce_gradients_into) sums squares over the flat ranges `counted`
  // of its (local) layout only, chosen so that over the model-parallel ranks
  // split weights count once per shard and replicated ones (and a tied wte
  // held by two stages) once in all.
  void set_norm_counted(std::vector<Range> counted);
  // Expert parallelism, stages 0 and 1: `dp` is the expert-data-parallel
  // group (the ranks holding the same experts). The flat ranges of the
  // experts group (sorted, disjoint) are all-reduced over it, the dense rest
  // over all the data-parallel ranks, `dense_dp` (may be null: one rank).
  // The norm counts every expert and every dense weight once. Stages 2 and 3
  // reduce each sharding group over its own ranks in the store instead.
  void set_expert_reduce(std::vector<Range> ranges, Communicator* dense_dp);

  // Clears the gradients before the first micro-batch of a step.
  void zero_grads();
  // The next backward is the last of the step: with overlap_comm, its
  // completed buckets are reduced while it runs (no-op otherwise).
  void begin_last_micro_batch();
  // A step interrupted by an exception before reduce_gradients_into (a CUDA
  // graph capture that failed midway): waits for what it issued and disarms
  // the overlap, so the step can run again.
  void abandon_step();
  // Stages 0/1 with overlap_comm: the buckets covering `unit` are not reduced
  // during the backward but by reduce_gradients_into (the tied embedding of a
  // pipeline, all-reduced across its first and last stage in between).
  void hold_unit(int unit) { held_units_.push_back(unit); }
  bool overlaps_grad_reduce() const { return overlap_; }
  // This step's gradients are not all-reduced (1-bit Adam after its warm-up).
  bool gradients_stay_local() const { return opt_ && opt_->gradients_stay_local(); }
  // Records backward unit spans and the gradient collectives (may be null).
  void set_timeline(Timeline* t);
  // After the backward passes of a step: sums the gradients over the
  // data-parallel group (as the stage requires) and ADDS this rank's share of
  // the squared global norm (loss scale still in) to `sumsq` ((1) f32 on the
  // device), so that the sum of the shares over the world is the squared norm
  // and nothing is read back here (docs/distributed.md, host synchronisations
  // per step). The share: the counted ranges of what this rank holds (tensor /
  // pipeline parallel), its ZeRO-2/3 shard, and with stages 0/1 (every
  // data-parallel rank holds the same summed gradients) nothing on a rank
  // other than the group's first. On the GPU its collectives are waited for
  // by the compute stream: poll (Communicator::synchronize) before reading
  // anything back.
  void reduce_gradients_into(const Tensor& sumsq);
  // Gradients that stay local (the 1-bit family, stage 0): this rank's own
  // share of their sum of squares (what reduce_gradients_into adds on the
  // first data-parallel rank only), for the rank's own clipping.
  void local_norm_into(const Tensor& sumsq);
  // Sets `flag` ((1) f32) nonzero if a gradient this rank holds (all of them,
  // or its ZeRO-2/3 shard) is inf/nan; no collective (the caller sums the
  // flags over the world with the rest of the step's statistics).
  void grads_nonfinite_into(const Tensor& flag);

  // The optimizer on this rank's range, then the parameters the stage keeps
  // whole are made current again (stage 1/2 all-gather, stage 3 persistent units).
  void step(const StepHyper& h, float grad_scale);
  // The same with the update gated on the device: the optimizer reads its per-step
  // values from `scalars` (lib/ops/step_scalars.h; h gives the betas and eps)
  // and changes nothing when the block's skip flag is set, so nothing here
  // depends on the step's statistics on the host (a CUDA graph can hold it).
  // Not with offload (the update runs on the host there). Adam's step count
  // is left to the caller (Optimizer::count_step once the step is known
  // applied). The optimizer must have a gated step (Optimizer::has_gated_step).
  void step_gated(const StepHyper& h, const Tensor& scalars);
  // The optimizer (with several sharding groups: the first group's; every
  // group's optimizer has the same type, hyper-parameters and step count).
  Optimizer& optimizer() { return grouped() ? *groups_[0].opt : *opt_; }
  Range optimizer_range() const { return range_; }  // unpadded, may be empty (one sharding group)
  // The fp32 master weights this rank updates (undefined when the range is
  // empty); with several sharding groups, one tensor per group.
  std::vector<Tensor> master_ranges();
  // Every optimizer state tensor this rank holds (every group's).
  std::vector<Tensor> optimizer_states();
  void set_step_count(int64_t n);
  void count_step();
  // What this rank's optimizer state covers, per optimizer: the sharding
  // group's name ("" for one group), the flat pieces of the local layout
  // its state tensors hold one after the other, and the optimizer.
  struct StatePart {
    std::string group;
    bool ep_shared = false;  // ShardGroup::ep_shared
    std::vector<Range> pieces;
    Optimizer* opt = nullptr;
    // offload_optimizer nvme: the state lives here (from state
    // tier_state_offset() on), not in opt's tensors; null otherwise or when
    // the rank owns none of the group.
    NvmeStateTier* tier = nullptr;
  };
  std::vector<StatePart> state_parts();
  // ZeRO 1-3 with several sharding groups (FlatParamStore::shard_groups,
  // ZeroParamStore::groups: the dense weights over every data-parallel
  // rank, the experts over the expert-data-parallel ones): one optimizer per group.
  bool grouped() const { return !groups_.empty(); }
  // Bytes of model state this rank holds (params, grads, Adam m and v);
  // persistent buffers only, not the transient per-unit ones.
  ModelStateBytes model_state_bytes() const;
  // offload: the bucketed step; buckets of reduce_bucket_size elements, at
  // most kOffloadBucketMax (two host gradient buffers of 64 MiB).
  static constexpr int64_t kOffloadBucketMax = 16 << 20;
  static int64_t offload_bucket(const ZeroConfig& z) { return std::min(z.reduce_bucket_size, kOffloadBucketMax); }
  // offload: the host buffers of the offloaded step besides Adam m and v (the
  // fp32 master copy and the gradient buckets, OffloadPipeline::host_bytes_for;
  // with nvme the tiers' buffers, and on a GPU step_tier's buffer pairs),
  // allocated at the first step; 0 without offload.
  int64_t offload_host_bytes() const;
  // offload_optimizer.device nvme (stage 3): each optimizer's
  // state (one per sharding group) lives in an NVMe tier of its own, the step
  // runs sub-group by sub-group through it (sub_group_size), and
  // optimizer_states() is empty. The tiers of this rank (none where it owns
  // no element; state_parts() says which part each one holds).
  std::vector<NvmeStateTier*> nvme_tiers() const;
  // The tier's first optimizer state: 1 when state 0 is the parameter shard
  // (offload_param nvme), else 0.
  int tier_state_offset() const { return params_in_tier_ ? 1 : 0; }
  // Whether the gradient shard is the tier's last state (one sharding group,
  // f32 accumulation).
  bool grads_in_tier() const { return grads_in_tier_; }
  // Whether the NVMe tier's state holds NaN/Inf (reads it through; false
  // without a tier). No collective.
  bool offloaded_state_nonfinite();

 private:
  GptModel& model_;
  Communicator* dp_;
  ZeroConfig z_;
  ZeroPartition part_;
  ZeroParamStore* store_;
  bool counted_only_ = false;    // tp / pp: the norm share covers counted_ only
  std::vector<Range> counted_;  // flat ranges this rank adds to the norm
  int rank_ = 0;
  Range range_;
  std::unique_ptr<Optimizer> opt_;
  bool offload_ = false;  // a CUDA model whose optimizer runs on the host (cpu or nvme)
  bool nvme_ = false;     // offload_optimizer.device nvme: the state in tier_
  bool params_in_tier_ = false;  // offload_param nvme: the parameter shard is tier_'s state 0
  bool grads_in_tier_ = false;   // the gradient shard is tier_'s last state (ZeroParamStore::grads_elsewhere)
  std::unique_ptr<NvmeStateTier> tier_;
  Tensor tier_grads_nonfinite_;  // (1) f32: the last gradient pass over the tier found NaN/Inf
  Tensor norm_window_;           // f32 scratch of that pass
  bool fused_lowp_ = false;  // the optimizer writes the bf16/f16 compute copy (no separate cast pass)
  // offload: (range) f32 host copy of the master range, read from the device
  // at the first step (after init or load), then the only one the update writes.
  Tensor host_master_;
  std::unique_ptr<OffloadPipeline> offload_pipe_;

  void after_update();  // the parameters the stage keeps whole made current again
  Tensor master_range();  // one sharding group: the f32 master of range_ (undefined when empty)

  // Sharding groups (grouped()): each group's optimizer works on its packed
  // layout (packed_layout) over the group-space range the rank owns; its
  // master is the flat store's group_master, its gradients and (mixed
  // precision) compute copy are the flat buffers' owned pieces, packed for
  // the update and written back.
  struct GroupOpt {
    ShardGroup g;
    // The optimizer keeps a reference to its layout: held apart so that it
    // stays put when the GroupOpt moves.
    std::unique_ptr<const ModelLayout> layout;
    Range owned;                            // group-space positions
    std::vector<GroupSpace::Piece> pieces;  // flat pieces of owned (at: group space)
    std::unique_ptr<Optimizer> opt;
    std::unique_ptr<NvmeStateTier> tier;  // offload_optimizer nvme (make_tier)
  };
  std::vector<GroupOpt> groups_;
  // offload_optimizer nvme: the tier of an optimizer's range of n elements
  // (swap file named after the group), state 0 the parameter shard with
  // offload_param nvme, the last one the gradient shard with grads; null
  // when n is 0 or nothing is to be held.
  std::unique_ptr<NvmeStateTier> make_tier(const Optimizer& opt, int64_t n, const std::string& group,
                                          bool grads = false);
  // Stage 3, one sharding group: the gradient shard's sum of squares (and,
  // with the shard in the tier, its NaN/Inf check) window by window.
  void add_shard_sumsq(const Tensor& sumsq);
  // The update of [0, n) one sub-group at a time through `tier` (null: a
  // stateless optimizer in one part); params undefined when they live in the tier.
  void step_through_tier(Optimizer& opt, NvmeStateTier* tier, const Tensor& params, const Tensor& grads, int64_t n,
                         const StepHyper& h, float grad_scale);
  void step_groups(const StepHyper& h, float grad_scale);
  void group_norm_share(const Tensor& sumsq);

  // Expert parallelism (set_expert_reduce)
  bool experts_apart_ = false;
  std::vector<Range> expert_ranges_;
  Communicator* dense_dp_ = nullptr;  // the dense weights' reduction group (all data-parallel ranks)
  // Squared-norm share of this rank under expert parallelism (see set_expert_reduce).
  void expert_norm_share(const Tensor& sumsq);
  void add_own_sumsq(const Tensor& sumsq);  // this rank's (counted) gradients' sum of squares
  // Calls fn(piece, expert) for the pieces of r inside and outside the expert ranges, in order.
  template <class Fn>
  void for_each_group_piece(Range r, Fn fn) const;
  // Issues the all-reduces of flat range r over the groups its pieces reduce over.
  void all_reduce_range(Range r, std::vector<CommHandle>* async);

  // overlap_comm, stages 0/1 (see above)
  void on_grads(int unit, bool ready);
  void issue_bucket(int b);
  bool overlap_ = false, armed_ = false;
  std::vector<Range> buckets_;
  std::vector<std::vector<int>> bucket_units_;  // non-empty units each bucket intersects
  std::vector<char> unit_ready_;
  std::vector<int> held_units_;  // never marked ready during the backward
  int next_bucket_ = -1;  // buckets are issued from the last one down
  std::vector<CommHandle> pending_;
  Timeline* timeline_ = nullptr;
  std::vector<double> unit_begin_us_;
};

}  // namespace ds
