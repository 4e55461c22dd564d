// Hidden dropout fused with the residual add on the GPU: one thread per
// element, the mask drawn from the same hash as the CPU backend
// (lib/ops/dropout_mask.h), so both backends drop exactly the same elements.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

template <class T> struct DropoutParams {
  T* out;             // (B, T, C)
  const T* inp;       // (B, T, C)
  const T* residual;  // (B, T, C) or null
  int64_t T_, C, n;
  DropoutSpec d;
  uint32_t threshold;
  float scale;
};

template <class T>
__global__ void dropout_kernel(DropoutParams<T> p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.C, c = i - r * p.C;
    const uint64_t row = dropout_hidden_row(p.d.stream, p.d.sample0 + r / p.T_, p.d.pos0 + r % p.T_);
    float v = to_f(p.inp[i]) * dropout_factor(row, c, p.threshold, p.scale);
    if (p.residual) v += to_f(p.residual[i]);
    p.out[i] = from_f<T>(v);
  }
}

void run(const DropoutArgs& a, const Stream& s, const char* op, bool with_residual) {
  DS_CUDA_REQUIRE(a.out.dtype() == a.inp.dtype() && (!with_residual || a.residual.dtype() == a.inp.dtype()),
                  std::string(op) + ": dtypes differ: " + desc(a.out) + ", " + desc(a.inp) +
                      (with_residual ? ", " + desc(a.residual) : std::string()));
  const int64_t n = a.inp.numel();
  if (n == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutParams<T> p{a.out.data<T>(), a.inp.data<T>(), with_residual ? a.residual.data<T>() : nullptr,
                       a.inp.size(1), a.inp.size(2), n, a.dropout, dropout_threshold(a.dropout.p),
                       dropout_scale(a.dropout.p)};
    dropout_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void dropout_forward(const DropoutArgs& a, const Stream& s) {
  run(a, s, "dropout_forward", a.residual.defined());
}

void dropout_backward(const DropoutArgs& a, const Stream& s) { run(a, s, "dropout_backward", false); }

}  // namespace ds::cuda
