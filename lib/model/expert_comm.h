// Expert parallelism's token exchange (DeepSpeed-MoE): a MoE layer's rank
// dispatches its tokens into one buffer per expert, (E, R, C) with R rows
// each (the capacity), and the experts live on EP ranks, E / EP each. One
// all-to-all over the expert-parallel group sends block j of experts to
// rank j; each rank then holds, per local expert, the R rows of every source
// rank, which it lays out as one (EP * R)-row buffer per expert so that an
// expert's GEMMs run once over all of them. The reverse exchange returns the
// outputs to the ranks the tokens came from, in the (E, R, C) order the
// combine reads. With EP = 1 nothing moves (the caller uses one buffer).
#pragma once
#include <chrono>
#include <functional>

#include "lib/comm/communicator.h"
#include "lib/core/tensor.h"

namespace ds {

struct EpComm {
  Communicator* comm = nullptr;  // not owned; null when size == 1
  int size = 1, rank = 0;
  // Called after each all-to-all with its name and host times (the trainer's
  // --profile timeline); may be empty. On a GPU the times are the enqueue's.
  using Clock = std::chrono::steady_clock;
  std::function<void(const char* what, Clock::time_point begin, Clock::time_point end)> trace;
  bool active() const { return size > 1; }
};

// by_expert (E, R, C): this rank's tokens per expert -> by_local (El, EP*R, C):
// each local expert's rows from source ranks 0..EP-1 in turn. scratch: E*R*C
// elements of the same dtype (the all-to-all's receive buffer).
void experts_scatter(const EpComm& ep, const Tensor& by_expert, const Tensor& scratch, const Tensor& by_local);
// The inverse: by_local (El, EP*R, C) -> by_expert (E, R, C) on the source ranks.
void experts_gather(const EpComm& ep, const Tensor& by_local, const Tensor& scratch, const Tensor& by_expert);

}  // namespace ds
