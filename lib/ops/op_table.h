// A backend's op table: one function pointer per op of DS_OP_LIST, which the
// dispatcher (lib/ops/ops.cpp) calls by the device of an op's tensors. The
// backends fill it and lib/ops knows neither of them:
//  - CPU: lib/cpu/cpu_backend.cpp registers its table (register_cpu_ops)
//    from a static initializer when the program starts; programs link the
//    backend whole (the CMake target ds_ops_cpu), as nothing calls it by name.
//  - CUDA: the backend module (lib/core/cuda_module.h, part Ops) hands its
//    table over when it is loaded, the first time an op runs on a CUDA tensor.
#pragma once
#include <cstdint>

#include "lib/ops/op_list.h"

namespace ds::ops {

struct OpTable {
  uint32_t n_ops = 0;  // kOpCount: a table from another op list is refused
#define DS_OP_TABLE_SLOT(name, Args) void (*name)(const Args&, const Stream&) = nullptr;
  DS_OP_LIST(DS_OP_TABLE_SLOT)
#undef DS_OP_TABLE_SLOT
};

#define DS_OP_TABLE_COUNT(name, Args) +1
inline constexpr uint32_t kOpCount = 0 DS_OP_LIST(DS_OP_TABLE_COUNT);
#undef DS_OP_TABLE_COUNT

// Installs the CPU backend's table (`t` must outlive the program; one
// registration only).
void register_cpu_ops(const OpTable& t);
// The CPU backend's table; ds::Error when no backend registered one (a
// program that links ds_ops without ds_ops_cpu).
const OpTable& cpu_op_table();

}  // namespace ds::ops
