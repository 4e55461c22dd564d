// Argument validation of every op, once, before the dispatcher picks a backend.
// validate_<op>(args) holds the device-neutral checks: which fields must be
// defined, their shapes, the dtypes the op's declaration fixes (statistics and
// master state f32, token ids i32, everything else a float dtype) and that all
// tensors share one device. A failed check is one ds::Error naming the op and
// the field. The backends (lib/cpu, cuda/) keep only what is their own: the
// CUDA kernels' one-compute-dtype rule and launch limits, the CPU backend's
// required optional fields and its data checks on target ids.
#pragma once
#include "lib/ops/op_list.h"

namespace ds::ops {

#define DS_DECLARE_VALIDATE(name, Args) void validate_##name(const Args& a);
DS_OP_LIST(DS_DECLARE_VALIDATE)
#undef DS_DECLARE_VALIDATE

}  // namespace ds::ops
