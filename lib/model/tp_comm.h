// Tensor-parallel communication of the model: Megatron's paired regions as
// plain functions over this rank's tp Communicator (passed in, never global).
//   copy_to_tp:     forward identity,   backward all-reduce (sum) over tp.
//     Entry of a column-parallel linear: the replicated input feeds every
//     rank's slice, so its gradient is the sum of the ranks' partial ones.
//   reduce_from_tp: forward all-reduce, backward identity.
//     Exit of a row-parallel linear (and of the vocab-parallel embedding):
//     each rank holds a partial sum of the output.
// With tp = 1 (or no communicator) every function is a no-op.
#pragma once
#include "lib/comm/communicator.h"
#include "lib/core/tensor.h"

namespace ds {

struct TpComm {
  Communicator* comm = nullptr;  // not owned; null when size == 1
  int size = 1, rank = 0;
  bool sequence_parallel = false;  // see lib/model/sequence_parallel.h (size > 1 only)
  bool active() const { return size > 1; }
  bool sp() const { return sequence_parallel && size > 1; }
};

inline void copy_to_tp_forward(const TpComm&, const Tensor&) {}
void copy_to_tp_backward(const TpComm& tp, const Tensor& grad);   // grad: summed in place
void reduce_from_tp_forward(const TpComm& tp, const Tensor& out);  // out: summed in place
inline void reduce_from_tp_backward(const TpComm&, const Tensor&) {}
// Element-wise max over the tp ranks, in place (vocab-parallel softmax).
void all_reduce_max_tp(const TpComm& tp, const Tensor& x);

}  // namespace ds
