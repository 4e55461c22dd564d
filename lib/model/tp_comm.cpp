// The copy_to_tp / reduce_from_tp pairs: all-reduces over the tp group.
#include "lib/model/tp_comm.h"

namespace ds {

void copy_to_tp_backward(const TpComm& tp, const Tensor& grad) {
  if (tp.active()) tp.comm->all_reduce(grad, ReduceOp::Sum);
}

void reduce_from_tp_forward(const TpComm& tp, const Tensor& out) {
  if (tp.active()) tp.comm->all_reduce(out, ReduceOp::Sum);
}

void all_reduce_max_tp(const TpComm& tp, const Tensor& x) {
  if (tp.active()) tp.comm->all_reduce(x, ReduceOp::Max);
}

}  // namespace ds
