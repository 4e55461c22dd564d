// The all-to-alls of expert parallelism (see expert_comm.h). The
// Communicator moves equal contiguous chunks; chunk j of the (E, R, C)
// buffer is expert block j, already contiguous, so only the receiving side
// re-packs: chunk i (source rank i) holds (El, R, C), and row block (e, i)
// moves to rows [i R, (i+1) R) of local expert e.
#include "lib/model/expert_comm.h"

#include "lib/core/error.h"

namespace ds {
namespace {

struct Dims {
  int64_t El = 0, R = 0, C = 0;
};

Dims dims_of(const EpComm& ep, const Tensor& by_expert, const Tensor& scratch, const Tensor& by_local) {
  DS_CHECK(by_expert.shape().size() == 3 && by_local.shape().size() == 3, "expert exchange: {} and {}",
           shape_str(by_expert.shape()), shape_str(by_local.shape()));
  const Dims d{by_local.size(0), by_expert.size(1), by_expert.size(2)};
  DS_CHECK(by_expert.size(0) == d.El * ep.size && by_local.size(1) == d.R * ep.size && by_local.size(2) == d.C &&
               scratch.numel() >= by_expert.numel() && scratch.dtype() == by_expert.dtype() &&
               by_local.dtype() == by_expert.dtype(),
           "expert exchange over {} ranks: by expert {}, by local expert {}, scratch of {}", ep.size,
           shape_str(by_expert.shape()), shape_str(by_local.shape()), scratch.numel());
  return d;
}

// (EP, El, R, C) <-> (El, EP*R, C): one strided copy per source rank.
void pack(const Dims& d, int ep, const Tensor& from_ranks, const Tensor& by_local, bool to_local) {
  const int64_t block = d.R * d.C;
  for (int i = 0; i < ep; ++i) {
    const int64_t ranks_off = i * d.El * block, local_off = i * block;
    if (to_local)
      copy_rows(by_local, local_off, ep * block, from_ranks, ranks_off, block, d.El, block);
    else
      copy_rows(from_ranks, ranks_off, block, by_local, local_off, ep * block, d.El, block);
  }
}

void all_to_all(const EpComm& ep, const char* what, const Tensor& send, const Tensor& recv) {
  const EpComm::Clock::time_point t0 = EpComm::Clock::now();
  ep.comm->all_to_all(send, recv);
  if (ep.trace) ep.trace(what, t0, EpComm::Clock::now());
}

}  // namespace

void experts_scatter(const EpComm& ep, const Tensor& by_expert, const Tensor& scratch, const Tensor& by_local) {
  const Dims d = dims_of(ep, by_expert, scratch, by_local);
  const Tensor recv = scratch.view(0, {by_expert.numel()});
  all_to_all(ep, "expert all_to_all (to the experts)", by_expert.view(0, {by_expert.numel()}), recv);
  pack(d, ep.size, recv, by_local, true);
}

void experts_gather(const EpComm& ep, const Tensor& by_local, const Tensor& scratch, const Tensor& by_expert) {
  const Dims d = dims_of(ep, by_expert, scratch, by_local);
  const Tensor send = scratch.view(0, {by_expert.numel()});
  pack(d, ep.size, send, by_local, false);
  all_to_all(ep, "expert all_to_all (from the experts)", send, by_expert.view(0, {by_expert.numel()}));
}

}  // namespace ds
