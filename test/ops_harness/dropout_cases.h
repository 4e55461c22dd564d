// Op-test cases of hidden dropout (dropout_forward / dropout_backward) and the
// attention-dropout double reference, shared by the CPU tests (test/ops) and
// the GPU tests (test/cuda). The mask in the references is drawn from the
// same key hash as the ops (lib/ops/dropout_mask.h): the hash is the
// specification, the references check what the ops do with it.
#pragma once
#include "test/ops_harness/op_case.h"

namespace ds::test {

// The dropout factor (0 or 1/(1-p)) of hidden element (b, t, c) under d.
double hidden_factor(const DropoutSpec& d, int64_t b, int64_t t, int64_t c);
// The dropout factor of attention probability (query i, key j) of local head h in batch b.
double attn_factor(const DropoutSpec& d, int64_t b, int64_t h, int64_t i, int64_t j);

// Forward: out = residual + mask(inp) (residual optional); reference in double.
OpCase dropout_forward_case(const DropoutArgs& a);
// Backward on dout (field "inp"): the finite-difference loss is
// sum(dout * forward(x)) with x an extra input, so "out" = d loss / d x.
OpCase dropout_backward_case(const DropoutArgs& a, const Tensor& x);

// Causal attention in double with attention dropout on the probabilities
// (packed qkv (B, T, 3*NH*HS)); fills lse (B, NH, T) if given.
Vec ref_attention_dropout(const Vec& qkv, int64_t B, int64_t T, int64_t NH, int64_t HS, const DropoutSpec& d,
                          Vec* lse);

}  // namespace ds::test
