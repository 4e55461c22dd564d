// matmul_forward / matmul_backward (nn.Linear semantics, weight (OC, C)) on
// cuBLASLt. Row-major tensors are read as column-major transposes:
//   out^T (OC, N)  = op_T(W_cm (C, OC)) * inp^T (C, N)
//   dinp^T (C, N)   = W_cm (C, OC) * dout^T (OC, N)
//   dW^T (C, OC)   += inp^T (C, N) * dout (N, OC)
// The bias epilogue adds the bias in the GEMM; when cuBLASLt has no such
// algorithm for the dtypes, a separate kernel adds it. dbias uses the
// deterministic column reduction (16-byte vectors of dout when OC is a
// multiple of the vector width and dout is aligned).
// Dtypes (see cuda/core/common.cuh): inp, weight, dout share the compute dtype;
// out/dinp have it too (f32 also accepted); dweight/dbias are f32 (or the
// compute dtype) and accumulate, so bf16 GEMM inputs meet an f32 D with beta 1.
#include "cuda/blas/lt_gemm.h"
#include "cuda/blas/matmul_parts.h"
#include "cuda/core/reduce.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T>
__global__ void add_bias_kernel(T* out /* (N, OC) */, AnyPtr bias /* (OC) */, int64_t N,
                                int64_t OC) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * OC;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(out[i]) + load(bias, i % OC));
}

// The column-reduction functor of dbias (cuda/core/reduce.cuh): v = dout.
template <class T> struct BiasGrad {
  const T* dout;  // (N, OC)
  int64_t OC;
  static constexpr int kVW = vec_width(sizeof(T));
  bool vectorisable() const { return rows_vectorisable(dout, sizeof(T), OC, kVW); }
  template <int V> __device__ void operator()(int64_t n, int64_t c, float (&v)[1][V]) const {
    load_f<V>(dout + n * OC, c, v[0]);
  }
};

}  // namespace

void add_bias_grad(const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC, const Stream& s) {
  dispatch_float(dout.dtype(), "bias gradient", [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_reduce<1>(BiasGrad<T>{dout.data<T>(), OC}, N, OC, ColumnOut<1>{{any_ptr(dbias)}}, s);
  });
}

std::string fused_bias_problem(const Tensor& bias, const Tensor& out) {
  if (reinterpret_cast<uintptr_t>(bias.raw()) % 16 != 0) return "bias is not 16-byte aligned";
  if (bias.dtype() != out.dtype())
    return std::string("bias is ") + dtype_name(bias.dtype()) + ", the output " + dtype_name(out.dtype());
  return "";
}

void matmul_forward(const MatmulArgs& a, const Stream& s) {
  const char* op = "matmul_forward";
  int64_t OC = a.weight.size(0), C = a.weight.size(1);
  int64_t N = C ? a.inp.numel() / C : 0;
  const DType dt = a.inp.dtype();
  expect_compute(a.weight, dt, op, "weight", "inp");
  if (a.out.dtype() != DType::F32) expect_compute(a.out, dt, op, "out", "inp");
  if (a.bias.defined()) expect_grad(a.bias, dt, op, "bias");
  if (N == 0 || OC == 0) return;
  DS_CUDA_REQUIRE(C > 0, std::string(op) + ": C must be > 0");
  LtGemm g;
  g.transa = true;
  g.m = OC; g.n = N; g.k = C;
  g.A = a.weight.raw(); g.lda = C;
  g.B = a.inp.raw(); g.ldb = C;
  g.D = a.out.raw(); g.ldd = OC;
  g.ab_type = a.inp.dtype();
  g.d_type = a.out.dtype();
  const bool fuse_bias = a.bias.defined() && fused_bias_problem(a.bias, a.out).empty();
  g.bias = fuse_bias ? a.bias.raw() : nullptr;
  g.bias_type = fuse_bias ? a.bias.dtype() : DType::F32;
  if (lt_gemm(g, s)) {  // a GEMM without epilogue always runs (or throws)
    if (fuse_bias || !a.bias.defined()) return;
  } else {  // the fused bias was refused: plain GEMM, then the bias kernel
    g.bias = nullptr;
    lt_gemm(g, s);
  }
  dispatch_float(a.out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_bias_kernel<T><<<grid_for(N * OC, 256), 256, 0, stream_of(s)>>>(
        a.out.data<T>(), any_ptr(a.bias), N, OC);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void matmul_backward(const MatmulBwdArgs& a, const Stream& s) {
  const char* op = "matmul_backward";
  int64_t OC = a.weight.size(0), C = a.weight.size(1);
  int64_t N = C ? a.inp.numel() / C : 0;
  const DType dt = a.inp.dtype();
  expect_compute(a.weight, dt, op, "weight", "inp");
  expect_compute(a.dout, dt, op, "dout", "inp");
  if (a.dinp.defined() && a.dinp.dtype() != DType::F32) expect_compute(a.dinp, dt, op, "dinp", "inp");
  if (a.dweight.defined()) expect_grad(a.dweight, dt, op, "dweight");
  if (a.dbias.defined()) expect_grad(a.dbias, dt, op, "dbias");
  if (N == 0 || C == 0 || OC == 0) return;
  if (a.dbias.defined()) add_bias_grad(a.dbias, a.dout, N, OC, s);
  if (a.dinp.defined()) {
    LtGemm g;
    g.m = C; g.n = N; g.k = OC;
    g.A = a.weight.raw(); g.lda = C;
    g.B = a.dout.raw(); g.ldb = OC;
    g.D = a.dinp.raw(); g.ldd = C;
    g.ab_type = a.dout.dtype();
    g.d_type = a.dinp.dtype();
    g.beta = a.accum == Accum::Add ? 1.0f : 0.0f;
    lt_gemm(g, s);
  }
  if (a.dweight.defined()) {
    LtGemm g;
    g.transb = true;
    g.m = C; g.n = OC; g.k = N;
    g.A = a.inp.raw(); g.lda = C;
    g.B = a.dout.raw(); g.ldb = OC;
    g.D = a.dweight.raw(); g.ldd = C;
    g.ab_type = a.inp.dtype();
    g.d_type = a.dweight.dtype();
    g.beta = 1.0f;
    lt_gemm(g, s);
  }
}

}  // namespace ds::cuda
