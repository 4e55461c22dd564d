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

// Which fields are low precision and which are written comes from the one
// field declaration per op in lib/ops/op_args.h (fields(), Role).

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

// Runs `kernel` (an f32 CPU kernel) on `a`, emulating bf16/f16 fields, after
// `validate(a)` (the op's argument checks). With low-precision fields, the
// alias grouping (a partial overlap is an error) comes before the validation,
// as it did when the kernels checked their own arguments, and `lowp_kernel(a, s)`
// (the backend's own low-precision kernel, lib/ops/op_table.h) runs the call
// instead of the emulation unless it returns false.
template <class Args, class Validate, class Kernel, class LowpKernel>
void run_cpu(const char* op, const Args& a, const Stream& s, Validate&& validate, Kernel&& kernel,
             LowpKernel&& lowp_kernel) {
  bool lowp = false;
  fields(a, [&](const Tensor& t, const char*, Role r) { lowp |= r != Role::Native && is_lowp(t); });
  if (!lowp) {
    validate(a);
    return kernel(a, s);
  }
  Args c = a;
  LowpEmulation em(op);
  fields(c, [&](Tensor& t, const char* name, Role r) {
    if (r != Role::Native && is_lowp(t)) em.add(t, name, r);
  });
  validate(a);
  if (lowp_kernel(a, s)) return;
  em.upcast();
  kernel(c, s);
  em.write_back();
}

// The same without a low-precision kernel: always emulated.
template <class Args, class Validate, class Kernel>
void run_cpu(const char* op, const Args& a, const Stream& s, Validate&& validate, Kernel&& kernel) {
  run_cpu(op, a, s, std::forward<Validate>(validate), std::forward<Kernel>(kernel),
          [](const Args&, const Stream&) { return false; });
}

}  // namespace ds::ops
