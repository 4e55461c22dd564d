// Dispatcher: routes each op to the CPU or CUDA implementation by device.
// CPU calls with bf16/f16 tensors are emulated in f32 (lib/ops/lowp_emulation.h).
#include "lib/ops/ops.h"

#include "lib/core/error.h"
#include "lib/ops/lowp_emulation.h"

namespace ds::ops {
namespace {

// The tensor whose device decides where an op runs.
const Tensor& key(const EmbeddingArgs& a) { return a.out; }
const Tensor& key(const EmbeddingBwdArgs& a) { return a.dout; }
const Tensor& key(const LayerNormArgs& a) { return a.out; }
const Tensor& key(const LayerNormBwdArgs& a) { return a.dout; }
const Tensor& key(const RMSNormArgs& a) { return a.out; }
const Tensor& key(const RMSNormBwdArgs& a) { return a.dout; }
const Tensor& key(const MatmulArgs& a) { return a.out; }
const Tensor& key(const MatmulBwdArgs& a) { return a.dout; }
const Tensor& key(const AttentionArgs& a) { return a.out; }
const Tensor& key(const AttentionBwdArgs& a) { return a.dout; }
const Tensor& key(const RopeArgs& a) { return a.out; }
const Tensor& key(const GeluArgs& a) { return a.out; }
const Tensor& key(const SwigluArgs& a) { return a.out; }
const Tensor& key(const SwigluBwdArgs& a) { return a.dinp; }
const Tensor& key(const AddArgs& a) { return a.out; }
const Tensor& key(const CrossEntropyArgs& a) { return a.logits; }
const Tensor& key(const VocabParallelCEArgs& a) { return a.logits; }
const Tensor& key(const AdamWArgs& a) { return a.param; }
const Tensor& key(const SumSquaresArgs& a) { return a.x; }
const Tensor& key(const NonFiniteArgs& a) { return a.x; }
const Tensor& key(const ScaleArgs& a) { return a.x; }
const Tensor& key(const CastArgs& a) { return a.out; }

}  // namespace

// The f32 CPU kernel of op `name` as a callable for run_cpu.
#define DS_CPU_KERNEL(name, Args) [](const Args& x, const Stream& st) { ::ds::cpu::name(x, st); }
#ifdef DS_WITH_CUDA
#define DS_DISPATCH_OP(name, Args)                                   \
  void name(const Args& a, const Stream& s) {                        \
    if (key(a).device().is_cuda()) return ::ds::cuda::name(a, s);    \
    run_cpu(#name, a, s, DS_CPU_KERNEL(name, Args));                 \
  }
#else
#define DS_DISPATCH_OP(name, Args)                                   \
  void name(const Args& a, const Stream& s) {                        \
    DS_CHECK(!key(a).device().is_cuda(), #name ": this build has no CUDA backend"); \
    run_cpu(#name, a, s, DS_CPU_KERNEL(name, Args));                 \
  }
#endif

DS_OP_LIST(DS_DISPATCH_OP)

}  // namespace ds::ops
