// matmul_bias_gelu_forward / matmul_dgelu_bgrad: the GPT MLP's GELU fused
// into cuBLASLt GEMM epilogues (docs/cuda.md, "GEMM epilogues").
//  forward:  out^T (OC, N) = gelu(W_cm^T inp^T + bias) with GELU_AUX_BIAS,
//            which also writes the GELU input (pre, the "aux" matrix, ld OC);
//  backward: dinp^T (C, N) = (W_cm dout^T) * gelu'(pre^T) with DGELU_BGRAD,
//            whose bias gradient (the row sums of dinp^T) is written to a
//            scratch vector and then added to dbias: cuBLASLt overwrites it,
//            our weight/bias gradients accumulate over micro-batches.
// Row-major tensors are read as column-major transposes as in matmul.cu.
// cuBLASLt's GELU is the tanh approximation, like gelu_forward.
// Whenever the epilogue cannot run (switched off, an aux leading dimension
// not a multiple of 8, a misaligned pre, no algorithm for the dtypes or
// alignments, a run-time refusal) the op runs the unfused kernels:
// matmul + gelu forward, matmul dinp + gelu backward + the deterministic
// bias-gradient reduction; the reason is logged once per shape.
#include <mutex>
#include <set>
#include <tuple>

#include "cuda/blas/lt_gemm.h"
#include "cuda/blas/matmul_parts.h"
#include "cuda/core/allocator.h"
#include "cuda/core/common.cuh"
#include "lib/core/log.h"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

// dst[i] += src[i]: the BGRAD scratch added into the accumulating dbias.
__global__ void accumulate_kernel(AnyPtr dst /* (n) */, AnyPtr src /* (n) */, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(dst, i, load(dst, i) + load(src, i));
}

// Logs `why` the first time an (op, shape, dtype) runs unfused.
void note_unfused(const char* op, int64_t N, int64_t C, int64_t OC, DType dt, const std::string& why) {
  static std::mutex mu;
  static std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int>> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert({op, N, C, OC, int(dt)}).second) return;
  }
  warn_line(std::string(op) + ": cuBLASLt GELU epilogue not used for N=" + std::to_string(N) +
            " C=" + std::to_string(C) + " OC=" + std::to_string(OC) + " " + dtype_name(dt) + " (" + why +
            "); running the separate GEMM and GELU kernels");
}

// What cuBLASLt states for the aux matrix, checked here so that the log
// names the condition rather than a bare status.
// f32 is not fused: cuBLASLt's GELU epilogues evaluate tanh approximately
// (about 1e-4 relative in f32), above what an f32 run promises against the
// CPU (1e-5); the separate GELU kernels are exact to f32 rounding.
std::string aux_problem(const Tensor& pre, int64_t ld) {
  if (pre.dtype() == DType::F32) return "f32: cuBLASLt's GELU epilogue uses an approximate tanh";
  if (ld % 8 != 0) return "aux leading dimension " + std::to_string(ld) + " is not a multiple of 8";
  if (reinterpret_cast<uintptr_t>(pre.raw()) % 16 != 0) return "pre is not 16-byte aligned";
  return "";
}

bool fused_forward(const MatmulGeluArgs& a, int64_t N, int64_t C, int64_t OC, const Stream& s,
                   std::string& why) {
  why = aux_problem(a.pre, OC);
  if (why.empty() && a.bias.defined()) why = fused_bias_problem(a.bias, a.out);
  if (!why.empty()) return false;
  LtGemm g;  // out^T (OC, N) = gelu(op_T(W_cm (C, OC)) inp^T (C, N) + bias), aux = pre^T
  g.transa = true;
  g.m = OC; g.n = N; g.k = C;
  g.A = a.weight.raw(); g.lda = C;
  g.B = a.inp.raw(); g.ldb = C;
  g.D = a.out.raw(); g.ldd = OC;
  g.ab_type = g.d_type = a.inp.dtype();
  g.bias = a.bias.defined() ? a.bias.raw() : nullptr;
  g.bias_type = a.bias.defined() ? a.bias.dtype() : DType::F32;
  g.act = LtAct::GeluAux;
  g.aux = a.pre.raw(); g.ld_aux = OC;
  return lt_gemm(g, s, &why);
}

// With dbias: BGRAD into a scratch vector, f32 first (the sum unrounded),
// then in D's dtype (cuBLASLt's documented default for the bias gradient).
bool fused_backward(const MatmulDgeluArgs& a, int64_t N, int64_t C, int64_t OC, const Stream& s,
                    std::string& why) {
  why = aux_problem(a.pre, C);
  if (!why.empty()) return false;
  const DType dt = a.dout.dtype();
  LtGemm g;  // dinp^T (C, N) = (W_cm (C, OC) dout^T (OC, N)) * gelu'(pre^T)
  g.m = C; g.n = N; g.k = OC;
  g.A = a.weight.raw(); g.lda = C;
  g.B = a.dout.raw(); g.ldb = OC;
  g.D = a.dinp.raw(); g.ldd = C;
  g.ab_type = g.d_type = dt;
  g.act = LtAct::DGelu;
  g.aux = a.pre.raw(); g.ld_aux = C;
  if (!a.dbias.defined()) return lt_gemm(g, s, &why);
  void* scratch = stream_workspace(s, size_t(C) * sizeof(float), WorkspaceSlot::Ops);  // (C)
  for (DType bt : {DType::F32, dt}) {
    g.bias = scratch;
    g.bias_type = bt;
    if (lt_gemm(g, s, &why)) {
      const FType ft = bt == DType::BF16 ? FType::BF16 : bt == DType::F16 ? FType::F16 : FType::F32;
      accumulate_kernel<<<grid_for(C, 256), 256, 0, stream_of(s)>>>(any_ptr(a.dbias), AnyPtr{scratch, ft}, C);
      DS_CUDA_CHECK_LAUNCH();
      return true;
    }
    if (bt == dt) break;
  }
  return false;
}

}  // namespace

void matmul_bias_gelu_forward(const MatmulGeluArgs& a, const Stream& s) {
  const char* op = "matmul_bias_gelu_forward";
  const int64_t OC = a.weight.size(0), C = a.weight.size(1), N = C ? a.inp.numel() / C : 0;
  const DType dt = a.inp.dtype();
  expect_compute(a.weight, dt, op, "weight", "inp");
  expect_compute(a.pre, dt, op, "pre", "inp");
  expect_compute(a.out, dt, op, "out", "inp");
  if (a.bias.defined()) expect_grad(a.bias, dt, op, "bias");
  if (N == 0 || OC == 0) return;
  DS_CUDA_REQUIRE(C > 0, std::string(op) + ": C must be > 0");
  const bool want = gemm_epilogues() == GemmEpilogues::Fused;
  std::string why;
  if (want && fused_forward(a, N, C, OC, s, why)) {
    count_epilogue_path(false, true);
    return;
  }
  if (want) note_unfused(op, N, C, OC, dt, why);
  count_epilogue_path(false, false);
  matmul_forward({.out = a.pre, .inp = a.inp, .weight = a.weight, .bias = a.bias}, s);
  gelu_forward({.out = a.out, .inp = a.pre, .dout = Tensor()}, s);
}

void matmul_dgelu_bgrad(const MatmulDgeluArgs& a, const Stream& s) {
  const char* op = "matmul_dgelu_bgrad";
  const int64_t OC = a.weight.size(0), C = a.weight.size(1), N = C ? a.dinp.numel() / C : 0;
  const DType dt = a.dout.dtype();
  expect_compute(a.weight, dt, op, "weight", "dout");
  expect_compute(a.pre, dt, op, "pre", "dout");
  expect_compute(a.dinp, dt, op, "dinp", "dout");
  if (a.dbias.defined()) expect_grad(a.dbias, dt, op, "dbias");
  if (N == 0 || C == 0) return;
  DS_CUDA_REQUIRE(OC > 0, std::string(op) + ": OC must be > 0");
  const bool want = gemm_epilogues() == GemmEpilogues::Fused;
  std::string why;
  if (want && fused_backward(a, N, C, OC, s, why)) {
    count_epilogue_path(true, true);
    return;
  }
  if (want) note_unfused(op, N, C, OC, dt, why);
  count_epilogue_path(true, false);
  // pre stands in for inp (same shape); with no dweight it is not read.
  matmul_backward(
      {.dinp = a.dinp, .dweight = Tensor(), .dbias = Tensor(), .dout = a.dout, .inp = a.pre, .weight = a.weight}, s);
  gelu_backward({.out = a.dinp, .inp = a.pre, .dout = a.dinp}, s);
  if (a.dbias.defined()) add_bias_grad(a.dbias, a.dinp, N, C, s);
}

}  // namespace ds::cuda
