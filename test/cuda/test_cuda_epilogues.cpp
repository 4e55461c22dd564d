// GPU tests of the GELU GEMM epilogue ops (cuda/blas/matmul_gelu.cu) against
// the CPU ops (the unfused sequence): matmul_bias_gelu_forward (cuBLASLt
// GELU_AUX_BIAS) and matmul_dgelu_bgrad (DGELU_BGRAD) in f32, bf16 and f16,
// at shapes the epilogue takes (aux leading dimension a multiple of 8) and
// shapes it cannot (odd), with and without bias, dbias in the activation
// dtype and in f32, accumulating over repeated calls, on misaligned views,
// and with the epilogues switched off. The path counters say which path ran:
// aligned bf16/f16 calls must take the epilogue, the others must fall back.
// Skipped (exit 77) when no device is present.
#include <cstring>

#include "cuda/blas/lt_gemm.h"
#include "cuda/cuda_api.h"
#include "lib/ops/ops.h"
#include "test/ops_harness/op_case_cuda.h"

using namespace ds;
using namespace ds::test;

namespace {

const DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

// (N rows, C inputs, OC outputs) of the forward; the backward's GEMM runs
// dout (N, OC) -> dinp (N, C), so its aux leading dimension is C.
struct GemmShape {
  int64_t N, C, OC;
};
// Forward: OC 256 / 200 take the epilogue (odd N and C included), OC 45 does not.
const GemmShape kFwdShapes[] = {{64, 128, 256}, {67, 129, 200}, {67, 129, 45}};
// Backward: C 256 / 200 take the epilogue, C 129 does not.
const GemmShape kBwdShapes[] = {{64, 256, 128}, {67, 200, 45}, {67, 129, 45}};

// Switches the epilogues for one scope (whatever DS_GEMM_EPILOGUES says).
struct EpiloguesScope {
  explicit EpiloguesScope(cuda::GemmEpilogues e) : prev(cuda::gemm_epilogues()) { cuda::set_gemm_epilogues(e); }
  ~EpiloguesScope() { cuda::set_gemm_epilogues(prev); }
  cuda::GemmEpilogues prev;
};

OpCase forward_case(const GemmShape& s, bool bias) {
  MatmulGeluArgs a{.out = randn({s.N, s.OC}, 201), .pre = randn({s.N, s.OC}, 202),
                   .inp = randn({s.N, s.C}, 203), .weight = randn({s.OC, s.C}, 204, 0.15f),
                   .bias = bias ? randn({s.OC}, 205) : Tensor()};
  OpCase c = make_case(bias ? "matmul_bias_gelu_forward (bias)" : "matmul_bias_gelu_forward", a,
                       ops::matmul_bias_gelu_forward);
  for (const char* in : {"inp", "weight", "bias"})
    if (c.fields.count(in)) c.fields.at(in).output = false;  // Native roles: inputs by name
  return c;
}

// dinp starts random (it must be overwritten), dbias too (it must be added to).
OpCase backward_case(const GemmShape& s, bool dbias, bool f32_dbias) {
  MatmulDgeluArgs a{.dinp = randn({s.N, s.C}, 211), .dbias = dbias ? randn({s.C}, 215) : Tensor(),
                    .dout = randn({s.N, s.OC}, 212), .weight = randn({s.OC, s.C}, 213, 0.15f),
                    .pre = randn({s.N, s.C}, 214, 2.0f)};
  OpCase c = make_case(dbias ? "matmul_dgelu_bgrad (dbias)" : "matmul_dgelu_bgrad", a, ops::matmul_dgelu_bgrad);
  for (const char* in : {"dout", "weight", "pre"}) c.fields.at(in).output = false;
  if (dbias && f32_dbias) set_kind(c, {"dbias"}, Kind::F32);
  return c;
}

bool epilogue_shape(const GemmShape& s, bool backward) { return (backward ? s.C : s.OC) % 8 == 0; }

// Runs the case once on the device (plus its CPU runs) and checks the path.
void check_path(const OpCase& c, DType dt, bool backward, bool want_fused, int64_t offset = 0) {
  const cuda::EpiloguePathCounts before = cuda::epilogue_path_counts();
  check_cuda_vs_cpu(c, dt, offset);
  const cuda::EpiloguePathCounts after = cuda::epilogue_path_counts();
  const int64_t fused = backward ? after.fused_bwd - before.fused_bwd : after.fused_fwd - before.fused_fwd;
  const int64_t unfused = backward ? after.unfused_bwd - before.unfused_bwd : after.unfused_fwd - before.unfused_fwd;
  INFO(c.name << " " << dtype_name(dt) << " offset " << offset << ": fused " << fused << ", unfused " << unfused);
  CHECK(fused + unfused == 1);
  // f32 never takes the epilogue (its tanh is approximate, cuda/blas/matmul_gelu.cu).
  if (dt == DType::F32) want_fused = false;
  CHECK(fused == (want_fused ? 1 : 0));
}

}  // namespace

TEST_CASE("cuda matmul_bias_gelu_forward (GELU_AUX_BIAS epilogue) vs the CPU op") {
  if (!gpu_or_skip()) return;
  EpiloguesScope on(cuda::GemmEpilogues::Fused);
  for (DType dt : kAllTypes)
    for (const GemmShape& s : kFwdShapes)
      for (bool bias : {true, false}) {
        INFO("N " << s.N << " C " << s.C << " OC " << s.OC);
        const OpCase c = forward_case(s, bias);
        check_path(c, dt, false, epilogue_shape(s, false));
        check_path(c, dt, false, false, 1);  // pre misaligned: the unfused kernels
        check_cuda_vs_cpu_offsets(c, dt);
      }
}

TEST_CASE("cuda matmul_dgelu_bgrad (DGELU_BGRAD epilogue) vs the CPU op") {
  if (!gpu_or_skip()) return;
  EpiloguesScope on(cuda::GemmEpilogues::Fused);
  for (DType dt : kAllTypes)
    for (const GemmShape& s : kBwdShapes)
      for (int db : {0, 1, 2}) {  // no dbias, dbias in dt, dbias f32
        INFO("N " << s.N << " C " << s.C << " OC " << s.OC << " dbias " << db);
        const OpCase c = backward_case(s, db > 0, db == 2);
        check_path(c, dt, true, epilogue_shape(s, true));
        check_path(c, dt, true, false, 1);
        check_cuda_vs_cpu_offsets(c, dt);
        // Two calls: dinp is overwritten each time, dbias receives both sums.
        OpCase twice = backward_case(s, db > 0, db == 2);
        repeat(twice, 2);
        check_cuda_vs_cpu(twice, dt);
      }
}

TEST_CASE("cuda GELU epilogue ops switched off run the unfused kernels") {
  if (!gpu_or_skip()) return;
  EpiloguesScope off(cuda::GemmEpilogues::Unfused);
  for (DType dt : kAllTypes) {
    check_path(forward_case(kFwdShapes[0], true), dt, false, false);
    check_path(backward_case(kBwdShapes[0], true, true), dt, true, false);
  }
}

// The fused backward's bias gradient comes from cuBLASLt's reduction: the
// project promises bit-repeatable gradients, so the same call must give the
// same bits.
TEST_CASE("cuda matmul_dgelu_bgrad repeats its bits") {
  if (!gpu_or_skip()) return;
  EpiloguesScope on(cuda::GemmEpilogues::Fused);
  const GemmShape s{1000, 256, 192};
  for (DType dt : {DType::BF16, DType::F32}) {
    const Tensor dout = upload(randn({s.N, s.OC}, 221), dt), w = upload(randn({s.OC, s.C}, 222, 0.1f), dt);
    const Tensor pre = upload(randn({s.N, s.C}, 223, 2.0f), dt);
    Tensor first_dinp, first_db;
    for (int rep = 0; rep < 3; ++rep) {
      Tensor dinp = upload(Tensor::zeros({s.N, s.C}, DType::F32), dt);
      Tensor db = upload(Tensor::zeros({s.C}, DType::F32), DType::F32);
      ops::matmul_dgelu_bgrad({.dinp = dinp, .dbias = db, .dout = dout, .weight = w, .pre = pre});
      Tensor hd = dinp.to(Device::cpu()), hb = db.to(Device::cpu());
      if (rep == 0) {
        first_dinp = hd;
        first_db = hb;
        continue;
      }
      INFO(dtype_name(dt) << " repeat " << rep);
      CHECK(std::memcmp(hd.raw(), first_dinp.raw(), hd.nbytes()) == 0);
      CHECK(std::memcmp(hb.raw(), first_db.raw(), hb.nbytes()) == 0);
    }
  }
}

// DS_GEMM_EPILOGUES: the two choices, the default, and one clear error.
TEST_CASE("DS_GEMM_EPILOGUES values", "[nogpu]") {
  using cuda::GemmEpilogues;
  CHECK(cuda::parse_gemm_epilogues(nullptr) == GemmEpilogues::Fused);
  CHECK(cuda::parse_gemm_epilogues("") == GemmEpilogues::Fused);
  CHECK(cuda::parse_gemm_epilogues("fused") == GemmEpilogues::Fused);
  CHECK(cuda::parse_gemm_epilogues("unfused") == GemmEpilogues::Unfused);
  CHECK_THROWS_WITH(cuda::parse_gemm_epilogues("off"),
                    Catch::Contains("DS_GEMM_EPILOGUES='off'") && Catch::Contains("unfused"));
}
