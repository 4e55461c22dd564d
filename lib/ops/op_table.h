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

// Kernels of the CPU backend that take an op's bf16 / f16 fields as they are
// (its bf16 matmuls and attention; GELU, add and the cross-entropy, bit-
// identical to the emulation) instead of the dispatcher's f32 emulation
// (lib/ops/lowp_emulation.h). Optional per op; a kernel returns false to
// decline a call (other dtypes, the f32 GEMM mode forced), which then runs
// emulated.
struct LowpOpTable {
#define DS_LOWP_TABLE_SLOT(name, Args) bool (*name)(const Args&, const Stream&) = nullptr;
  DS_OP_LIST(DS_LOWP_TABLE_SLOT)
#undef DS_LOWP_TABLE_SLOT
};

struct OpTable {
  uint32_t n_ops = 0;  // kOpCount: a table from another op list is refused
#define DS_OP_TABLE_SLOT(name, Args) void (*name)(const Args&, const Stream&) = nullptr;
  DS_OP_LIST(DS_OP_TABLE_SLOT)
#undef DS_OP_TABLE_SLOT
  LowpOpTable lowp;  // CPU only
  // One line for the start-up log: how this backend computes bf16 (CPU only).
  const char* (*lowp_description)() = nullptr;
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
