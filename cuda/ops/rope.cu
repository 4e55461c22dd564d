// Rotary position embedding on the q and k parts of a packed qkv buffer,
// rotate-half convention (pairs j and j + HS/2). Backward is the inverse
// rotation. One thread per (token, pair): the angle is computed once in double
// (positions reach many thousands of radians) and applied to every q/k head.
#include "cuda/core/common.cuh"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

enum class RopeDir { Forward, Inverse };

template <class T> struct RopeParams {
  T* out;          // (B, T, 3*NH*HS)
  const T* inp;    // (B, T, 3*NH*HS)
  int64_t rows;    // B*T
  int64_t T_;      // sequence length
  int NH, HS;
  int64_t pos_offset;
  double log_theta;
  RopeDir dir;
  bool copy_v;     // out does not alias inp
};

template <class T>
__global__ void rope_kernel(RopeParams<T> p) {
  int half = p.HS / 2;
  int64_t total = p.rows * half;
  int64_t width = 3ll * p.NH * p.HS;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = i / half;
    int j = int(i - row * half);
    double pos = double(row % p.T_ + p.pos_offset);
    double freq = exp(-2.0 * j / p.HS * p.log_theta);
    double sd, cd;
    sincos(pos * freq, &sd, &cd);
    float c = float(cd), s = p.dir == RopeDir::Forward ? float(sd) : -float(sd);
    const T* x = p.inp + row * width;
    T* o = p.out + row * width;
    for (int h = 0; h < 2 * p.NH; ++h) {  // q heads then k heads
      int64_t b = int64_t(h) * p.HS + j;
      float x1 = to_f(x[b]), x2 = to_f(x[b + half]);
      o[b] = from_f<T>(x1 * c - x2 * s);
      o[b + half] = from_f<T>(x2 * c + x1 * s);
    }
    if (p.copy_v) {
      for (int h = 2 * p.NH; h < 3 * p.NH; ++h) {
        int64_t b = int64_t(h) * p.HS + j;
        o[b] = x[b];
        o[b + half] = x[b + half];
      }
    }
  }
}

void rope_launch(const RopeArgs& a, const Stream& s, RopeDir dir, const char* op) {
  int64_t Bn = a.inp.size(0), Tn = a.inp.size(1);
  int HS = int(a.inp.size(2) / (3 * a.NH));
  expect_compute(a.out, a.inp.dtype(), op, "out", "inp");
  int64_t rows = Bn * Tn;
  if (rows == 0) return;
  dispatch_float(a.inp.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    RopeParams<T> p{a.out.data<T>(), a.inp.data<T>(), rows, Tn, a.NH, HS, a.pos_offset,
                    std::log(double(a.theta)), dir, a.out.raw() != a.inp.raw()};
    rope_kernel<T><<<grid_for(rows * (HS / 2), 256), 256, 0, stream_of(s)>>>(p);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_forward(const RopeArgs& a, const Stream& s) {
  rope_launch(a, s, RopeDir::Forward, "rope_forward");
}
void rope_backward(const RopeArgs& a, const Stream& s) {
  rope_launch(a, s, RopeDir::Inverse, "rope_backward");
}

}  // namespace ds::cuda
