// Where a GptModel's parameters and gradients live. The model never touches a
// flat buffer directly: it asks a ParamStore for one parameter *unit* at a time
// (the embeddings, each transformer layer, the final norm + head; each one
// contiguous range of the flat layout). The default FlatParamStore keeps
// today's single flat buffers; ZeRO-2/3 (lib/runtime/zero_store.h) keep only
// shards and materialise a unit's full parameters / gradients while it runs.
//
// Call protocol, per pass (forward_backward = one pass, forward_loss = one):
//   begin_pass(order)        the unit order of every acquire_params in this pass
//   acquire_params(u) ... release_params(u)    around each use of u's weights
//   acquire_grads(u)  ... grads_ready(u)       around u's backward (tied
//                                              embeddings: from the logits
//                                              backward to the embedding backward)
//   end_pass()
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/parallel/flat_gather.h"
#include "lib/parallel/group_space.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// Unit ranges of a layout, in forward order: [0] embeddings (layer -1),
// [1 + l] layer l, [L + 1] final norm (+ head). Units a pipeline stage does not
// hold are empty (size 0); all others are non-empty.
std::vector<Range> unit_ranges(const ModelLayout& layout, int num_layers);
inline int unit_of(const ParamSpec& p) { return p.layer + 1; }

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Every unit of a pass, in the order acquire_params will be called (lets a
  // store prefetch ahead and keep a unit that is needed again at once).
  virtual void begin_pass(const std::vector<int>& order) = 0;
  virtual void end_pass() = 0;
  // The unit's full parameters (unit size, f32), valid until release_params.
  virtual Tensor acquire_params(int unit) = 0;
  virtual void release_params(int unit) = 0;
  // The unit's full gradient (unit size, f32); the backward ADDS into it.
  virtual Tensor acquire_grads(int unit) = 0;
  // The unit's gradient of this micro-batch is complete.
  virtual void grads_ready(int unit) = 0;
  // Full parameters (layout total, host or device) <-> the store. Collective
  // for a sharded store (every rank calls; get_full fills `out` on every rank).
  virtual void set_full_params(const Tensor& full) = 0;
  virtual void get_full_params(const Tensor& out) = 0;
  // The initial weights, computed where they are kept: fill(begin, end, out)
  // writes the f32 values of [begin, end) of the flat layout (of `total`
  // elements) to host memory `out`. A store asks only for what it holds (no
  // collective): the whole buffer by default (then set_full_params), a
  // ZeRO-3 store its partition and its persistent units (DeepSpeed's
  // zero.Init), so no rank materialises what it does not keep.
  using InitFill = std::function<void(int64_t begin, int64_t end, float* out)>;
  virtual void init_params(int64_t total, const InitFill& fill);
  // The f32 weights of flat range r into `out` (r.size(), on the store's
  // device), on every rank: a store that keeps only a data-parallel shard of
  // them gathers the range from its owners (collective over that group:
  // every rank calls with the same ranges). A checkpoint save streams the
  // model this way, one weight at a time.
  virtual void gather_f32(Range r, const Tensor& out) = 0;
  // Mixed precision: the f32 master weights changed outside the store (the
  // optimizer wrote them); refresh the compute-dtype copy the forward reads.
  virtual void params_updated() {}
  // A pass was interrupted by an exception (a CUDA graph capture that failed
  // midway: none of its device work ran): forget every unit acquired since
  // begin_pass without adding its gradient, so the next pass starts clean.
  // Only stores used with --cuda-graph implement it.
  virtual void abandon_pass() { DS_CHECK(false, "this parameter store cannot abandon a pass"); }

  // Observer of the backward pass: (unit, false) when a unit's gradient is
  // acquired (its backward begins), (unit, true) when it is ready. The data-
  // parallel overlap starts bucket reductions from it; the profile timeline
  // records compute spans. Every store calls it.
  using GradsHook = std::function<void(int unit, bool ready)>;
  void set_grads_hook(GradsHook h) { grads_hook_ = std::move(h); }

 protected:
  void notify_grads(int unit, bool ready) {
    if (grads_hook_) grads_hook_(unit, ready);
  }

 private:
  GradsHook grads_hook_;
};

// A ZeRO-1 sharding group: the part of the flat layout (its group space,
// group_space.h) whose weights are partitioned over one data-parallel group.
// One identity group covers the whole model; with expert parallelism the
// dense weights are one group over every data-parallel rank and the experts
// another over the expert-data-parallel ranks (DeepSpeed's partitioning).
struct ShardGroup {
  std::string name;            // the parameter group(s) it holds ("dense", "experts"; "" for all)
  // The same tensors on every expert-parallel rank (the dense weights): its
  // partition spans them, so a checkpoint reads its state from all of their files.
  bool ep_shared = false;
  Communicator* dp = nullptr;  // null: one rank
  GroupSpace space;
  ZeroPartition part;  // over space.total()
  int rank() const { return dp ? dp->rank() : 0; }
  Range owned() const { return part.owned_real(rank()); }  // group-space positions
};

// How a FlatParamStore keeps the weights and gradients beyond the compute
// dtype. The defaults are one f32 gradient buffer and, in mixed precision, a
// full f32 master.
struct FlatStoreOptions {
  // The persistent gradient accumulator: f32 (data_types.grad_accum_dtype
  // fp32) or the compute dtype. With the compute dtype the backward still
  // adds into an f32 gradient of the running unit (transient); grads_ready
  // rounds it and adds it into the accumulator.
  DType grad = DType::F32;
  // ZeRO-1 in mixed precision: the f32 master covers only this rank's
  // optimizer range part.owned_real(dp->rank()); the owners' updated compute
  // copies are all-gathered (in the compute dtype, allgather_bucket elements
  // per collective). Null dp: the master covers every weight.
  // ZeRO-1 (any precision): the data-parallel group gather_owned() all-gathers over.
  Communicator* dp = nullptr;
  ZeroPartition part;
  // Instead of dp / part: several sharding groups covering the layout
  // together; each rank's f32 master (mixed precision) is its owned range of
  // every group, packed group after group, and gather_owned() all-gathers
  // each group over its own ranks.
  std::vector<ShardGroup> groups;
  int64_t allgather_bucket = 0;
  // gather_owned() only issues the all-gather; acquire_params(u) completes the
  // chunks that write into unit u (Megatron's --overlap-param-gather).
  bool overlap_param_gather = false;
  // A model that never runs a backward (a distillation teacher): no gradient
  // buffer is allocated; acquiring gradients is then an error.
  bool forward_only = false;
};

// init_params without a host copy of the whole model: the init values of
// flat range r written into `dst` (r.size() elements on any device) chunk by
// chunk, straight where dst is f32 host memory, else through `staging` (host,
// at most kInitChunk f32 elements, allocated on first use), cast to dst's
// dtype where it is bf16/f16.
inline constexpr int64_t kInitChunk = int64_t(4) << 20;
void init_fill_into(const ParamStore::InitFill& fill, Range r, const Tensor& dst, Tensor& staging);

// One flat params buffer and one flat grads buffer; acquire returns views and
// nothing moves. Gradients accumulate until zero_grads(). With a bf16/f16
// compute dtype a second flat buffer holds the weights in that dtype (what
// acquire_params returns) and the f32 buffer is the master the optimizer
// updates: all of it, or with FlatStoreOptions::dp only this rank's range.
class FlatParamStore : public ParamStore {
 public:
  FlatParamStore(const ModelLayout& layout, int num_layers, Device dev, int64_t alloc_elems,
                 DType compute = DType::F32, FlatStoreOptions opts = {});
  void begin_pass(const std::vector<int>&) override {}
  void end_pass() override {}
  Tensor acquire_params(int unit) override;
  void release_params(int) override {}
  Tensor acquire_grads(int unit) override;
  void grads_ready(int unit) override;
  // With a sharded master, get_full_params and params_updated are collective
  // over the data-parallel group.
  void set_full_params(const Tensor& full) override;
  void get_full_params(const Tensor& out) override;
  // Through init_fill_into: never a host copy of the rank's whole model.
  void init_params(int64_t total, const InitFill& fill) override;
  void params_updated() override;
  void abandon_pass() override;
  void gather_f32(Range r, const Tensor& out) override;

  // ZeRO-1, after the owners updated their ranges of the weights the forward
  // reads (the compute copy, or the f32 weights in fp32): all-gathers them
  // over FlatStoreOptions::dp (asynchronously with overlap_param_gather).
  void gather_owned();
  bool gathers() const { return !groups_.empty(); }
  // The sharding groups (empty without ZeRO-1 over several ranks).
  const std::vector<ShardGroup>& shard_groups() const { return groups_; }

  // Is the f32 buffer the whole model (fp32, or a full master)?
  bool full_master() const { return full_master_; }
  // The accessors below complete a pending parameter all-gather first.
  Tensor& params();  // (alloc) f32, layout total first; full_master() only
  // One sharding group: the flat range the f32 master covers.
  Range master_range() const;
  Tensor master(Range r);  // f32 master of the flat range r (inside one owned piece)
  // Sharded master: group g's owned range (ShardGroup::owned), packed.
  Tensor group_master(size_t g);
  Tensor& grads() { return grads_; }    // (alloc) in the gradient dtype
  Tensor& compute_params();  // (total) bf16/f16 copy; undefined in fp32
  // Persistent bytes of the buffers (what their allocation counted).
  int64_t param_bytes() const;
  int64_t grad_bytes() const { return static_cast<int64_t>(grads_.nbytes()); }

 private:
  std::vector<Range> units_;
  int64_t total_ = 0;
  FlatStoreOptions opts_;
  std::vector<ShardGroup> groups_;
  bool full_master_ = true;
  // The flat pieces the f32 buffer holds: [0, alloc) for a full master, else
  // each group's owned pieces (Piece::at = the offset in params_).
  std::vector<GroupSpace::Piece> master_;
  std::vector<int64_t> group_off_;  // sharded master: group g's offset in params_
  Tensor params_;   // (alloc) f32 weights / full master, or the owned pieces packed
  Tensor grads_;    // (alloc) gradient accumulator, f32 or the compute dtype
  Tensor compute_;  // (total) bf16/f16 copy of the weights, or undefined in fp32
  std::vector<Tensor> unit_f32_;  // compute-dtype accumulation: the running units' f32 gradients
  std::vector<FlatGather> gather_;  // per group, overlap_param_gather: the all-gathers gather_owned() issued
  void wait_gathers();
};

// Range r of a flat buffer whose owned part (part.owned(rank), padded
// coordinates) each rank of `dp` keeps in `shard` (starting at that part's
// begin): each owner broadcasts its piece of r into `out` (r.size()) on
// every rank. dp may be null for one rank.
void gather_from_shards(Communicator* dp, const ZeroPartition& part, int rank, const Tensor& shard, Range r,
                        const Tensor& out);
// The same with this rank's piece read by own(lo, dst) (lo: the piece's
// offset in the rank's part) instead of from a tensor (a shard kept in a
// storage tier).
void gather_from_shards(Communicator* dp, const ZeroPartition& part, int rank, Range r, const Tensor& out,
                        const std::function<void(int64_t lo, const Tensor& dst)>& own);

}  // namespace ds
