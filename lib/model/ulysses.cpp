// DeepSpeed-Ulysses all-to-alls with head-block packing (see ulysses.h).
// The Communicator moves equal contiguous chunks, so rows are packed per
// destination rank first and unpacked per source rank after. The packing
// copies rows of one head block at a time (memcpy on the CPU; one strided
// device copy per head block on a GPU, see docs/parallel.md).
#include "lib/model/ulysses.h"

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

int64_t HeadSplit::width() const {
  int64_t w = 0;
  for (int64_t n : heads) w += n * HS;
  return w;
}

int64_t HeadSplit::part_width() const {
  int64_t w = 0;
  for (int64_t n : heads) w += part(n) * HS;
  return w;
}

void HeadSplit::check(const char* what) const {
  for (int64_t n : heads)
    DS_USER_CHECK(n % U == 0 || U % n == 0,
                  "{}: {} heads cannot be split over ds_sequence_parallel_size {} (the heads must be a multiple of it, "
                  "or divide it)", what, n, U);
}

void ulysses_seq_to_heads(const SpComm& sp, const HeadSplit& h, int64_t B, const Tensor& x, const Tensor& y,
                          UlyssesScratch& s, const Stream& stream) {
  (void)stream;
  const int U = sp.size;
  const int64_t W = h.width(), Wp = h.part_width(), rows = x.numel() / W, Tl = rows / B;
  DS_CHECK(y.numel() == rows * Wp * U && rows == B * Tl, "ulysses_seq_to_heads: x {} y {} widths {} {}",
           x.numel(), y.numel(), W, Wp);
  const int64_t chunk = rows * Wp;
  const Tensor send = s.send.view(0, {chunk * U}), recv = s.recv.view(0, {chunk * U});
  for (int j = 0; j < U; ++j) {  // chunk j: rank j's heads of every local row
    int64_t src_col = 0, dst_col = 0;
    for (int64_t n : h.heads) {
      const int64_t w = h.part(n) * h.HS;
      copy_rows(send, j * chunk + dst_col, Wp, x, src_col + h.first_head(n, j) * h.HS, W, rows, w);
      src_col += n * h.HS;
      dst_col += w;
    }
  }
  sp.comm->all_to_all(send, recv);
  for (int r = 0; r < U; ++r)  // chunk r: positions [r Tl, (r+1) Tl) of every sample (B rows of Tl Wp)
    copy_rows(y, r * Tl * Wp, U * Tl * Wp, recv, r * chunk, Tl * Wp, B, Tl * Wp);
}

void ulysses_heads_to_seq(const SpComm& sp, const HeadSplit& h, int64_t B, const Tensor& y, const Tensor& x,
                          UlyssesScratch& s, const Stream& stream) {
  const int U = sp.size;
  const int64_t W = h.width(), Wp = h.part_width(), rows = x.numel() / W, Tl = rows / B;
  DS_CHECK(y.numel() == rows * Wp * U && rows == B * Tl, "ulysses_heads_to_seq: x {} y {} widths {} {}",
           x.numel(), y.numel(), W, Wp);
  const int64_t chunk = rows * Wp;
  const Tensor send = s.send.view(0, {chunk * U}), recv = s.recv.view(0, {chunk * U});
  for (int r = 0; r < U; ++r)  // positions [r Tl, (r+1) Tl) of every sample -> chunk r
    copy_rows(send, r * chunk, Tl * Wp, y, r * Tl * Wp, U * Tl * Wp, B, Tl * Wp);
  sp.comm->all_to_all(send, recv);
  int64_t dst_col = 0, src_col = 0;
  for (int64_t n : h.heads) {
    const int64_t w = h.part(n) * h.HS;
    if (n % U == 0) {  // split: chunk j holds heads [j n/U, (j+1) n/U)
      for (int j = 0; j < U; ++j)
        copy_rows(x, dst_col + h.first_head(n, j) * h.HS, W, recv, j * chunk + src_col, Wp, rows, w);
    } else {  // replicated: head g is the sum of chunks j with j / (U/n) == g, in rank order
      const int reps = static_cast<int>(U / n);
      const Tensor acc = s.acc.view(0, {rows, h.HS}), tmp = s.tmp.view(0, {rows, h.HS});
      for (int64_t g = 0; g < n; ++g) {
        copy_rows(acc, 0, h.HS, recv, g * reps * chunk + src_col, Wp, rows, h.HS);
        for (int k = 1; k < reps; ++k) {
          copy_rows(tmp, 0, h.HS, recv, (g * reps + k) * chunk + src_col, Wp, rows, h.HS);
          ops::add({.out = acc, .a = acc, .b = tmp}, stream);
        }
        copy_rows(x, dst_col + g * h.HS, W, acc, 0, h.HS, rows, h.HS);
      }
    }
    dst_col += n * h.HS;
    src_col += w;
  }
}

Tensor sequence_shard(const Tensor& t, int U, int r) {
  DS_CHECK(t.dim() == 2 && t.size(1) % U == 0, "sequence_shard: shape {} over {} ranks", shape_str(t.shape()), U);
  const int64_t B = t.size(0), T = t.size(1), Tl = T / U;
  Tensor out = Tensor::empty({B, Tl}, t.dtype(), t.device());
  copy_rows(out, 0, Tl, t, r * Tl, T, B, Tl);
  return out;
}

}  // namespace ds
