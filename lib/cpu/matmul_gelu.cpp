// The CPU versions of matmul_bias_gelu_forward and matmul_dgelu_bgrad: the
// unfused ops they stand for, each through the dispatcher (so each keeps its
// own low-precision emulation and rounding: pre is rounded to the activation
// dtype before GELU reads it, dout @ weight before GELU's gradient scales
// it). Bit-identical to the unfused sequence by construction; the fusion is
// a GPU saving only (cuBLASLt epilogues, cuda/blas/matmul_gelu.cu).
#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/matmul.h"
#include "lib/ops/lowp_emulation.h"
#include "lib/ops/ops.h"

namespace ds::cpu {
namespace {

// The bias-gradient column sum as a one-off op of its own, so that run_cpu
// emulates a bf16/f16 dbias or dinp exactly as it does for matmul_backward
// (whose dbias this is).
struct BiasGradArgs {
  Tensor dbias;  // (C) +=
  Tensor dout;   // (N, C)
};
template <class A, class F> IfArgs<A, BiasGradArgs> fields(A& a, F&& f) {
  f(a.dbias, "dbias", Role::Accum);
  f(a.dout, "dout", Role::In);
}

void bias_grad(const Tensor& dbias, const Tensor& dout, const Stream& s) {
  const int64_t C = dbias.numel();
  if (C == 0) return;
  ops::run_cpu("matmul_dgelu_bgrad", BiasGradArgs{.dbias = dbias, .dout = dout}, s, [](const BiasGradArgs&) {},
               [C](const BiasGradArgs& x, const Stream&) {
                 matmul_bias_grad(x.dbias.data<float>(), x.dout.data<float>(), x.dout.numel() / C, C);
               });
}

}  // namespace

void matmul_bias_gelu_forward(const MatmulGeluArgs& a, const Stream& s) {
  ops::matmul_forward({.out = a.pre, .inp = a.inp, .weight = a.weight, .bias = a.bias}, s);
  ops::gelu_forward({.out = a.out, .inp = a.pre, .dout = Tensor()}, s);
}

// pre stands in for matmul_backward's inp: it has inp's shape (N, C), and
// with no dweight asked for it is never read.
void matmul_dgelu_bgrad(const MatmulDgeluArgs& a, const Stream& s) {
  ops::matmul_backward(
      {.dinp = a.dinp, .dweight = Tensor(), .dbias = Tensor(), .dout = a.dout, .inp = a.pre, .weight = a.weight}, s);
  ops::gelu_backward({.out = a.dinp, .inp = a.pre, .dout = a.dinp}, s);
  if (a.dbias.defined()) bias_grad(a.dbias, a.dinp, s);
}

}  // namespace ds::cpu
