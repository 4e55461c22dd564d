// bf16 / f16 tensors on the CPU backend. The CPU kernels compute in f32 only;
// the dispatcher runs an op whose args hold low-precision tensors by upcasting
// each such tensor to an f32 copy (exact), calling the f32 kernel on the
// copies and rounding the written copies back (nearest even). That is what a
// GPU kernel does that reads low precision, computes in f32 and rounds what it
// writes, including read-modify-write of accumulating (+=) fields.
// Args whose tensors are all f32 (or integer, or undefined) go straight to the
// kernel: the only cost is one scan of the fields' dtypes.
#pragma once
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/core/stream.h"
#include "lib/ops/op_args.h"

namespace ds::ops {

// How an op uses a tensor field.
enum class Role : uint8_t {
  In,      // read only
  Out,     // written (possibly also read, e.g. +=)
  Native,  // passed as it is: the CPU kernel handles bf16/f16 itself or rejects it
};

// fields(a, f) calls f(tensor, name, role) for every Tensor field of the args
// struct `a` (const or not: A is the struct with or without const).
template <class A, class T>
using IfArgs = std::enable_if_t<std::is_same_v<std::remove_const_t<A>, T>>;

template <class A, class F> IfArgs<A, EmbeddingArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.tokens, "tokens", Role::In);
  f(a.wte, "wte", Role::In);
  f(a.wpe, "wpe", Role::In);
}
template <class A, class F> IfArgs<A, EmbeddingBwdArgs> fields(A& a, F&& f) {
  f(a.dwte, "dwte", Role::Out);
  f(a.dwpe, "dwpe", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.tokens, "tokens", Role::In);
}
template <class A, class F> IfArgs<A, LayerNormArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.mean, "mean", Role::Out);
  f(a.rstd, "rstd", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.bias, "bias", Role::In);
}
template <class A, class F> IfArgs<A, LayerNormBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Out);
  f(a.dbias, "dbias", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.mean, "mean", Role::In);
  f(a.rstd, "rstd", Role::In);
}
template <class A, class F> IfArgs<A, RMSNormArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.rstd, "rstd", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
}
template <class A, class F> IfArgs<A, RMSNormBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.rstd, "rstd", Role::In);
}
template <class A, class F> IfArgs<A, MatmulArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
  f(a.bias, "bias", Role::In);
}
template <class A, class F> IfArgs<A, MatmulBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dweight, "dweight", Role::Out);
  f(a.dbias, "dbias", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
  f(a.weight, "weight", Role::In);
}
template <class A, class F> IfArgs<A, AttentionArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.lse, "lse", Role::Out);
  f(a.qkv, "qkv", Role::In);
}
template <class A, class F> IfArgs<A, AttentionBwdArgs> fields(A& a, F&& f) {
  f(a.dqkv, "dqkv", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.out, "out", Role::In);
  f(a.lse, "lse", Role::In);
  f(a.qkv, "qkv", Role::In);
}
template <class A, class F> IfArgs<A, RopeArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
}
template <class A, class F> IfArgs<A, GeluArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
  f(a.dout, "dout", Role::In);
}
template <class A, class F> IfArgs<A, SwigluArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.inp, "inp", Role::In);
}
template <class A, class F> IfArgs<A, SwigluBwdArgs> fields(A& a, F&& f) {
  f(a.dinp, "dinp", Role::Out);
  f(a.dout, "dout", Role::In);
  f(a.inp, "inp", Role::In);
}
template <class A, class F> IfArgs<A, AddArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.a, "a", Role::In);
  f(a.b, "b", Role::In);
}
template <class A, class F> IfArgs<A, CrossEntropyArgs> fields(A& a, F&& f) {
  f(a.losses, "losses", Role::Out);
  f(a.dlogits, "dlogits", Role::Out);
  f(a.logits, "logits", Role::In);
  f(a.targets, "targets", Role::In);
}
// rowmax and stats are written by one phase and read by the next: Out.
template <class A, class F> IfArgs<A, VocabParallelCEArgs> fields(A& a, F&& f) {
  f(a.logits, "logits", Role::In);
  f(a.targets, "targets", Role::In);
  f(a.rowmax, "rowmax", Role::Out);
  f(a.stats, "stats", Role::Out);
  f(a.losses, "losses", Role::Out);
  f(a.dlogits, "dlogits", Role::Out);
}
// param, m and v are f32 master state: passed as they are, so the kernel
// rejects anything else. The kernel rounds into param_lowp itself (nearest or,
// with sr_seed, stochastically).
template <class A, class F> IfArgs<A, AdamWArgs> fields(A& a, F&& f) {
  f(a.param, "param", Role::Native);
  f(a.grad, "grad", Role::In);
  f(a.m, "m", Role::Native);
  f(a.v, "v", Role::Native);
  f(a.param_lowp, "param_lowp", Role::Native);
}
template <class A, class F> IfArgs<A, SumSquaresArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Out);
  f(a.x, "x", Role::In);
}
template <class A, class F> IfArgs<A, NonFiniteArgs> fields(A& a, F&& f) {
  f(a.flag, "flag", Role::Out);
  f(a.x, "x", Role::In);
}
template <class A, class F> IfArgs<A, ScaleArgs> fields(A& a, F&& f) {
  f(a.x, "x", Role::Out);
}
// cast converts between all float dtypes itself.
template <class A, class F> IfArgs<A, CastArgs> fields(A& a, F&& f) {
  f(a.out, "out", Role::Native);
  f(a.inp, "inp", Role::Native);
}

inline bool is_lowp(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::BF16 || t.dtype() == DType::F16);
}

// The f32 copies of one op call's low-precision fields. Fields that alias
// (same address, numel and dtype) share one copy; partial overlaps are errors.
// Scratch memory is per thread and reused across calls.
class LowpEmulation {
 public:
  explicit LowpEmulation(const char* op) : op_(op) {}
  // Registers field `t` (a member of the args copy the kernel will get).
  void add(Tensor& t, const char* name, Role role);
  // Upcasts every group into its f32 copy and points the fields at the copies.
  void upcast();
  // Rounds the copies of groups with an Out field back into the originals.
  void write_back();

 private:
  struct Group {
    Tensor orig;  // the low-precision tensor
    const char* name;
    bool out = false;
    float* f32 = nullptr;  // (numel) its f32 copy
  };
  struct Field {
    Tensor* slot;
    int group;
  };
  const char* op_;
  std::vector<Group> groups_;
  std::vector<Field> fields_;
};

// Runs `kernel` (an f32 CPU kernel) on `a`, emulating bf16/f16 fields.
template <class Args, class Kernel>
void run_cpu(const char* op, const Args& a, const Stream& s, Kernel&& kernel) {
  bool lowp = false;
  fields(a, [&](const Tensor& t, const char*, Role r) { lowp |= r != Role::Native && is_lowp(t); });
  if (!lowp) return kernel(a, s);
  Args c = a;
  LowpEmulation em(op);
  fields(c, [&](Tensor& t, const char* name, Role r) {
    if (r != Role::Native && is_lowp(t)) em.add(t, name, r);
  });
  em.upcast();
  kernel(c, s);
  em.write_back();
}

}  // namespace ds::ops
