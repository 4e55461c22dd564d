// OpCase builders of the Mixture-of-Experts ops (lib/ops/op_args.h: MoeGate*,
// MoeDispatch*, MoeCombine*), shared by the CPU tests (test/ops/test_cpu_moe:
// double references, finite differences) and the GPU tests (CUDA vs CPU).
// The gate forward's DeepSpeed reference is the CPU test's own (a dense
// formulation); these builders carry the references of the copies and the
// finite-difference losses of the backwards.
#pragma once
#include "lib/ops/ops.h"
#include "test/ops_harness/op_case.h"

namespace ds::test {

// The gate forward: its outputs allocated for N tokens, E experts, K choices.
MoeGateArgs moe_gate_args(const Tensor& logits, int64_t K, int64_t capacity);
// The gate forward as a case (logits and the outputs stay f32 in
// low-precision runs: the gate works in f32, as DeepSpeed's).
OpCase moe_gate_forward_case(const MoeGateArgs& a);
// The gate backward; `logits` is the forward's input. Its loss is
// sum(dweight * weight(logits)) + daux * aux(logits) with the choices and the
// drop mask of `a` held fixed; dlogits is checked against its gradient.
OpCase moe_gate_backward_case(const MoeGateBwdArgs& a, const Tensor& logits);
// Dispatch and combine with their double references; the backwards with the
// losses sum(dout * forward): dispatch's `inp` is a value of the loss only.
OpCase moe_dispatch_forward_case(const MoeDispatchArgs& a);
OpCase moe_dispatch_backward_case(const MoeDispatchBwdArgs& a, const Tensor& inp);
OpCase moe_combine_forward_case(const MoeCombineArgs& a);
OpCase moe_combine_backward_case(const MoeCombineBwdArgs& a);
// PR-MoE's mix with its double reference; the backward with the loss
// sum(dout * mix(moe, mlp, coef)).
OpCase moe_mix_forward_case(const MoeMixArgs& a);
OpCase moe_mix_backward_case(const MoeMixBwdArgs& a);

}  // namespace ds::test
