// The CUDA modes of the op-test harness (op_case.h) and the GPU tests' own
// helpers. check_cuda_vs_cpu runs one OpCase on the CPU reference (f32), on a
// naive low-precision baseline (inputs and outputs rounded to bf16/f16, CPU
// math) and on the GPU, then compares every output field.
//  - f32: GPU vs CPU relative error <= 1e-5 (max-abs error / max-abs value).
//  - bf16/f16: GPU error <= 2 x baseline error (+ a tiny floor), both measured
//    against the f32 CPU result on the unrounded inputs.
#pragma once
#include <catch2/catch.hpp>

#include <string>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "test/ops_harness/op_case.h"

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

// Mode (c) of the harness (op_case.h): runs the case on the CPU (f32), on a
// naive low-precision baseline (Act fields rounded through dt, CPU math; the
// case's `baseline` when set) and on the GPU (Act fields in dt, F32 fields
// f32), then compares every output field as described above.
// offset > 0: every non-integer device field is a view `offset` elements
// into a larger buffer (parameters are views into one flat buffer; odd
// offsets break 16-byte alignment: the vectorised kernels' head/tail and
// scalar paths). Staggered: field k (in name order, from 1) sits k * offset
// elements in, so the fields' alignment phases disagree (all-scalar path).
enum class OffsetMode { Same, Staggered };
void check_cuda_vs_cpu(const OpCase& c, DType dt, int64_t offset = 0,
                       OffsetMode mode = OffsetMode::Same);
// check_cuda_vs_cpu at offsets 0, 1, 3 and 8 (aligned, two misaligned
// phases, aligned again after a whole vector of 16-bit elements) and
// staggered by 1.
void check_cuda_vs_cpu_offsets(const OpCase& c, DType dt);
// Mode (d) on the GPU: median time of one call in microseconds (events).
double time_cuda(const OpCase& c, DType dt, int iters);

}  // namespace ds::test
