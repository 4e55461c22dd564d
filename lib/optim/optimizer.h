// The optimizer interface: an optimizer owns named state tensors over one
// range [begin, end) of a flat parameter layout (a ZeRO shard, or all of it)
// and updates that range from its gradients. Everything above it (ZeRO,
// offload, checkpoints, TensorBoard's optimizer statistics) reaches the state
// through its names, and an optimizer is made from DeepSpeed's
// `optimizer.type` through one registry (make_optimizer). docs/ops.md lists
// the files a new optimizer touches.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/ops/step_scalars.h"
#include "lib/optim/optimizer_types.h"

namespace ds {

class Communicator;

// The per-step values of an update: the schedule's learning rate and weight
// decay, and the optimizer's coefficients (each optimizer reads the ones it
// has; OneCycle's cycle_momentum moves beta1 and beta2 every step).
struct StepHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
};

// One state tensor: its name (as checkpoints and DeepSpeed name it:
// "exp_avg", "exp_avg_sq", ...) and dtype; it covers the owned range.
struct OptimizerStateSpec {
  std::string name;
  DType dtype = DType::F32;
  bool non_negative = false;  // a mean of squares: checkpoints refuse negative values
};

// The tensors of one update, each covering the owned range (or, for
// step_part, the part): fp32 master weights and gradients, and optionally
// the bf16/f16 compute copy the update also writes.
struct StepTensors {
  Tensor params, grads;
  Tensor params_lowp;  // undefined: no low-precision copy to write
  // step_part of an optimizer whose state lives elsewhere (StateHome::Elsewhere):
  // the part's state tensors, host f32, in state_specs() order.
  std::vector<Tensor> states;
};

// Where an optimizer's state tensors live: its own (allocated with it), or
// elsewhere (the NVMe tier, lib/runtime/nvme_tier.h): then it allocates
// nothing, has no named state, and updates only in parts (step_part) with
// the part's state handed in.
enum class StateHome { Own, Elsewhere };

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // DeepSpeed's optimizer.type this class implements ("AdamW", ...).
  virtual const char* type() const = 0;
  // The state it keeps per element of the range, in checkpoint order.
  virtual std::vector<OptimizerStateSpec> state_specs() const = 0;
  // One update of the whole range; grad_scale multiplies every gradient
  // first (clipping, loss-scale unscaling). Counts a step.
  virtual void step(const StepTensors& t, const StepHyper& h, float grad_scale, const Stream& s = Stream{}) = 0;
  // Element-wise optimizers: the update of [lo, hi) of the range alone, with
  // the step count already advanced (offload updates bucket by bucket and
  // gets the bits of one whole step). Others return false and do nothing.
  virtual bool step_part(int64_t lo, int64_t hi, const StepTensors& t, const StepHyper& h, float grad_scale) = 0;
  // The update gated on the device (CUDA graphs): its per-step values are
  // read from `scalars` ((AdamWSlot::Count) f32 on the state's device,
  // lib/ops/step_scalars.h) when it runs, nothing happens when the block's
  // skip flag is set, and the step count does not move (count_step() once
  // the host knows the step was applied). Optimizers without it return false
  // from has_gated_step().
  virtual bool has_gated_step() const { return false; }
  virtual void step_gated(const StepTensors& t, const StepHyper& h, const Tensor& scalars, const Stream& s = Stream{});
  // The values the host writes into the block for the next gated step.
  virtual AdamWTerms next_terms(const StepHyper& h) const;

  // A rank whose range is empty (a ZeRO shard of padding only) calls this
  // instead of step: it counts the step and joins the collectives the step
  // of the others makes (Lamb's per-tensor norms).
  virtual void step_empty_range() { count_step(); }
  // ZeRO: the range is one shard of a data-parallel group; `sum` adds a
  // small f32 tensor on the state's device over that group in place. An
  // optimizer whose update needs whole-tensor values (Lamb's norms) sums its
  // per-tensor partial sums with it; element-wise ones ignore it.
  void set_shard_sum(std::function<void(const Tensor&)> sum) { shard_sum_ = std::move(sum); }

  // The value every element of state i starts at (Adagrad's
  // initial_accumulator_value; 0 for the rest).
  virtual float initial_state_value(size_t) const { return 0.f; }
  // The state lives elsewhere (StateHome::Elsewhere): states() is empty.
  bool state_elsewhere() const { return elsewhere_; }

  // The state tensor named `name`; ds::Error when there is none.
  Tensor& state(std::string_view name);
  bool has_state(std::string_view name) const;
  // Every state tensor, in state_specs() order.
  std::vector<Tensor> states() const;
  int64_t state_bytes() const;

  void count_step() { ++step_; }
  int64_t step_count() const { return step_; }  // applied steps
  // A loaded checkpoint's step count (the 1-bit family picks its phase from it).
  virtual void set_step_count(int64_t s) { step_ = s; }
  // The 1-bit family (ZeRO stage 0): after the warm-up the gradients stay
  // local, not all-reduced (the optimizer exchanges its compressed momentum
  // over the data-parallel group set here instead).
  virtual bool gradients_stay_local() const { return false; }
  virtual void set_data_parallel(Communicator*) {}
  // Per-tensor values a checkpoint keeps beside the state tensors (1-bit
  // Lamb's frozen trust ratios in its compression stage): a JSON text, ""
  // when there are none. load_scalars gets that text back after the states
  // and the step count were loaded (the same tensor and pipeline layout only:
  // a reshaped load with such values is refused).
  virtual std::string saved_scalars() const { return ""; }
  virtual void load_scalars(const std::string&) {}
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  const ModelLayout& layout() const { return *layout_; }

 protected:
  Optimizer(const ModelLayout& layout, int64_t begin, int64_t end);
  // Allocates every state of state_specs() (zeros, counted as model state);
  // called by the concrete class's constructor. StateHome::Elsewhere: nothing.
  void allocate_state(Device dev, StateHome home = StateHome::Own);
  // State i over the part [lo, hi) of the range for step_part: the handed-in
  // t.states[i] (state elsewhere) or a view of the own tensor.
  Tensor part_state(const StepTensors& t, size_t i, int64_t lo, int64_t hi);
  void check_range(const StepTensors& t, int64_t n, const char* what) const;
  // The parameters' parts in [first, last) of the flat layout, sorted by
  // offset, relative to `first`, each with its decay flag and its index in
  // layout().params.
  struct Segment {
    int64_t begin, end;
    bool decay;
    int param;
  };
  std::vector<Segment> segments_in(int64_t first, int64_t last) const;
  // (S, 3) i64 {begin, end, decay} rows of `segs` on `dev` (undefined when empty).
  static Tensor segment_table(const std::vector<Segment>& segs, Device dev);
  int64_t step_ = 0;
  std::function<void(const Tensor&)> shard_sum_;  // empty: the range is not a shard

 private:
  const ModelLayout* layout_;
  int64_t begin_, end_;
  std::vector<std::pair<std::string, Tensor>> state_;
  bool elsewhere_ = false;
};

// The registry: an optimizer of DeepSpeed's `optimizer.type` (case-insensitive,
// the table in optimizer_types.cpp, with its own keys in `spec`) for elements
// [begin, end) of `layout`, its state on `dev` (or elsewhere: then the
// optimizer must update in parts; DS_CHECK for Lamb). UserError naming the
// type and the supported ones for anything else.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, const ModelLayout& layout, Device dev,
                                          int64_t begin, int64_t end, StateHome home = StateHome::Own);
inline std::unique_ptr<Optimizer> make_optimizer(std::string_view type, const ModelLayout& layout, Device dev,
                                                 int64_t begin, int64_t end) {
  return make_optimizer(OptimizerSpec{.type = std::string(type)}, layout, dev, begin, end);
}

}  // namespace ds
