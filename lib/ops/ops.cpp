// Dispatcher: validates each op's arguments once (lib/ops/op_validate.cpp),
// then routes the call through a backend's op table (lib/ops/op_table.h): the
// one lib/cpu registered or, for CUDA tensors, the CUDA backend module's (the
// module is loaded by then: a CUDA tensor needs its allocator, which the
// module's device runtime installs).
// CPU calls with bf16/f16 tensors are emulated in f32 (lib/ops/lowp_emulation.h).
// Ops with a `dropout_key` tensor get their spec's step_key pointed into it.
#include "lib/ops/ops.h"

#include <optional>

#include "lib/core/cuda_module.h"
#include "lib/core/error.h"
#include "lib/ops/lowp_emulation.h"
#include "lib/ops/op_table.h"
#include "lib/ops/op_validate.h"

namespace ds::ops {
namespace {

// The tensor whose device decides where an op runs: the first defined
// tensor field in the op's declaration (every field must be on one device,
// which validate_<op> checks).
template <class Args>
const Tensor& key(const Args& a) {
  const Tensor* k = nullptr;
  fields(a, [&](const Tensor& t, const char*, Role) {
    if (!k && t.defined()) k = &t;
  });
  DS_CHECK(k, "op called with no tensor defined");
  return *k;
}

template <class Args>
concept HasDropoutKey = requires(const Args& a) {
  a.dropout_key;
  a.dropout.step_key;
};

// The args as the backends see them: with a defined dropout_key, a copy whose
// dropout.step_key points to it (DropoutSpec, lib/ops/dropout_mask.h); any
// other args as they are (validate_<op> refuses a step_key the caller set).
template <class Args>
const Args& bind_dropout_key(const Args& a, std::optional<Args>& bound) {
  if constexpr (HasDropoutKey<Args>) {
    if (!a.dropout_key.defined()) return a;
    bound = a;
    bound->dropout.step_key = a.dropout_key.template data<int64_t>();
    return *bound;
  } else {
    return a;
  }
}

// The module's op table, checked once (UserError when the module does not load).
const OpTable& cuda_ops() {
  static const OpTable* t = [] {
    const auto* ops = static_cast<const OpTable*>(cuda_module_part(CudaModulePart::Ops));
    DS_USER_CHECK(ops && ops->n_ops == kOpCount,
                  "--device cuda: the CUDA backend module has {} ops, this program {} (a module from another "
                  "build; set DS_CUDA_BACKEND to this build's)", ops ? ops->n_ops : 0, kOpCount);
    return ops;
  }();
  return *t;
}

// Set once, before main, by lib/cpu's static initializer; zero until then
// (constant-initialized, so no initialization order to depend on).
const OpTable* g_cpu_ops = nullptr;

}  // namespace

void register_cpu_ops(const OpTable& t) {
  DS_CHECK(t.n_ops == kOpCount && !g_cpu_ops, "CPU op table: {} ops, expected {}; registered before: {}", t.n_ops,
           kOpCount, g_cpu_ops != nullptr);
  g_cpu_ops = &t;
}

const OpTable& cpu_op_table() {
  DS_CHECK(g_cpu_ops, "no CPU op table: the program does not link the CPU backend (CMake target ds_ops_cpu)");
  return *g_cpu_ops;
}

const char* cpu_lowp_description() {
  const auto f = cpu_op_table().lowp_description;
  return f ? f() : "";
}

// The f32 CPU kernel of op `name` and its optional low-precision kernel as
// callables for run_cpu.
#define DS_CPU_KERNEL(name, Args) [](const Args& x, const Stream& st) { cpu_op_table().name(x, st); }
#define DS_CPU_LOWP_KERNEL(name, Args)                  \
  [](const Args& x, const Stream& st) {                 \
    const auto f = cpu_op_table().lowp.name;            \
    return f != nullptr && f(x, st);                    \
  }
#define DS_DISPATCH_OP(name, Args)                                   \
  void name(const Args& args, const Stream& s) {                     \
    std::optional<Args> bound;                                       \
    const Args& a = bind_dropout_key(args, bound);                   \
    if (key(a).device().is_cuda()) {                                 \
      validate_##name(a);                                            \
      return cuda_ops().name(a, s);                                  \
    }                                                                \
    run_cpu(#name, a, s, validate_##name, DS_CPU_KERNEL(name, Args),  \
            DS_CPU_LOWP_KERNEL(name, Args));                        \
  }

DS_OP_LIST(DS_DISPATCH_OP)

}  // namespace ds::ops
