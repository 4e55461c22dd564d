// The element-wise steps of the 1-bit exchange (OneBitPackArgs,
// OneBitServerArgs, OneBitUnpackArgs in lib/ops/op_args.h) on the CPU.
#include <cmath>
#include <cstdint>

#include "lib/cpu/cpu_ops.h"

namespace ds::cpu {
namespace {

float sign_at(const uint8_t* bits, int64_t i) { return (bits[i / 8] >> (7 - i % 8)) & 1 ? 1.f : -1.f; }

}  // namespace

void onebit_pack(const OneBitPackArgs& a, const Stream&) {
  const int64_t n = a.x.numel();
  const float s = static_cast<float>(std::sqrt(static_cast<double>(a.sumsq.data<float>()[0])) /
                                     std::sqrt(static_cast<double>(n)));
  float* x = a.x.data<float>();
  uint8_t* bits = a.bits.data<uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t byte = 0; byte < n / 8; ++byte) {
    uint8_t b = 0;
    for (int k = 0; k < 8; ++k) {
      float& v = x[byte * 8 + k];
      const bool pos = !(v < 0.f);
      b = static_cast<uint8_t>((b << 1) | (pos ? 1 : 0));
      v -= pos ? s : -s;
    }
    bits[byte] = b;
  }
  a.scale.data<float>()[0] = s;
}

void onebit_server(const OneBitServerArgs& a, const Stream&) {
  const int64_t n = a.x.numel(), row = n / 8;
  const int W = static_cast<int>(a.scales.numel());
  const float inv_w = 1.f / static_cast<float>(W);
  const float* scales = a.scales.data<float>();
  const uint8_t* bits = a.bits.data<uint8_t>();
  float* x = a.x.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) {
    float s = 0.f;
    for (int r = 0; r < W; ++r) s += sign_at(bits + r * row, k) * (scales[r] * inv_w);
    x[k] = s + x[k];
  }
}

void onebit_unpack(const OneBitUnpackArgs& a, const Stream&) {
  const float* scales = a.scales.data<float>();
  const uint8_t* bits = a.bits.data<uint8_t>();
  float* out = a.out.data<float>();
  const int64_t n = a.out.numel(), chunk = a.chunk;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = scales[i / chunk] * sign_at(bits, i);
}

}  // namespace ds::cpu
