// Bucketed all-gather of a ZeRO-partitioned flat buffer (flat_gather.h).
#include "lib/parallel/flat_gather.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

namespace {

// Rank r's piece of chunk c, clipped to the real elements (padding is zeros).
Range real_piece(const ZeroPartition& p, const Range& c, int r) {
  const int64_t b = r * p.shard + c.begin;
  return Range{std::min(b, p.total), std::min(b + c.size(), p.total)};
}

// The chunk's send buffer: this rank's piece, zero padded to the chunk length.
Tensor send_piece(const ZeroPartition& p, const Range& c, int me, const Tensor& buf) {
  Tensor send = Tensor::zeros({c.size()}, buf.dtype(), buf.device());
  const Range mine = real_piece(p, c, me);
  if (mine.size() > 0) send.view(0, {mine.size()}).copy_from(buf.view(mine.begin, {mine.size()}));
  return send;
}

// The other ranks' pieces of a received chunk into the buffer.
void place_pieces(const ZeroPartition& p, const Range& c, int me, const Tensor& recv, const Tensor& buf) {
  for (int r = 0; r < p.dp; ++r) {
    const Range rr = real_piece(p, c, r);
    if (r != me && rr.size() > 0) buf.view(rr.begin, {rr.size()}).copy_from(recv.view(r * c.size(), {rr.size()}));
  }
}

}  // namespace

void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems) {
  DS_CHECK(buf.numel() == p.total, "all_gather_flat: buffer {} != partition total {}", buf.numel(), p.total);
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    Tensor send = send_piece(p, c, dp.rank(), buf);
    Tensor recv = Tensor::empty({p.dp * c.size()}, buf.dtype(), buf.device());
    dp.all_gather(send, recv);
    place_pieces(p, c, dp.rank(), recv, buf);
  }
}

void FlatGather::start(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems) {
  wait_all();  // chunks no unit waited for (only padding of a rank's piece, or units not run)
  DS_CHECK(buf.numel() == p.total, "FlatGather: buffer {} != partition total {}", buf.numel(), p.total);
  dp_ = &dp;
  p_ = p;
  buf_ = buf;
  chunks_.clear();
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    Chunk ch;
    ch.c = c;
    ch.recv = Tensor::empty({p.dp * c.size()}, buf.dtype(), buf.device());
    ch.h = dp.iall_gather(send_piece(p, c, dp.rank(), buf), ch.recv);
    ch.open = true;
    chunks_.push_back(std::move(ch));
    ++open_;
  }
}

void FlatGather::wait(Range r) {
  for (Chunk& ch : chunks_) {
    if (!ch.open) continue;
    for (int q = 0; q < p_.dp; ++q) {
      const Range piece = real_piece(p_, ch.c, q);
      if (piece.begin < r.end && r.begin < piece.end) {
        finish(ch);
        break;
      }
    }
  }
  if (open_ == 0) {  // all placed: drop the buffers
    chunks_.clear();
    buf_ = Tensor();
  }
}

void FlatGather::finish(Chunk& ch) {
  ch.h.wait();
  place_pieces(p_, ch.c, dp_->rank(), ch.recv, buf_);
  ch.recv = Tensor();
  ch.open = false;
  --open_;
}

}  // namespace ds
