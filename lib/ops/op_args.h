// Argument structs of the device-neutral op API.
// Every op has forward and backward; each takes one struct of tensors plus
// scalars. Shapes are given per field; N = B*T rows, C channels, Vp padded vocab.
// Conventions:
//  - Activations and weights are f32, bf16 or f16 (the tensor's dtype says
//    which); statistics (mean, rstd, lse, losses), weight/bias gradients and
//    master/optimizer state are always f32. CUDA kernels read low precision
//    and compute in f32; the CPU backend does the same by running its f32
//    kernels on upcast copies (lib/ops/lowp_emulation.h).
//  - Weight/bias gradients ACCUMULATE (+=) so micro-batches add up.
//  - Input gradients follow the `accum` field where present (Overwrite or Add);
//    elsewhere they are overwritten.
//  - Each struct's tensor fields are declared once, right after it, by
//    fields(args, f): f(tensor, name, role) for every Tensor field in order.
//    The dispatcher's device key, the CPU low-precision emulation and the op
//    tests all read that one list (docs/ops.md: adding an op).
#pragma once
#include <cstdint>
#include <type_traits>

#include "lib/core/tensor.h"
#include "lib/ops/dropout_mask.h"
#include "lib/ops/optim_rules.h"
#include "lib/ops/step_scalars.h"

namespace ds {

enum class Accum : uint8_t { Overwrite, Add };

// How an op uses a tensor field.
enum class Role : uint8_t {
  In,      // read only
  Out,     // written (overwritten, or per the struct's `accum` field)
  Accum,   // read and written: += (weight gradients), in place (scale), set-only flags
  Stat,    // an f32 statistic the op writes (mean, rstd, lse, losses)
  Native,  // passed as it is: the kernel has its own dtype rules for it (master state, cast)
};

// fields(a, f) is declared per args struct (A is the struct, const or not).
template <class A, class T>
using IfArgs = std::enable_if_t<std::is_same_v<std::remove_const_t<A>, T>>;

// Token (+ learned position) embedding. Vocab-parallel: this rank holds rows
// [vocab_start, vocab_start + wte.size(0)); other tokens contribute zeros.
struct EmbeddingArgs {
  Tensor out;      // (B, T, C)
  Tensor tokens;   // (B, T) i32
  Tensor wte;      // (Vlocal, C)
  Tensor wpe;      // (rows, C) or undefined (RoPE models)
  int64_t vocab_start = 0;
  int64_t pos_offset = 0;  // position of token 0 (sequence-parallel shards)
  int64_t row_offset = 0;  // the wpe row of position 0 (OPT: 2)
  // (B) i32 or undefined: right padding (AttentionArgs::lengths); with
  // pad_row >= 0 the positions at or beyond lengths[b] read wpe row pad_row
  // (OPT's mask-derived position of padding, -1, is row 1). CPU backend only.
  Tensor lengths;
  int64_t pad_row = -1;
  // (B) i32 or undefined (needs lengths): sample b's real positions (below
  // lengths[b]) read wpe shifts[b] rows further on: a left-padded sequence
  // packed to the left keeps the absolute positions of its padded layout
  // (GPT-2 under DeepSpeed-Chat's step 3). CPU backend only.
  Tensor shifts;
};
template <class A, class F> IfArgs<A, EmbeddingArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.tokens, "tokens", Role::In);
  f(a.wte, "wte", Role::In);
  f(a.wpe, "wpe", Role::In);
  f(a.lengths, "lengths", Role::In);
  f(a.shifts, "shifts", Role::In);
}
struct EmbeddingBwdArgs {
  Tensor dwte;     // (Vlocal, C) +=
  Tensor dwpe;     // (rows, C) += or undefined
  Tensor dout;     // (B, T, C)
  Tensor tokens;   // (B, T) i32
  int64_t vocab_start = 0;
  int64_t pos_offset = 0;
  int64_t row_offset = 0;  // as EmbeddingArgs
  Tensor lengths;
  int64_t pad_row = -1;
  Tensor shifts;
};
template <class A, class F> IfArgs<A, EmbeddingBwdArgs> fields(A& a, F&& f) {
  f(a.dwte, "dwte", Role::Accum);
  f(a.dwpe, "dwpe", Role::Accum);
  f(a.dout, "dout", Role::In);
  f(a.tokens, "tokens", Role::In);
  f(a.lengths, "lengths", Role::In);
  f(a.shifts, "shifts", Role::In);
}

struct LayerNormArgs {
  Tensor out;      // (N, C)
  Tensor mean;     // (N) f32, saved for backward
  Tensor rstd;     // (N) f32, saved for backward
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  Tensor bias;     // (C)
  float eps = 1e-5f;
};
template <class A, class F> IfArgs<A, LayerNormArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.mean, "mean", Role::Stat);
  f(a.rstd, "rstd", Role::Stat);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.bias, "bias", Role::In);
}
struct LayerNormBwdArgs {
  Tensor dinp;     // (N, C)
  Tensor dweight;  // (C) +=
  Tensor dbias;    // (C) +=
  Tensor dout;     // (N, C)
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  Tensor mean;     // (N)
  Tensor rstd;     // (N)
  Accum accum = Accum::Overwrite;
};
template <class A, class F> IfArgs<A, LayerNormBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Accum);
  f(a.dbias, "dbias", Role::Accum);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.mean, "mean", Role::In);
  f(a.rstd, "rstd", Role::In);
}

struct RMSNormArgs {
  Tensor out;      // (N, C)
  Tensor rstd;     // (N) f32
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  float eps = 1e-5f;
};
template <class A, class F> IfArgs<A, RMSNormArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.rstd, "rstd", Role::Stat);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
}
struct RMSNormBwdArgs {
  Tensor dinp;     // (N, C)
  Tensor dweight;  // (C) +=
  Tensor dout;     // (N, C)
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  Tensor rstd;     // (N)
  Accum accum = Accum::Overwrite;
};
template <class A, class F> IfArgs<A, RMSNormBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Accum);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.rstd, "rstd", Role::In);
}

// Residual add fused with the norm that follows it (the pre-norm block's
// "x + attn(x)" then norm2): sum = a + b, stored in the dtype of sum, then
// out = LayerNorm or RMSNorm of sum as stored (as add then norm would read
// it). sum may alias a or b. Roles are Native: the CPU version IS add then
// the norm (lib/cpu/add_norm.cpp), each with its own low-precision
// emulation, so its bits equal the unfused sequence; the CUDA kernel reads
// a and b once and writes sum and out in one pass.
enum class NormType : uint8_t { LayerNorm, RMSNorm };
struct AddNormArgs {
  Tensor sum;      // (N, C) a + b
  Tensor out;      // (N, C) norm(sum)
  Tensor mean;     // (N) f32 or undefined (LayerNorm only)
  Tensor rstd;     // (N) f32 or undefined
  Tensor a;        // (N, C)
  Tensor b;        // (N, C)
  Tensor weight;   // (C)
  Tensor bias;     // (C) or undefined (LayerNorm only)
  NormType norm = NormType::LayerNorm;
  float eps = 1e-5f;
};
template <class A, class F> IfArgs<A, AddNormArgs> fields(A& a, F&& f) {
  f(a.sum, "sum", Role::Native);
  f(a.out, "out", Role::Native);
  f(a.mean, "mean", Role::Native);
  f(a.rstd, "rstd", Role::Native);
  f(a.a, "a", Role::Native);
  f(a.b, "b", Role::Native);
  f(a.weight, "weight", Role::Native);
  f(a.bias, "bias", Role::Native);
}

// out = inp @ weight^T (+ bias). weight is (OC, C) as in nn.Linear.
struct MatmulArgs {
  Tensor out;      // (N, OC)
  Tensor inp;      // (N, C)
  Tensor weight;   // (OC, C)
  Tensor bias;     // (OC) or undefined
};
template <class A, class F> IfArgs<A, MatmulArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.bias, "bias", Role::In);
}
struct MatmulBwdArgs {
  Tensor dinp;     // (N, C) or undefined (skip)
  Tensor dweight;  // (OC, C) +=
  Tensor dbias;    // (OC) += or undefined
  Tensor dout;     // (N, OC)
  Tensor inp;      // (N, C)
  Tensor weight;   // (OC, C)
  Accum accum = Accum::Overwrite;  // for dinp
};
template <class A, class F> IfArgs<A, MatmulBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Accum);
  f(a.dbias, "dbias", Role::Accum);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
}

// The MLP's first linear layer and its GELU as one op, and the backward GEMM
// that produces that layer's input gradient, in the form of cuBLASLt's
// GELU_AUX_BIAS and DGELU_BGRAD epilogues (docs/cuda.md, "GEMM epilogues").
// GELU is the tanh approximation (as gelu_forward). The pre-activation `pre`
// is what cuBLASLt calls the aux matrix: the forward writes it, the backward
// reads it. Roles are Native: the CPU versions ARE the unfused ops through
// the dispatcher (lib/cpu/matmul_gelu.cpp), so their bits equal
// matmul_forward + gelu_forward and matmul_backward (dinp) + gelu_backward +
// the bias-gradient column sum.
struct MatmulGeluArgs {
  Tensor out;      // (N, OC) gelu(pre)
  Tensor pre;      // (N, OC) inp @ weight^T + bias
  Tensor inp;      // (N, C)
  Tensor weight;   // (OC, C)
  Tensor bias;     // (OC) or undefined
};
template <class A, class F> IfArgs<A, MatmulGeluArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Native);
  f(a.pre, "pre", Role::Native);
  f(a.inp, "inp", Role::Native);
  f(a.weight, "weight", Role::Native);
  f(a.bias, "bias", Role::Native);
}
// dinp = (dout @ weight) * gelu'(pre), overwritten (an epilogue applies after
// the GEMM's beta term, so it cannot accumulate); dbias += column sums of dinp.
// In the MLP, weight is mlp.proj's, pre the forward's pre-activation and
// dbias mlp.fc's bias gradient.
struct MatmulDgeluArgs {
  Tensor dinp;     // (N, C)
  Tensor dbias;    // (C) += or undefined
  Tensor dout;     // (N, OC)
  Tensor weight;   // (OC, C)
  Tensor pre;      // (N, C)
};
template <class A, class F> IfArgs<A, MatmulDgeluArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Native);
  f(a.dbias, "dbias", Role::Native);
  f(a.dout, "dout", Role::Native);
  f(a.weight, "weight", Role::Native);
  f(a.pre, "pre", Role::Native);
}

// Causal multi-head self-attention on a packed qkv buffer. Per token the row is
// [q (NH*HS) | k (NKV*HS) | v (NKV*HS)], head h at columns h*HS..h*HS+HS-1 of
// each part. Grouped-query attention: NKV divides NH and query head h reads kv
// head h / (NH/NKV); NKV = 0 means NKV = NH (multi-head attention).
// Forward saves the log-sum-exp per (b, h, t) row; backward recomputes scores.
// Attention dropout (dropout.p > 0) drops softmax probabilities (query i, key j
// of head h) with the key (sample0 + b, head0 + h, i, j) and scales the kept
// ones by 1/(1-p); lse stays that of the undropped softmax, and the backward
// redraws the same mask (lib/ops/dropout_mask.h). dropout_key, when defined,
// holds the per-step part of the key on the op's device (DropoutSpec:
// step_key, which the op layer fills from it; a captured CUDA graph reads it
// there instead of baking the step's iteration and first sample in).
struct AttentionArgs {
  Tensor out;      // (B, T, NH*HS)
  Tensor lse;      // (B, NH, T) f32
  Tensor qkv;      // (B, T, (NH+2*NKV)*HS)
  int NH = 0;
  int NKV = 0;     // kv heads; 0: NH
  DropoutSpec dropout;  // p = 0: none (pos0 unused: attention sees the whole sequence)
  Tensor dropout_key;   // (2) i64 {iteration, first sample} or undefined
  // (B) i32 or undefined: right padding, sample b's real tokens are its first
  // lengths[b] (1..T) and no query sees a key at or beyond them (a padding
  // query attends to the whole real sequence: an attention mask of ones then
  // zeros, as transformers applies it). CPU backend only so far.
  Tensor lengths;
};
template <class A, class F> IfArgs<A, AttentionArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.lse, "lse", Role::Stat);
  f(a.qkv, "qkv", Role::In);
  f(a.dropout_key, "dropout_key", Role::In);
  f(a.lengths, "lengths", Role::In);
}
struct AttentionBwdArgs {
  Tensor dqkv;     // (B, T, (NH+2*NKV)*HS) overwritten
  Tensor dout;     // (B, T, NH*HS)
  Tensor out;      // (B, T, NH*HS)
  Tensor lse;      // (B, NH, T)
  Tensor qkv;      // (B, T, (NH+2*NKV)*HS)
  int NH = 0;
  int NKV = 0;     // kv heads; 0: NH
  DropoutSpec dropout;  // the forward's
  Tensor dropout_key;   // (2) i64 {iteration, first sample} or undefined: the forward's
  Tensor lengths;       // the forward's (AttentionArgs::lengths)
};
template <class A, class F> IfArgs<A, AttentionBwdArgs> fields(A& a, F&& f) {
  f(a.dqkv, "dqkv", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.out, "out", Role::In);
  f(a.lse, "lse", Role::In);
  f(a.qkv, "qkv", Role::In);
  f(a.dropout_key, "dropout_key", Role::In);
  f(a.lengths, "lengths", Role::In);
}

// Attention of new rows against a key/value cache (incremental decoding with
// a KV cache; lib/model/gpt_decode.cpp). Row t of sample b is at position
// pos[b] + t: the op first stores the k and v parts of every qkv row into
// k_cache / v_cache at those positions, then each query row attends causally
// to cache positions [0, pos[b] + t] of its sample (grouped-query as in
// attention_forward). Per-sample positions let one batch hold sequences of
// different lengths. RoPE, if any, is applied to qkv beforehand. The caller
// guarantees 0 <= pos[b] and pos[b] + Tq <= Tmax (the CPU backend checks it).
struct KvAttentionArgs {
  Tensor out;      // (B, Tq, NH*HS)
  Tensor k_cache;  // (B, Tmax, NKV*HS): rows [pos[b], pos[b] + Tq) written
  Tensor v_cache;  // (B, Tmax, NKV*HS)
  Tensor qkv;      // (B, Tq, (NH+2*NKV)*HS)
  Tensor pos;      // (B) i32
  int NH = 0;
  int NKV = 0;     // kv heads; 0: NH
};
template <class A, class F> IfArgs<A, KvAttentionArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.k_cache, "k_cache", Role::Accum);
  f(a.v_cache, "v_cache", Role::Accum);
  f(a.qkv, "qkv", Role::In);
  f(a.pos, "pos", Role::In);
}

// Rotary position embedding on the q and k parts of a packed qkv buffer (NH
// query heads, NKV key heads; 0: NH), rotate-half convention within the first
// rot_dims dims of each head (pairs i and i + rot_dims/2, frequencies
// theta^(-2i/rot_dims), as Hugging Face LLaMA for rot_dims = HS and GPT-NeoX's
// rotary_pct otherwise); dims >= rot_dims and v copied. rot_dims = 0: HS.
// Backward is the inverse rotation. out may alias inp.
struct RopeArgs {
  Tensor out;      // (B, T, (NH+2*NKV)*HS)
  Tensor inp;      // (B, T, (NH+2*NKV)*HS)
  int NH = 0;
  int64_t pos_offset = 0;
  float theta = 10000.0f;
  int NKV = 0;       // kv heads; 0: NH
  int rot_dims = 0;  // rotated dims per head, even, <= HS; 0: HS
};
template <class A, class F> IfArgs<A, RopeArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
}

// GELU (tanh approximation) and ReLU (OPT's MLP) take the same fields;
// backward: dinp = dout * act'(inp) (relu' = 1 where inp > 0, else 0).
struct GeluArgs {
  Tensor out;      // (N) any shape; in backward: dinp
  Tensor inp;      // same shape
  Tensor dout;     // backward only
};
template <class A, class F> IfArgs<A, GeluArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.dout, "dout", Role::In);
}

// SwiGLU: inp row = [gate (F) | up (F)], out = silu(gate) * up.
struct SwigluArgs {
  Tensor out;      // (N, F)
  Tensor inp;      // (N, 2F)
};
template <class A, class F> IfArgs<A, SwigluArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
}
struct SwigluBwdArgs {
  Tensor dinp;     // (N, 2F) overwritten
  Tensor dout;     // (N, F)
  Tensor inp;      // (N, 2F)
};
template <class A, class F> IfArgs<A, SwigluBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
}

// out = a + b (out may alias a or b).
struct AddArgs {
  Tensor out, a, b;  // same shape
};
template <class A, class F> IfArgs<A, AddArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.a, "a", Role::In);
  f(a.b, "b", Role::In);
}

// Hidden dropout (Megatron's --hidden-dropout) fused with the residual add:
//   forward:  out = residual + dropout(inp), residual optional;
//   backward: out = dropout(inp) with the forward's mask (inp = dout, no residual).
// Element (b, t, c) is kept with the key (sample0 + b, pos0 + t, c) and scaled
// by 1/(1-p) (lib/ops/dropout_mask.h); out may alias inp or residual.
// dropout_key: the per-step part of the key in the op's memory, as in
// AttentionArgs.
struct DropoutArgs {
  Tensor out;       // (B, T, C)
  Tensor inp;       // (B, T, C)
  Tensor residual;  // (B, T, C) or undefined
  DropoutSpec dropout;
  Tensor dropout_key;  // (2) i64 {iteration, first sample} or undefined
};
template <class A, class F> IfArgs<A, DropoutArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.residual, "residual", Role::In);
  f(a.dropout_key, "dropout_key", Role::In);
}

// Fused softmax cross-entropy over the padded vocab. Columns >= V are padding
// and excluded. Targets < 0 are ignored (loss 0, no gradient).
// Writes losses and, if dlogits is defined, dlogits = dloss * (softmax - onehot)
// (dlogits may alias logits).
struct CrossEntropyArgs {
  Tensor losses;   // (N) f32
  Tensor dlogits;  // (N, Vp) or undefined
  Tensor logits;   // (N, Vp)
  Tensor targets;  // (N) i32
  int64_t V = 0;   // real vocab size
  float dloss = 1.0f;  // gradient of the total loss w.r.t. each row's loss
  // (1) f32 or undefined: when defined, the gradient is dloss * its value,
  // read when the op runs (a loss scale in the step block, so that a captured
  // step follows the scale's changes; docs/cuda.md, "CUDA graphs").
  Tensor dloss_scale;
};
template <class A, class F> IfArgs<A, CrossEntropyArgs> fields(A& a, F&& f) {
  f(a.losses, "losses", Role::Stat);
  f(a.dlogits, "dlogits", Role::Out);
  f(a.logits, "logits", Role::In);
  f(a.targets, "targets", Role::In);
  f(a.dloss_scale, "dloss_scale", Role::Native);
}

// Knowledge distillation (Megatron-DeepSpeed's --kd / --mos), per row over the
// real vocabulary [0, V) at temperature `temp`: p_s = softmax(logits / temp),
// p_t = softmax(teacher / temp);
//   losses[n] = KL(p_t || p_s) = sum_j p_t,j (log p_t,j - log p_s,j)
//   dlogits   = dscale * (p_s - p_t); columns >= V get 0.
// dlogits may alias teacher (each row is read before it is written), not logits.
struct KdLossArgs {
  Tensor losses;   // (N) f32
  Tensor dlogits;  // (N, Vp) or undefined
  Tensor logits;   // (N, Vp) the student's
  Tensor teacher;  // (N, Vp) the teacher's
  int64_t V = 0;   // real vocab size
  float temp = 1.0f, dscale = 0.0f;
};
template <class A, class F> IfArgs<A, KdLossArgs> fields(A& a, F&& f) {
  f(a.losses, "losses", Role::Stat);
  f(a.dlogits, "dlogits", Role::Out);
  f(a.logits, "logits", Role::In);
  f(a.teacher, "teacher", Role::In);
}

// Vocab-parallel softmax cross-entropy (the full logits are never gathered).
// This rank holds logit columns [vocab_start, vocab_start + Vl) of the padded
// vocab; global columns >= V are padding (excluded, gradient 0); targets < 0
// are ignored. The caller runs three phases with tp all-reduces in between:
//   Max:    rowmax = max of the local real columns (-inf if none)
//           -> all-reduce MAX of rowmax
//   Stats:  stats[0] = sum_j exp(x_j - rowmax) over local real columns,
//           stats[1] = the target's logit if this rank owns it, else 0
//           -> all-reduce SUM of stats
//   Finish: losses = log(stats[0]) + rowmax - stats[1] (0 for ignored rows);
//           if dlogits is defined: dlogits = dloss * (softmax - onehot) on the
//           local columns (may alias logits).
enum class VocabCEPhase : uint8_t { Max, Stats, Finish };
struct VocabParallelCEArgs {
  VocabCEPhase phase = VocabCEPhase::Max;
  Tensor logits;   // (N, Vl)
  Tensor targets;  // (N) i32, global vocab ids
  Tensor rowmax;   // (N) f32: written by Max, read by Stats and Finish
  Tensor stats;    // (2, N) f32: written by Stats, read by Finish
  Tensor losses;   // (N) f32, Finish only
  Tensor dlogits;  // (N, Vl) or undefined, Finish only
  int64_t vocab_start = 0;
  int64_t V = 0;       // real vocab size
  float dloss = 1.0f;  // gradient of the total loss w.r.t. each row's loss
};
// rowmax and stats are written by one phase and read by the next: Out.
template <class A, class F> IfArgs<A, VocabParallelCEArgs> fields(A& a, F&& f) {
  f(a.logits, "logits", Role::In);
  f(a.targets, "targets", Role::In);
  f(a.rowmax, "rowmax", Role::Stat);
  f(a.stats, "stats", Role::Stat);
  f(a.losses, "losses", Role::Stat);
  f(a.dlogits, "dlogits", Role::Out);
}

// Decoupled-weight-decay Adam on a parameter range (fp32 master).
// If `param_lowp` is defined, the updated value is also written to it (cast).
// `segments` lets one call cover a whole flat buffer (every parameter of a
// layout): rows {begin, end, decay} of element ranges of this call, sorted and
// disjoint; only elements inside a segment are updated, with weight_decay
// where decay != 0 and none elsewhere. Each segment gives the same bits as a
// call on that range alone. Undefined: all of [0, n) with weight_decay.
// The per-step values come by value (lr, weight_decay, grad_scale, step) or,
// when `scalars` is defined, from that block when the op runs (its AdamWSlot
// values, lib/ops/step_scalars.h; the by-value four are then ignored): with
// its Skip slot set the call changes nothing. Both ways give the same bits
// for the same values (adamw_terms derives the bias corrections either way).
struct AdamWArgs {
  Tensor param;    // (n) f32 master weights
  Tensor grad;     // (n) gradient (f32, or bf16/f16 on CUDA)
  Tensor m, v;     // (n) f32
  Tensor param_lowp;  // (n) bf16/f16 model weights or undefined
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1.0f;  // grads are multiplied by this first (unscale, clip)
  int64_t step = 1;         // 1-based, for bias correction
  uint64_t sr_seed = 0;  // != 0: stochastic rounding of a bf16 param_lowp (seeded per step)
  Tensor segments;  // (S, 3) i64 {begin, end, decay} or undefined; on the op's device
  Tensor scalars;   // (AdamWSlot::Count) f32 or undefined; on the op's device
};
// param, m and v are f32 master state: passed as they are, so the kernel
// rejects anything else. The kernel rounds into param_lowp itself (nearest or,
// with sr_seed, stochastically).
template <class A, class F> IfArgs<A, AdamWArgs> fields(A& a, F&& f) {
  f(a.param, "param", Role::Native);
  f(a.grad, "grad", Role::In);
  f(a.m, "m", Role::Native);
  f(a.v, "v", Role::Native);
  f(a.param_lowp, "param_lowp", Role::Native);
  f(a.segments, "segments", Role::Native);
  f(a.scalars, "scalars", Role::Native);
}

// One step of an element-wise optimizer rule (lib/ops/optim_rules.h: L2
// Adam, AdamW without bias correction, SGD, Adagrad, Lion, Lamb's two passes)
// over the segments of a range: elements outside every segment are left as
// they are, and each segment's decay flag picks t.weight_decay or 0. Lamb:
// LambMoments updates m and v and writes each segment's {sum p^2, sum u^2};
// LambApply reads each segment's trust ratio and updates p (and param_lowp).
struct OptimStepArgs {
  Tensor param;       // (n) f32 master weights
  Tensor grad;        // (n) gradient (f32, or bf16/f16 on CUDA); undefined for LambApply
  Tensor s1;          // (n) f32 exp_avg / momentum_buffer / sum, or undefined (SGD without momentum)
  Tensor s2;          // (n) f32 exp_avg_sq (Adam, Lamb) or undefined
  Tensor param_lowp;  // (n) bf16/f16 model weights or undefined (never with LambMoments)
  Tensor segments;    // (S, 3) i64 {begin, end, decay}, sorted and disjoint; on the op's device
  Tensor seg_stats;   // LambMoments: (S, 2) f32 written; LambApply, OneBitLambMomentum: (S) f32 read;
                      // OneBitLambFresh: (S, 4) f32, column 0 read (the scale), 1-3 written; else undefined
  OptimRule rule = OptimRule::Sgd;
  Tensor s3;          // (n) f32 0/1 Adam's update accumulator: OneBitApply (optional), ZeroOne*;
                      // 1-bit Lamb's fresh variance: OneBitLambFresh; else undefined
  Tensor prev;        // (n) f32 the momentum before the step: OneBitLambMomentum writes it, OneBitLambFresh
                      // reads it; else undefined
  OptimTerms t;
};
template <class A, class F> IfArgs<A, OptimStepArgs> fields(A& a, F&& f) {
  f(a.param, "param", Role::Native);
  f(a.grad, "grad", Role::In);
  f(a.s1, "s1", Role::Native);
  f(a.s2, "s2", Role::Native);
  f(a.param_lowp, "param_lowp", Role::Native);
  f(a.segments, "segments", Role::Native);
  f(a.seg_stats, "seg_stats", Role::Native);
  f(a.s3, "s3", Role::Native);
  f(a.prev, "prev", Role::Native);
}

// The update's gate, on the op's device and without a host read: from the
// step's statistics, scalars[GradScale] = clip coefficient / loss_scale and
// scalars[Skip] = 1 if the step must not be applied, else 0 (gate_step,
// lib/ops/step_scalars.h, the rule the trainer applies to the same values on
// the host). The other slots are left as they are.
struct StepGateArgs {
  Tensor scalars;  // (AdamWSlot::Count) f32: GradScale and Skip written
  Tensor stats;    // (3) f32: gradient sum of squares (loss scale in), overflow flag, loss
  double loss_scale = 1.0;  // the step's loss scale (fp16), else 1
  bool scale_in_block = false;  // the loss scale is scalars[LossScale] (read when the op runs), not loss_scale
  float max_norm = 0;       // gradient clipping threshold; <= 0: off
  SkipRule rule = SkipRule::NonFinite;
};
template <class A, class F> IfArgs<A, StepGateArgs> fields(A& a, F&& f) {
  f(a.scalars, "scalars", Role::Native);
  f(a.stats, "stats", Role::Native);
}

struct SumSquaresArgs {
  Tensor out;      // (1) f32, +=
  Tensor x;        // any
};
template <class A, class F> IfArgs<A, SumSquaresArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Accum);
  f(a.x, "x", Role::In);
}
// DeepSpeed Compression's activation quantization of a linear layer's input
// (compression/basic_layer.py QuantAct, utils.py SymQuantizer /
// AsymQuantizer), in place, with PyTorch's arithmetic: each elementwise step
// rounds to x's dtype; the running range and the static scale and zero point
// are computed in f32 and enter the elementwise steps rounded to x's dtype.
// Static (range defined): with `update` (a training forward) the running
// [min, max] first folds in this input's extremes m: set to them while the
// two are equal (the first call), then r = r * momentum + m * (1 - momentum),
// where (1 - momentum) is converted to x's dtype and the product rounded to it
// before the f32 sum; the whole tensor is quantized with the range. Dynamic
// (range undefined): each row with its own extremes, in x's dtype.
//   symmetric:  scale = 2 max(|min|, max) / 2^bits (dynamic: 2 max|row| / 2^bits),
//               q = clamp(round(x / scale), -2^(bits-1), 2^(bits-1) - 1) * scale
//   asymmetric: scale = (max - min) / 2^bits, zp = round(min / scale) * scale,
//               q = clamp(round((x - zp) / scale), 0, 2^bits - 1) * scale + zp
// round is half-to-even. The backward is the identity (straight-through).
struct ActQuantArgs {
  Tensor x;             // (N, C) f32, bf16 or f16: quantized in place
  Tensor range;         // (2) f32 running [min, max], or undefined (dynamic)
  int bits = 8;
  bool symmetric = true;
  bool update = false;  // static: fold this input into the range first
  double momentum = 0.95;  // (1 - momentum) is formed in double, as Python does
};
template <class A, class F> IfArgs<A, ActQuantArgs> fields(A& a, F&& f) {
  f(a.x, "x", Role::Native);
  f(a.range, "range", Role::Native);
}
// Random-LTD's token selection (DeepSpeed Data Efficiency's random layerwise
// token dropping): each sample keeps the R positions of its row of `index`.
// token_gather: part[b, j] = full[b, index[b, j]]; token_scatter:
// full[b, index[b, j]] = part[b, j], every other row of full unchanged. Plain
// copies in any one float dtype; each row of index holds distinct positions.
struct TokenRowsArgs {
  Tensor full;   // (B, T, C)
  Tensor part;   // (B, R, C), same dtype
  Tensor index;  // (B, R) i32, each in [0, T)
};
template <class A, class F> IfArgs<A, TokenRowsArgs> fields(A& a, F&& f) {
  f(a.full, "full", Role::Native);
  f(a.part, "part", Role::Native);
  f(a.index, "index", Role::In);
}
// DeepSpeed's 1-bit compression (lib/optim/onebit_exchange.h), the three element-wise
// steps of its exchange; the norms and the collectives run between them.
// Sign bits are packed eight to a byte, the first element in the most
// significant bit (numpy's packbits order, as DeepSpeed packs them); a bit is
// set where the value is not negative (sign(0) counts as +1).
//
// onebit_pack: s = sqrt(sumsq) / sqrt(n) (in double, rounded to f32), with n
// = x.numel() a multiple of 8; bits <- the sign bits of x; x -= s sign(x) (the
// compression error stays in x); scale[0] = s.
struct OneBitPackArgs {
  Tensor bits;   // (n / 8) u8
  Tensor scale;  // (1) f32, written
  Tensor x;      // (n) f32, in place
  Tensor sumsq;  // (1) f32: the sum of x^2
};
template <class A, class F> IfArgs<A, OneBitPackArgs> fields(A& a, F&& f) {
  f(a.bits, "bits", Role::Native);
  f(a.scale, "scale", Role::Native);
  f(a.x, "x", Role::Native);
  f(a.sumsq, "sumsq", Role::Native);
}
// onebit_server: x[k] = (sum over r in rank order of sign_r(k) * (scales[r] *
// (1 / W))) + x[k], for W ranks' packed signs of the chunk (bits row r).
struct OneBitServerArgs {
  Tensor x;       // (n) f32, added to
  Tensor bits;    // (W, n / 8) u8
  Tensor scales;  // (W) f32
};
template <class A, class F> IfArgs<A, OneBitServerArgs> fields(A& a, F&& f) {
  f(a.x, "x", Role::Native);
  f(a.bits, "bits", Role::Native);
  f(a.scales, "scales", Role::Native);
}
// onebit_unpack: out[i] = scales[i / chunk] * sign(i) for the packed signs bits.
struct OneBitUnpackArgs {
  Tensor out;      // (n) f32
  Tensor bits;     // (>= n / 8, rounded up) u8
  Tensor scales;   // (>= ceil(n / chunk)) f32
  int64_t chunk = 0;
};
template <class A, class F> IfArgs<A, OneBitUnpackArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Native);
  f(a.bits, "bits", Role::Native);
  f(a.scales, "scales", Role::Native);
}

struct NonFiniteArgs {
  Tensor flag;     // (1) f32, set to 1 if x has inf/nan (never cleared here)
  Tensor x;
};
template <class A, class F> IfArgs<A, NonFiniteArgs> fields(A& a, F&& f) {
  f(a.flag, "flag", Role::Accum);
  f(a.x, "x", Role::In);
}
// The training loss of one micro-batch without a host read:
// out[0] += weight * (mean of losses[i] over the rows with targets[i] >= 0),
// nothing when no row counts. The mean sums in double and rounds to f32 before
// it is weighted; GptModel::mean_loss runs it on host tensors for the host loss.
struct MaskedMeanArgs {
  Tensor out;      // (1) f32, +=
  Tensor losses;   // (N) f32
  Tensor targets;  // (N) i32, < 0: ignored
  float weight = 1.0f;
};
template <class A, class F> IfArgs<A, MaskedMeanArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Native);
  f(a.losses, "losses", Role::Native);
  f(a.targets, "targets", Role::In);
}
struct ScaleArgs {
  Tensor x;        // in place: x *= s
  float s = 1.0f;
};
template <class A, class F> IfArgs<A, ScaleArgs> fields(A& a, F&& f) {
  f(a.x, "x", Role::Accum);
}
struct CastArgs {
  Tensor out;      // any dtype, same numel
  Tensor inp;
};
// cast converts between all float dtypes itself.
template <class A, class F> IfArgs<A, CastArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Native);
  f(a.inp, "inp", Role::Native);
}

// Mixture of Experts (docs/moe.md). DeepSpeed's gating (top1gating,
// top2gating, topkgating in deepspeed/moe/sharded_moe.py) in a compact form:
// instead of the (N, E, C) combine and dispatch tensors, each token's K
// choices as (expert, slot, weight). N tokens, E experts, K choices per token,
// C rows per expert buffer, D the model width.
//   gates = softmax(logits) over E.
//   Choices (expert, always written, kept or dropped):
//     K = 1: argmax of gates (of logits + Gumbel noise with `rsample`);
//     K = 2: first = argmax of gates; second = argmax of logits (+ Gumbel
//            noise with `second_sampling`) over the other experts;
//     K > 2: the top K of logits.
//   counts[e]: choices of e before dropping (DeepSpeed's exp_counts).
//   Slots: choices take rows of their expert's buffer in token order, every
//     first choice before any second one (K = 2); capacity > 0 keeps at most
//     `capacity` per expert (K = 1 with `rts`: the kept tokens are those with
//     the largest uniform random numbers, else the first by position; K > 2
//     as DeepSpeed's drop policy "probs"); dropped choices get slot -1.
//     capacity 0: dropless (every choice kept; slots < max counts).
//   weight: K = 1: gates[n, e] (not renormalised); K >= 2: the kept choices'
//     gates divided by their sum (clamped at f32 epsilon); 0 where dropped.
//   aux: l_aux, DeepSpeed's load-balancing loss (top-1/2: E * sum_e me_e *
//     ce_e, top-k: the same / K; me = mean gate, ce = fraction of first
//     choices (K <= 2) or of all choices (K > 2), before dropping).
// Ties go to the lower index: expert (argmax, top K) or token (which are
// kept). Random values are a counter-based function of (noise_seed,
// noise_stream, token, expert), the same on every backend
// (lib/ops/moe_noise.h). rts and rsample act for K = 1 only,
// second_sampling for K = 2 only, as in DeepSpeed.
struct MoeGateArgs {
  Tensor gates;    // (N, E) f32, softmax(logits)
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32, row in the expert's buffer or -1 (dropped)
  Tensor weight;   // (N, K) f32 combine weights, 0 where dropped
  Tensor counts;   // (E) i32
  Tensor aux;      // (1) f32 l_aux
  Tensor logits;   // (N, E) f32
  int64_t capacity = 0;          // rows per expert; 0: dropless
  bool rts = false;              // K = 1: random token selection (use_rts)
  bool rsample = false;          // K = 1: noisy gate policy RSample
  bool second_sampling = false;  // K = 2: Gumbel noise on the second choice
  uint64_t noise_seed = 0, noise_stream = 0;
  // The token order (slots, ties, draws): 0: row order; > 0: the rows are
  // (N / seq samples, seq positions) and the order is Megatron's (position,
  // sample), the rows of its [s, b, h] activations (moe_token_row).
  int64_t seq = 0;
};
template <class A, class F> IfArgs<A, MoeGateArgs> fields(A& a, F&& f) {
  f(a.gates, "gates", Role::Stat);
  f(a.expert, "expert", Role::Out);
  f(a.slot, "slot", Role::Out);
  f(a.weight, "weight", Role::Stat);
  f(a.counts, "counts", Role::Out);
  f(a.aux, "aux", Role::Stat);
  f(a.logits, "logits", Role::Native);
}
// The gate's backward: dlogits (overwritten) from the combine weights'
// gradient and daux (the loss's gradient w.r.t. aux) through the softmax;
// the choices and the drop mask carry no gradient.
struct MoeGateBwdArgs {
  Tensor dlogits;  // (N, E) f32
  Tensor dweight;  // (N, K) f32
  Tensor gates;    // (N, E) f32, the forward's
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32
  float daux = 0.f;
};
template <class A, class F> IfArgs<A, MoeGateBwdArgs> fields(A& a, F&& f) {
  f(a.dlogits, "dlogits", Role::Native);
  f(a.dweight, "dweight", Role::Native);
  f(a.gates, "gates", Role::Native);
  f(a.expert, "expert", Role::In);
  f(a.slot, "slot", Role::In);
}
// Dispatch: out[e, s] = inp[n] for each kept choice (expert[n, j] = e,
// slot[n, j] = s); rows no choice fills are zero.
struct MoeDispatchArgs {
  Tensor out;      // (E, C, D)
  Tensor inp;      // (N, D)
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32
};
template <class A, class F> IfArgs<A, MoeDispatchArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.expert, "expert", Role::In);
  f(a.slot, "slot", Role::In);
}
// dinp[n] = sum of dout[expert[n, j], slot[n, j]] over n's kept choices
// (overwritten; 0 for a token with none).
struct MoeDispatchBwdArgs {
  Tensor dinp;     // (N, D)
  Tensor dout;     // (E, C, D)
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32
};
template <class A, class F> IfArgs<A, MoeDispatchBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.expert, "expert", Role::In);
  f(a.slot, "slot", Role::In);
}
// Combine: out[n] = sum over n's kept choices of weight[n, j] * inp[e, s]
// (overwritten; 0 for a token with none).
struct MoeCombineArgs {
  Tensor out;      // (N, D)
  Tensor inp;      // (E, C, D) the experts' outputs
  Tensor weight;   // (N, K) f32
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32
};
template <class A, class F> IfArgs<A, MoeCombineArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::Native);
  f(a.expert, "expert", Role::In);
  f(a.slot, "slot", Role::In);
}
// dinp[e, s] = weight[n, j] * dout[n] for the choice that fills row (e, s),
// 0 for rows none fills; dweight[n, j] = dot(dout[n], inp[e, s]), 0 where
// dropped (both overwritten).
struct MoeCombineBwdArgs {
  Tensor dinp;     // (E, C, D)
  Tensor dweight;  // (N, K) f32
  Tensor dout;     // (N, D)
  Tensor inp;      // (E, C, D) the forward's experts' outputs
  Tensor weight;   // (N, K) f32
  Tensor expert;   // (N, K) i32
  Tensor slot;     // (N, K) i32
};
template <class A, class F> IfArgs<A, MoeCombineBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Native);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::Native);
  f(a.expert, "expert", Role::In);
  f(a.slot, "slot", Role::In);
}

// PR-MoE (DeepSpeed's use_residual): the experts' output mixed with a dense
// MLP's by a learned per-token coefficient:
//   (c0, c1) = softmax(coef[n]),  out[n] = c0 * moe[n] + c1 * mlp[n].
struct MoeMixArgs {
  Tensor out;      // (N, D)
  Tensor moe;      // (N, D) the experts' output
  Tensor mlp;      // (N, D) the dense MLP's output
  Tensor coef;     // (N, 2) f32 logits
};
template <class A, class F> IfArgs<A, MoeMixArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.moe, "moe", Role::In);
  f(a.mlp, "mlp", Role::In);
  f(a.coef, "coef", Role::Native);
}
// dmoe = c0 * dout, dmlp = c1 * dout, and through the softmax
// dcoef[n, i] = c_i * (g_i - c0 g0 - c1 g1), g0 = dot(dout, moe), g1 =
// dot(dout, mlp) (all overwritten).
struct MoeMixBwdArgs {
  Tensor dmoe;     // (N, D)
  Tensor dmlp;     // (N, D)
  Tensor dcoef;    // (N, 2) f32
  Tensor dout;     // (N, D)
  Tensor moe;      // (N, D)
  Tensor mlp;      // (N, D)
  Tensor coef;     // (N, 2) f32
};
template <class A, class F> IfArgs<A, MoeMixBwdArgs> fields(A& a, F&& f) {
  f(a.dmoe, "dmoe", Role::Out);
  f(a.dmlp, "dmlp", Role::Out);
  f(a.dcoef, "dcoef", Role::Native);
  f(a.dout, "dout", Role::In);
  f(a.moe, "moe", Role::In);
  f(a.mlp, "mlp", Role::In);
  f(a.coef, "coef", Role::Native);
}

// DeepSpeed's noisy gate policy "Jitter" (multiplicative_jitter): out = inp
// times a uniform in (1 - eps, 1 + eps) per element, keyed by (noise_seed,
// noise_stream, row, column). Its backward is the same op on the gradient.
struct MoeJitterArgs {
  Tensor out;      // (N, D), may alias inp
  Tensor inp;      // (N, D)
  float eps = 1e-2f;
  uint64_t noise_seed = 0, noise_stream = 0;
};
template <class A, class F> IfArgs<A, MoeJitterArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
}

}  // namespace ds
