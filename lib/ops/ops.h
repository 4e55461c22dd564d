// Device-neutral op API: the model calls only these. Each dispatches on the
// device of the op's first output tensor to lib/cpu or cuda/.
#pragma once
#include "lib/ops/op_list.h"

namespace ds::ops {
#define DS_DECLARE_OP_DEFAULT(name, Args) void name(const Args& a, const Stream& s = Stream{});
DS_OP_LIST(DS_DECLARE_OP_DEFAULT)
#undef DS_DECLARE_OP_DEFAULT
}  // namespace ds::ops

namespace ds::cpu {
DS_OP_LIST(DS_DECLARE_OP)
}  // namespace ds::cpu

#ifdef DS_WITH_CUDA
namespace ds::cuda {
DS_OP_LIST(DS_DECLARE_OP)
}  // namespace ds::cuda
#endif
