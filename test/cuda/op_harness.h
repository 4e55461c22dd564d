// Test harness for the CUDA ops: runs one op on the CPU reference (f32), on a
// naive low-precision baseline (inputs and outputs rounded to bf16/f16, CPU
// math) and on the GPU, then compares every output field.
//  - f32: GPU vs CPU relative error <= 1e-5 (max-abs error / max-abs value).
//  - bf16/f16: GPU error <= 2 x baseline error (+ a tiny floor), both measured
//    against the f32 CPU result on the unrounded inputs.
#pragma once
#include <catch2/catch.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds::test {

// True when a CUDA device is present (and initialised); otherwise records a
// skip (test/skip.h: the binary exits 77) and returns false.
bool gpu_or_skip();

// Seeded N(0, 1) * scale host f32 tensor.
Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f);
// Host i32 tensor with values uniform in [lo, hi).
Tensor randint(const Shape& shape, uint64_t seed, int lo, int hi);

// f32 host tensor rounded through dt (identity for f32).
Tensor round_to(const Tensor& f32, DType dt);
// f32 host tensor -> CUDA tensor of dtype dt; CUDA tensor -> f32 host tensor.
Tensor upload(const Tensor& host, DType dt);
Tensor download_f32(const Tensor& dev);

// max |a - b| / max |b| (0 when both are all zero).
double rel_err(const Tensor& a, const Tensor& ref);

// How a field is stored on the device in a low-precision run.
enum class Kind { Act, F32, Int };
struct Field {
  Tensor host;  // f32 (Act/F32) or i32 (Int), host
  Kind kind = Kind::Act;
  bool output = false;  // compared after the op
};
using Fields = std::map<std::string, Field>;
using TensorMap = std::map<std::string, Tensor>;

// Tensor of `name` or an undefined tensor when the field is absent.
inline Tensor get(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? Tensor{} : it->second;
}

using OpRunner = std::function<void(const TensorMap&, bool on_gpu)>;

// Runs the comparison described above for dtype dt; `what` names the case.
// `baseline`, when given, replaces `run` for the naive low-precision baseline
// (for ops whose kernels round intermediates, e.g. attention's P and dS).
void check_op(const std::string& what, const Fields& fields, DType dt, const OpRunner& run,
              double f32_tol = 1e-5, const OpRunner* baseline = nullptr);

}  // namespace ds::test
