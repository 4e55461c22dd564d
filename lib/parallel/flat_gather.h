// The bucketed all-gather of a flat buffer whose ZeRO-owned ranges were
// updated on their owners: after the optimizer step of stages 1 and 2 (the
// compute-dtype weights, or the f32 weights in fp32 training), and to
// assemble full f32 masters from their shards for a checkpoint or an export.
// FlatGather issues the same collectives asynchronously and completes them
// range by range (Megatron's --overlap-param-gather): the next forward waits,
// per parameter unit, only for the chunks that write into that unit.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/tensor.h"
#include "lib/parallel/group_space.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// Copies between a flat buffer and a packed one over `pieces` (a group
// space's pieces: the flat elements of a piece sit at packed positions from
// its `at`). Indices are positions less the base: flat[pos - flat_base],
// packed[at - packed_base]. Both tensors have the same dtype.
void pack_pieces(const std::vector<GroupSpace::Piece>& pieces, const Tensor& flat, int64_t flat_base,
                 const Tensor& packed, int64_t packed_base);
void unpack_pieces(const std::vector<GroupSpace::Piece>& pieces, const Tensor& packed, int64_t packed_base,
                   const Tensor& flat, int64_t flat_base);

// `buf` has p.total elements (any dtype); rank r's owned_real(r) is current
// on rank r. Afterwards every rank holds every range. One all-gather per
// shard chunk (make_shard_chunks(p, bucket_elems)).
// With a group space (group_space.h; p partitions space->total()), `buf` is
// the whole flat buffer and the partition's positions are the space's: the
// pieces are packed into and out of the chunks (null: the identity space).
void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems,
                     const GroupSpace* space = nullptr);

// all_gather_flat split into issue and completion. Every chunk is the same
// all-gather on the same bytes, issued in the same order, and a chunk's
// received pieces are copied into the buffer when it is completed, so the
// buffer ends up byte-identical to the blocking call's; only the waiting moves.
class FlatGather {
 public:
  // Issues every chunk (asynchronous: the group's communication thread or stream).
  void start(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems,
             const GroupSpace* space = nullptr);
  // Completes the chunks that write into flat range r (any order is fine:
  // the group runs them in issue order anyway).
  void wait(Range r);
  void wait_all();
  bool pending() const { return open_ > 0; }

 private:
  struct Chunk {
    Range c;         // shard coordinates; rank q's piece is [q*shard + c.begin, q*shard + c.end)
    CommHandle h;
    Tensor recv;     // (dp * c.size())
    bool open = false;
  };
  void finish(Chunk& ch);
  Communicator* dp_ = nullptr;
  ZeroPartition p_;
  GroupSpace space_;  // identity of p_.total without a group space
  Tensor buf_;
  std::vector<Chunk> chunks_;
  int open_ = 0;
};

}  // namespace ds
