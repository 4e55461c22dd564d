// Host reduction kernels for the Gloo backend: combine the same range of
// several members' buffers in member order. Kept separate so the order (the
// reason Gloo results are bit-identical across runs) is in one place.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/comm/communicator.h"

namespace ds {

// dst[j] = ((srcs[0][j] op srcs[1][j]) op srcs[2][j]) ... for j < count.
// f32 accumulates in f32; bf16/f16 in f32, rounded once; integers in int64.
// Max propagates NaN. dst may alias any one source (element-wise read first).
void reduce_in_order(DType dtype, ReduceOp op, const std::vector<const void*>& srcs, void* dst,
                     int64_t count);

}  // namespace ds
