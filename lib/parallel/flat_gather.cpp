// Bucketed all-gather of a ZeRO-partitioned flat buffer (flat_gather.h).
#include "lib/parallel/flat_gather.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

void all_gather_flat(Communicator& dp, const ZeroPartition& p, const Tensor& buf, int64_t bucket_elems) {
  DS_CHECK(buf.numel() == p.total, "all_gather_flat: buffer {} != partition total {}", buf.numel(), p.total);
  const int me = dp.rank();
  for (const Range& c : make_shard_chunks(p, bucket_elems)) {
    const int64_t k = c.size();
    // Rank r's piece of this chunk, clipped to the real elements (padding is zeros).
    auto real = [&](int r) {
      const int64_t b = r * p.shard + c.begin;
      return Range{std::min(b, p.total), std::min(b + k, p.total)};
    };
    Tensor send = Tensor::zeros({k}, buf.dtype(), buf.device());
    Range mine = real(me);
    if (mine.size() > 0) send.view(0, {mine.size()}).copy_from(buf.view(mine.begin, {mine.size()}));
    Tensor recv = Tensor::empty({p.dp * k}, buf.dtype(), buf.device());
    dp.all_gather(send, recv);
    for (int r = 0; r < p.dp; ++r) {
      Range rr = real(r);
      if (r != me && rr.size() > 0) buf.view(rr.begin, {rr.size()}).copy_from(recv.view(r * k, {rr.size()}));
    }
  }
}

}  // namespace ds
