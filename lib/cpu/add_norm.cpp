// The CPU version of add_norm_forward: the residual add and the norm as the
// two ops they fuse, each through the dispatcher (so each keeps its own
// low-precision emulation and rounding). Bit-identical to the unfused
// sequence by construction; the fusion is a GPU memory-traffic saving only.
#include "lib/cpu/cpu_ops.h"
#include "lib/ops/ops.h"

namespace ds::cpu {

void add_norm_forward(const AddNormArgs& a, const Stream& s) {
  ops::add({.out = a.sum, .a = a.a.reshape(a.sum.shape()), .b = a.b.reshape(a.sum.shape())}, s);
  if (a.norm == NormType::RMSNorm) {
    ops::rmsnorm_forward({.out = a.out, .rstd = a.rstd, .inp = a.sum, .weight = a.weight, .eps = a.eps}, s);
  } else {
    ops::layernorm_forward(
        {.out = a.out, .mean = a.mean, .rstd = a.rstd, .inp = a.sum, .weight = a.weight, .bias = a.bias, .eps = a.eps},
        s);
  }
}

}  // namespace ds::cpu
