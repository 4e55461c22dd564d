// What DeepSpeed's three optimizers with compressed communication (1-bit
// Adam, 0/1 Adam and 1-bit Lamb; runtime/fp16/onebit/) share at ZeRO stage
// 0: the data-parallel group their exchange runs
// over, the switch that keeps a step's gradients local (the trainer then
// skips their all-reduce and leaves them the rank's own mean, as DeepSpeed's
// engine does), the first step of a process that only initialises, and the
// error-feedback buffers of the 1-bit exchange (lib/optim/onebit_exchange.h). Those
// buffers live with the optimizer only: a checkpoint holds the moments, and
// a resumed run starts with fresh errors, as DeepSpeed resets them on load.
#pragma once
#include <vector>

#include "lib/optim/onebit_exchange.h"
#include "lib/optim/optimizer.h"

namespace ds {

class OneBitFamily : public Optimizer {
 public:
  bool step_part(int64_t, int64_t, const StepTensors&, const StepHyper&, float) override { return false; }
  bool gradients_stay_local() const override { return local_; }
  void set_data_parallel(Communicator* dp) override { dp_ = dp; }

 protected:
  // per_group: the compression units are the parameter groups (decay, no
  // decay) rather than the tensors (OptimizerSpec::compress_param_groups).
  // Each runs where its state lives (on a GPU: the exchange over NCCL).
  OneBitFamily(const ModelLayout& layout, Device dev, int64_t begin, int64_t end, bool per_group = false);
  int ranks() const { return dp_ ? dp_->size() : 1; }
  // x (the range's elements) <- each compression unit's elements replaced by
  // their compressed mean over the data-parallel ranks, with the errors of
  // that unit: each parameter tensor (DeepSpeed's per-parameter exchange), or
  // each parameter group's tensors one after the other (per_group). One
  // rank: unchanged.
  void exchange_units(const Tensor& x);  // x: the range's f32 elements, on the state's device
  // x <- the compressed mean of the whole range as one tensor (1-bit Lamb's
  // flattened momentum).
  void exchange_whole(const Tensor& x);  // x: the range's f32 elements, on the state's device
  // Fresh (zero) errors for the next exchange.
  void reset_errors() { errors_.clear(); }

  std::vector<Segment> segs_;  // the parameter tensors of the range
  Tensor seg_table_;           // segs_ as optim_step's (S, 3) table on the state's device
  bool local_ = false;         // this step's gradients stay local
  bool initialized_ = false;   // the process's first step (the initialising one) is done

 private:
  std::vector<std::vector<Segment>> units_;  // each unit's segments, in order
  Tensor gathered_;                          // a group unit's elements, one after the other
  std::vector<OneBitErrors> errors_;
  Communicator* dp_ = nullptr;
};

}  // namespace ds
