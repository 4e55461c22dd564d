// The CPU backend's ops: ds::cpu::<op> for every op of DS_OP_LIST, f32 only
// (the dispatcher emulates bf16/f16 around them, lib/ops/lowp_emulation.h).
// lib/cpu depends on lib/ops and not the other way: the dispatcher reaches
// these through the op table lib/cpu/cpu_backend.cpp registers. Code above
// lib/ops calls ds::ops; tests that check a backend directly include this.
#pragma once
#include "lib/ops/op_list.h"

namespace ds::cpu {
DS_OP_LIST(DS_DECLARE_OP)
}  // namespace ds::cpu
