// One op-test harness for the CPU tests (test/ops) and the CUDA tests
// (test/cuda), in the spirit of ggml's test-backend-ops: an OpCase describes
// one op call once (its tensor fields with their initial host values, a
// function that builds the op's args from them and calls ops::<op>, the
// double-precision reference and the tolerances) and runs in every mode:
//  (a) check_reference:     the CPU op against the double reference (forward);
//  (b) check_finite_diff:   a backward op against central finite differences
//                           in double of a scalar loss of the forward;
//  (c) check_cuda_vs_cpu:   the CUDA op against the CPU op, f32 within f32_tol,
//                           bf16/f16 within 2x a naive rounded baseline
//                           (op_case_cuda.h, GPU tests only);
//  (d) time_cpu / time_cuda: median time of one call.
// The shared case builders are in op_cases.h. Error metric everywhere:
// max |got - ref| / max |ref| over the tensor.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/ops/op_args.h"

namespace ds::test {

using Vec = std::vector<double>;
using VecMap = std::map<std::string, Vec>;
using TensorMap = std::map<std::string, Tensor>;

// How a field is stored on the device in a low-precision CUDA run.
enum class Kind { Act, F32, Int };
struct Field {
  Tensor host;  // f32 (Act/F32) or i32 (Int), host
  Kind kind = Kind::Act;
  bool output = false;  // written by the op: compared after it
};
using Fields = std::map<std::string, Field>;

inline Field act(Tensor t, bool out = false) { return Field{std::move(t), Kind::Act, out}; }
inline Field f32(Tensor t, bool out = false) { return Field{std::move(t), Kind::F32, out}; }
inline Field ints(Tensor t) { return Field{std::move(t), Kind::Int, false}; }

// Tensor of `name` or an undefined tensor when the field is absent.
inline Tensor get(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? Tensor{} : it->second;
}

// A gradient field checked by finite differences: after the case's run,
// field `grad` == (keeps_initial ? its initial value : 0) + times * d loss / d `input`.
struct FdGrad {
  std::string grad;
  std::string input;
  double times = 1;
  bool keeps_initial = false;
};

using OpRun = std::function<void(const TensorMap&)>;

struct OpCase {
  std::string name;
  Fields fields;
  OpRun run;  // builds the args from the tensors (host or device) and calls ops::<op>
  // (a) expected final value of output fields from every field's initial value (double).
  std::function<VecMap(const VecMap&)> reference;
  double ref_tol = 1e-5;
  // (b) the scalar whose gradients `grads` the op computes, from the initial values.
  std::function<double(const VecMap&)> loss;
  std::vector<FdGrad> grads;
  VecMap extra;  // values the loss reads that are no field of the op (a forward's bias)
  double fd_tol = 1e-5;
  // (c) CUDA vs CPU.
  double f32_tol = 1e-5;
  OpRun baseline;  // the naive low-precision baseline when not `run` (ops that round inside)
};

// The case of one call of `op` with the host tensors of `init` (its scalars
// are kept), its field list read off the op's declaration (fields() in
// lib/ops/op_args.h): every defined tensor field, written ones (Out, Accum,
// Stat) compared after the op; Stat and i32 fields keep their dtype in
// low-precision CUDA runs, the others are Act (set_kind overrides, e.g. for
// f32 weight gradients or statistics read by a backward).
template <class Args>
OpCase make_case(std::string name, const Args& init, void (*op)(const Args&, const Stream&)) {
  OpCase c;
  c.name = std::move(name);
  fields(init, [&](const Tensor& t, const char* field, Role role) {
    if (!t.defined()) return;
    const Kind kind = t.dtype() == DType::I32 || t.dtype() == DType::I64 ? Kind::Int : role == Role::Stat ? Kind::F32 : Kind::Act;
    c.fields[field] = Field{t, kind, role != Role::In};
  });
  c.run = [init, op](const TensorMap& m) {
    Args a = init;
    fields(a, [&](Tensor& t, const char* field, Role) { t = get(m, field); });
    op(a, Stream{});
  };
  return c;
}
inline OpCase& set_kind(OpCase& c, const std::vector<std::string>& names, Kind kind) {
  for (const std::string& n : names) c.fields.at(n).kind = kind;
  return c;
}

// (a), (b) and the CPU half of (d). Each runs the op on fresh host copies.
void check_reference(const OpCase& c);
void check_finite_diff(const OpCase& c);
double time_cpu(const OpCase& c, int iters);  // median ns per call

// Repeats the case's call `calls` times per run (accumulation checks).
inline OpCase& repeat(OpCase& c, int calls) {
  OpRun once = c.run;
  c.run = [once, calls](const TensorMap& m) {
    for (int i = 0; i < calls; ++i) once(m);
  };
  return c;
}

// Initial values of every field (and of `extra`) in double.
VecMap initial_values(const OpCase& c);
// Fresh host copies of every field (the case's fields are never written).
TensorMap host_copies(const OpCase& c);

}  // namespace ds::test
