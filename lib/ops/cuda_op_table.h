// The CUDA backend module's op table (lib/core/cuda_module.h, part Ops): one
// function pointer per op of DS_OP_LIST, filled by the module with the
// ds::cuda implementations and read by the dispatcher (lib/ops/ops.cpp) the
// first time an op runs on a CUDA tensor.
#pragma once
#include <cstdint>

#include "lib/ops/op_list.h"

namespace ds::ops {

struct CudaOpTable {
  uint32_t n_ops = 0;  // kCudaOpCount: a table from another op list is refused
#define DS_CUDA_OP_SLOT(name, Args) void (*name)(const Args&, const Stream&) = nullptr;
  DS_OP_LIST(DS_CUDA_OP_SLOT)
#undef DS_CUDA_OP_SLOT
};

#define DS_CUDA_OP_COUNT(name, Args) +1
inline constexpr uint32_t kCudaOpCount = 0 DS_OP_LIST(DS_CUDA_OP_COUNT);
#undef DS_CUDA_OP_COUNT

}  // namespace ds::ops
