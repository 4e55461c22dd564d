// The op list, once: X(name, ArgsType). Backends declare and the dispatcher
// defines exactly these functions, so adding an op is one line here plus the
// implementations.
#pragma once
#include "lib/core/stream.h"
#include "lib/ops/op_args.h"

#define DS_OP_LIST(X)                        \
  X(embedding_forward, EmbeddingArgs)        \
  X(embedding_backward, EmbeddingBwdArgs)    \
  X(layernorm_forward, LayerNormArgs)        \
  X(layernorm_backward, LayerNormBwdArgs)    \
  X(rmsnorm_forward, RMSNormArgs)            \
  X(rmsnorm_backward, RMSNormBwdArgs)        \
  X(add_norm_forward, AddNormArgs)           \
  X(matmul_forward, MatmulArgs)              \
  X(matmul_backward, MatmulBwdArgs)          \
  X(matmul_bias_gelu_forward, MatmulGeluArgs) \
  X(matmul_dgelu_bgrad, MatmulDgeluArgs)     \
  X(attention_forward, AttentionArgs)        \
  X(attention_backward, AttentionBwdArgs)    \
  X(kv_attention, KvAttentionArgs)           \
  X(rope_forward, RopeArgs)                  \
  X(rope_backward, RopeArgs)                 \
  X(gelu_forward, GeluArgs)                  \
  X(gelu_backward, GeluArgs)                 \
  X(relu_forward, GeluArgs)                  \
  X(relu_backward, GeluArgs)                 \
  X(swiglu_forward, SwigluArgs)              \
  X(swiglu_backward, SwigluBwdArgs)          \
  X(add, AddArgs)                            \
  X(dropout_forward, DropoutArgs)            \
  X(dropout_backward, DropoutArgs)           \
  X(cross_entropy, CrossEntropyArgs)         \
  X(vocab_parallel_cross_entropy, VocabParallelCEArgs) \
  X(kd_loss, KdLossArgs)                     \
  X(adamw_step, AdamWArgs)                   \
  X(optim_step, OptimStepArgs)               \
  X(step_gate, StepGateArgs)                 \
  X(sum_squares, SumSquaresArgs)             \
  X(nonfinite_check, NonFiniteArgs)          \
  X(onebit_pack, OneBitPackArgs)             \
  X(onebit_server, OneBitServerArgs)         \
  X(onebit_unpack, OneBitUnpackArgs)         \
  X(masked_mean, MaskedMeanArgs)             \
  X(scale, ScaleArgs)                        \
  X(cast, CastArgs)                          \
  X(moe_gate_forward, MoeGateArgs)           \
  X(moe_gate_backward, MoeGateBwdArgs)       \
  X(moe_dispatch_forward, MoeDispatchArgs)   \
  X(moe_dispatch_backward, MoeDispatchBwdArgs) \
  X(moe_combine_forward, MoeCombineArgs)     \
  X(moe_combine_backward, MoeCombineBwdArgs) \
  X(moe_mix_forward, MoeMixArgs)             \
  X(moe_mix_backward, MoeMixBwdArgs)         \
  X(moe_jitter, MoeJitterArgs)              \
  X(act_quantize, ActQuantArgs)             \
  X(token_gather, TokenRowsArgs)             \
  X(token_scatter, TokenRowsArgs)

// Declares `void name(const Args&, const Stream&)` for every op in namespace NS.
#define DS_DECLARE_OP(name, Args) void name(const Args& a, const Stream& s);
