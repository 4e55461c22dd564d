// The CPU backend's ops: ds::cpu::<op> for every op of DS_OP_LIST, f32 only
// (the dispatcher emulates bf16/f16 around them, lib/ops/lowp_emulation.h),
// and the few that also take bf16 as it is (ds::cpu::lowp::<op>, returning
// false to decline a call; lib/ops/op_table.h, LowpOpTable).
// lib/cpu depends on lib/ops and not the other way: the dispatcher reaches
// these through the op table lib/cpu/cpu_backend.cpp registers. Code above
// lib/ops calls ds::ops; tests that check a backend directly include this.
#pragma once
#include "lib/ops/op_list.h"

namespace ds::cpu {
DS_OP_LIST(DS_DECLARE_OP)

namespace lowp {
bool embedding_forward(const EmbeddingArgs& a, const Stream& s);  // lib/cpu/embedding.cpp
bool matmul_forward(const MatmulArgs& a, const Stream& s);    // lib/cpu/matmul.cpp
bool matmul_backward(const MatmulBwdArgs& a, const Stream& s);
bool attention_forward(const AttentionArgs& a, const Stream& s);  // lib/cpu/attention.cpp
bool attention_backward(const AttentionBwdArgs& a, const Stream& s);
bool gelu_forward(const GeluArgs& a, const Stream& s);  // lib/cpu/activation.cpp
bool gelu_backward(const GeluArgs& a, const Stream& s);
bool add(const AddArgs& a, const Stream& s);
bool cross_entropy(const CrossEntropyArgs& a, const Stream& s);  // lib/cpu/loss.cpp
bool kv_attention(const KvAttentionArgs& a, const Stream& s);    // lib/cpu/kv_attention.cpp
const char* description();  // lib/cpu/bf16_gemm.cpp
}  // namespace lowp
}  // namespace ds::cpu
