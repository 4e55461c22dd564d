// Sequence-parallel gathers and scatters with the (B, T/TP, C) shard layout.
#include "lib/model/sequence_parallel.h"

#include "lib/core/error.h"

namespace ds {
namespace {

// Copies every block (b, p) between the (B, TP, Tl*C) and (TP, B, Tl*C)
// orders: for each rank p one strided copy of its B blocks (blocks of the
// sequence order lie TP blocks apart, those of the rank order are adjacent).
void permute_blocks(int64_t B, int P, const Tensor& src, const Tensor& dst, bool to_rank_major) {
  DS_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype() && src.device() == dst.device(),
           "permute_blocks: {} {} -> {} {}", dtype_name(src.dtype()), src.numel(), dtype_name(dst.dtype()),
           dst.numel());
  const int64_t blk = src.numel() / (B * P);
  const size_t es = dtype_size(src.dtype()), bytes = static_cast<size_t>(blk) * es;
  const size_t seq_pitch = static_cast<size_t>(P) * bytes, rank_pitch = bytes;
  Allocator& a = allocator_for(dst.device());
  for (int p = 0; p < P; ++p) {
    char* seq = static_cast<char*>(to_rank_major ? src.raw() : dst.raw()) + static_cast<size_t>(p) * bytes;
    char* rank = static_cast<char*>(to_rank_major ? dst.raw() : src.raw()) + static_cast<size_t>(p * B) * bytes;
    if (to_rank_major)
      a.copy_2d(rank, rank_pitch, seq, seq_pitch, bytes, static_cast<size_t>(B), dst.device().index);
    else
      a.copy_2d(seq, seq_pitch, rank, rank_pitch, bytes, static_cast<size_t>(B), dst.device().index);
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

void sp_take_shard(const TpComm& tp, int64_t B, const Tensor& full, const Tensor& shard) {
  DS_CHECK(shard.numel() * tp.size == full.numel() && full.numel() % B == 0, "sp_take_shard: shard {} x tp {} != full {}",
           shard.numel(), tp.size, full.numel());
  const int64_t per_sample = full.numel() / B, row = per_sample / tp.size;
  copy_rows(shard, 0, row, full, tp.rank * row, per_sample, B, row);
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
