// token_gather / token_scatter on the GPU (lib/ops/op_args.h, TokenRowsArgs):
// one block per kept row in a grid-stride loop, copying 16-byte words when
// the row length allows (every row then starts 16-byte aligned) and 2-byte
// words otherwise (f32, bf16 and f16 rows are all whole 2-byte words).
#include <cstdint>

#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 128;

template <class W>
__global__ void token_rows_kernel(W* full, W* part, const int32_t* index, int64_t rows, int64_t R, int64_t T,
                                  int64_t words, bool gather) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / R;
    W* f = full + (b * T + index[r]) * words;
    W* p = part + r * words;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
      if (gather)
        p[i] = f[i];
      else
        f[i] = p[i];
    }
  }
}

void token_rows(const TokenRowsArgs& a, const Stream& s, bool gather) {
  const int64_t B = a.full.size(0), T = a.full.size(1), C = a.full.size(2), R = a.index.size(1);
  const int64_t rows = B * R, bytes = C * static_cast<int64_t>(dtype_size(a.full.dtype()));
  if (rows == 0 || bytes == 0) return;
  const unsigned grid = grid_for(rows * kThreads, kThreads);
  const auto* ix = a.index.data<int32_t>();
  cudaStream_t st = stream_of(s);
  if (bytes % 16 == 0) {
    token_rows_kernel<uint4><<<grid, kThreads, 0, st>>>(static_cast<uint4*>(a.full.raw()),
                                                       static_cast<uint4*>(a.part.raw()), ix, rows, R, T, bytes / 16,
                                                       gather);
  } else {
    token_rows_kernel<uint16_t><<<grid, kThreads, 0, st>>>(static_cast<uint16_t*>(a.full.raw()),
                                                           static_cast<uint16_t*>(a.part.raw()), ix, rows, R, T,
                                                           bytes / 2, gather);
  }
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void token_gather(const TokenRowsArgs& a, const Stream& s) { token_rows(a, s, true); }
void token_scatter(const TokenRowsArgs& a, const Stream& s) { token_rows(a, s, false); }

}  // namespace ds::cuda
