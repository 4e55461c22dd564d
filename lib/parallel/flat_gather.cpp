// Bucketed all-gather of a ZeRO-partitioned flat buffer (flat_gather.h).
#include "lib/parallel/flat_gather.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

namespace {

// Rank r's piece of chunk c, clipped to the real elements (padding is zeros),
// in partition (group-space) positions.
Range real_piece(const ZeroPartition& p, const Range& c, int r) {
  const int64_t b = r * p.shard + c.begin;
  return Range{std::min(b, p.total), std::min(b + c.size(), p.total)};
}

// The chunk's send buffer: this rank's piece, zero padded to the chunk length.
Tensor send_piece(const ZeroPartition& p, const GroupSpace& space, const Range& c, int me, const Tensor& buf) {
  Tensor send = Tensor::zeros({c.size()}, buf.dtype(), buf.device());
  const Range mine = real_piece(p, c, me);
  if (mine.size() > 0) pack_pieces(space.pieces(mine), buf, 0, send, mine.begin);
  return send;
}

// The other ranks' pieces of a received chunk into the buffer.
void place_pieces(const ZeroPartition& p, const GroupSpace& space, const Range& c, int me, const Tensor& recv,
                  const Tensor& buf) {
  for (int r = 0; r < p.dp; ++r) {
    const Range rr = real_piece(p, c, r);
    if (r != me && rr.size() > 0) unpack_pieces(space.pieces(rr), recv.view(r * c.size(), {rr.size()}), rr.begin, buf, 0);
  }
}

GroupSpace space_of(const ZeroPartition& p, const GroupSpace* space) {
  if (!space) return GroupSpace::identity(p.total);
  DS_CHECK(space->total() == p.total, "group space of {} elements, partition total {}", space->total(), p.total);
  return *space;
}

}  // namespace

void pack_pieces(const std::vector<GroupSpace::Piece>& pieces, const Tensor& flat, int64_t flat_base,
                 const Tensor& packed, int64_t packed_base) {
  for (const GroupSpace::Piece& q : pieces)
    Tensor(packed.view(q.at - packed_base, {q.flat.size()}))
        .copy_from(flat.view(q.flat.begin - flat_base, {q.flat.size()}));
}

void unpack_pieces(const std::vector<GroupSpace::Piece>& pieces, const Tensor& packed, int64_t packed_base,
                   const Tensor& flat, int64_t flat_base) {
  for (const GroupSpace::Piece& q : pieces)
    Tensor(flat.view(q.flat.begin - flat_base, {q.flat.size()}))
        .copy_from(packed.view(q.at - packed_base, {q.flat.size()}));
}

void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems,
                     const GroupSpace* space) {
  DS_CHECK(space || buf.numel() == p.total, "all_gather_flat: buffer {} != partition total {}", buf.numel(), p.total);
  const GroupSpace sp = space_of(p, space);
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    Tensor send = send_piece(p, sp, c, dp.rank(), buf);
    Tensor recv = Tensor::empty({p.dp * c.size()}, buf.dtype(), buf.device());
    dp.all_gather(send, recv);
    place_pieces(p, sp, c, dp.rank(), recv, buf);
  }
}

void FlatGather::start(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems,
                       const GroupSpace* space) {
  wait_all();  // chunks no unit waited for (only padding of a rank's piece, or units not run)
  DS_CHECK(space || buf.numel() == p.total, "FlatGather: buffer {} != partition total {}", buf.numel(), p.total);
  dp_ = &dp;
  p_ = p;
  space_ = space_of(p, space);
  buf_ = buf;
  chunks_.clear();
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    Chunk ch;
    ch.c = c;
    ch.recv = Tensor::empty({p.dp * c.size()}, buf.dtype(), buf.device());
    ch.h = dp.iall_gather(send_piece(p, space_, c, dp.rank(), buf), ch.recv);
    ch.open = true;
    chunks_.push_back(std::move(ch));
    ++open_;
  }
}

void FlatGather::wait_all() {
  for (Chunk& ch : chunks_)
    if (ch.open) finish(ch);
  chunks_.clear();
  buf_ = Tensor();
}

void FlatGather::wait(Range r) {
  // r in flat positions -> the group-space ranges of its elements
  const std::vector<GroupSpace::Piece> in = space_.within(r);
  for (Chunk& ch : chunks_) {
    if (!ch.open) continue;
    bool hit = false;
    for (int q = 0; q < p_.dp && !hit; ++q) {
      const Range piece = real_piece(p_, ch.c, q);
      for (const GroupSpace::Piece& g : in)
        hit = hit || (piece.begin < g.at + g.flat.size() && g.at < piece.end);
    }
    if (hit) finish(ch);
  }
  if (open_ == 0) {  // all placed: drop the buffers
    chunks_.clear();
    buf_ = Tensor();
  }
}

void FlatGather::finish(Chunk& ch) {
  ch.h.wait();
  place_pieces(p_, space_, ch.c, dp_->rank(), ch.recv, buf_);
  ch.recv = Tensor();
  ch.open = false;
  --open_;
}

}  // namespace ds
