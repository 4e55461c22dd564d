// Sequence-parallel gathers and scatters with the (B, T/TP, C) shard layout.
#include "lib/model/sequence_parallel.h"

#include "lib/core/error.h"

namespace ds {
namespace {

// Copies block (b, p) between the (B, TP, Tl*C) and (TP, B, Tl*C) orders.
void permute_blocks(int64_t B, int P, const Tensor& src, const Tensor& dst, bool to_rank_major) {
  const int64_t blk = src.numel() / (B * P);
  for (int64_t b = 0; b < B; ++b)
    for (int p = 0; p < P; ++p) {
      const int64_t seq = (b * P + p) * blk, rank = (p * B + b) * blk;
      dst.view(to_rank_major ? rank : seq, {blk}).copy_from(src.view(to_rank_major ? seq : rank, {blk}));
    }
}

}  // namespace

void sp_gather(const TpComm& tp, int64_t B, const Tensor& shard, const Tensor& full, const Tensor& tmp) {
  DS_CHECK(shard.numel() * tp.size == full.numel() && tmp.numel() >= full.numel(),
           "sp_gather: shard {} x tp {} != full {}", shard.numel(), tp.size, full.numel());
  Tensor t = tmp.view(0, {full.numel()});
  tp.comm->all_gather(shard.view(0, {shard.numel()}), t);
  permute_blocks(B, tp.size, t, full.view(0, {full.numel()}), false);
}

void sp_reduce_scatter(const TpComm& tp, int64_t B, const Tensor& full, const Tensor& shard, const Tensor& tmp) {
  DS_CHECK(shard.numel() * tp.size == full.numel() && tmp.numel() >= full.numel(),
           "sp_reduce_scatter: shard {} x tp {} != full {}", shard.numel(), tp.size, full.numel());
  Tensor t = tmp.view(0, {full.numel()});
  permute_blocks(B, tp.size, full.view(0, {full.numel()}), t, true);
  tp.comm->reduce_scatter(t, shard.view(0, {shard.numel()}), ReduceOp::Sum);
}

void sp_all_reduce(const TpComm& tp, const Tensor& x) {
  if (tp.active()) tp.comm->all_reduce(x, ReduceOp::Sum);
}

}  // namespace ds
