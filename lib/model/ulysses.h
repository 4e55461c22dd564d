// DeepSpeed-Ulysses sequence parallelism: the U ranks of a sequence-parallel
// (sp) group each hold T/U positions of every sample through the whole
// transformer; around the attention core an all-to-all turns the sequence
// shard with every head, (B, T/U, heads), into the full sequence with this
// rank's heads, (B, T, heads/U), and the inverse all-to-all turns the
// attention output back. Weights are replicated over sp; their gradients are
// reduced over the sequence-data-parallel group (docs/parallel.md).
//
// A row of the tensors moved holds blocks of heads of HS values: the fused
// qkv row is [q NH | k NKV | v NKV], the attention output row [NH]. Each
// block is split over the sp ranks: rank r takes heads [r n/U, (r+1) n/U)
// when U divides n, or, when n divides U (grouped-query attention with fewer
// kv heads than sp ranks), the one head r / (U/n), replicated over the U/n
// ranks of its query group. On the way back a replicated head receives the
// sum of its replicas (their partial key/value gradients), in rank order.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds {

struct SpComm {
  Communicator* comm = nullptr;  // not owned; null when size == 1
  int size = 1, rank = 0;
  bool active() const { return size > 1; }
};

// The head blocks of one row and how they split over U ranks.
struct HeadSplit {
  int U = 1;
  int64_t HS = 0;
  std::vector<int64_t> heads;  // heads per block of the full row, e.g. {NH, NKV, NKV}

  int64_t part(int64_t n) const { return n % U == 0 ? n / U : 1; }  // heads per rank
  int64_t first_head(int64_t n, int r) const { return n % U == 0 ? r * (n / U) : r / (U / n); }
  int64_t width() const;       // full row: sum(heads) * HS
  int64_t part_width() const;  // one rank's row: sum(part(heads)) * HS
  // UserError naming `what` unless every block splits (n % U == 0 or U % n == 0).
  void check(const char* what) const;
};

// Scratch of the exchange: send and recv of B*Tl*part_width*U elements each
// (the widest split used), and for heads_to_seq with replicated heads two
// (B*Tl, HS) buffers; all of the tensors' dtype, on their device.
struct UlyssesScratch {
  Tensor send, recv, acc, tmp;
};

// x (B, Tl, width) -> y (B, Tl*U, part_width): the full sequence, this rank's heads.
void ulysses_seq_to_heads(const SpComm& sp, const HeadSplit& h, int64_t B, const Tensor& x, const Tensor& y,
                          UlyssesScratch& s, const Stream& stream);
// y (B, Tl*U, part_width) -> x (B, Tl, width); replicated heads get the sum of their replicas.
void ulysses_heads_to_seq(const SpComm& sp, const HeadSplit& h, int64_t B, const Tensor& y, const Tensor& x,
                          UlyssesScratch& s, const Stream& stream);
// Columns [r*T/U, (r+1)*T/U) of a (B, T) tensor (tokens, targets) as a new (B, T/U) tensor.
Tensor sequence_shard(const Tensor& t, int U, int r);

}  // namespace ds
