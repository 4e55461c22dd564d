// Device-neutral op API: the model calls only these. Each dispatches on the
// device of the op's first output tensor to lib/cpu or cuda/, through the op
// table each backend hands the dispatcher (lib/ops/op_table.h). The ds::cpu
// declarations are lib/cpu/cpu_ops.h; the ds::cuda ones are seen only by
// code built with ds_cuda (DS_WITH_CUDA): the module and GPU tests.
#pragma once
#include "lib/ops/op_list.h"

namespace ds::ops {
#define DS_DECLARE_OP_DEFAULT(name, Args) void name(const Args& a, const Stream& s = Stream{});
DS_OP_LIST(DS_DECLARE_OP_DEFAULT)
#undef DS_DECLARE_OP_DEFAULT

// How the CPU backend computes bf16 (one line for the start-up log).
const char* cpu_lowp_description();
}  // namespace ds::ops

#ifdef DS_WITH_CUDA
namespace ds::cuda {
DS_OP_LIST(DS_DECLARE_OP)
}  // namespace ds::cuda
#endif
