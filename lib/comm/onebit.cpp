// The error-compensated 1-bit all-reduce (onebit.h).
#include "lib/comm/onebit.h"

#include <cmath>
#include <numeric>

#include "lib/core/error.h"

namespace ds {
namespace {

// Sign bits of v[0, n) packed eight to a byte, the first element in the
// most significant bit (numpy's packbits order, as DeepSpeed packs them);
// a bit is set where the value is not negative (sign(0) counts as +1).
void pack_signs(const float* v, int64_t n, uint8_t* out) {
  for (int64_t byte = 0; byte < n / 8; ++byte) {
    uint8_t b = 0;
    for (int k = 0; k < 8; ++k) b = static_cast<uint8_t>((b << 1) | (v[byte * 8 + k] < 0.f ? 0 : 1));
    out[byte] = b;
  }
}

float sign_at(const uint8_t* bits, int64_t i) { return (bits[i / 8] >> (7 - i % 8)) & 1 ? 1.f : -1.f; }

// ||v|| / sqrt(n), accumulated in double.
float rms(const float* v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  return static_cast<float>(std::sqrt(s) / std::sqrt(static_cast<double>(n)));
}

// v <- v - scale sign(v), the sign bits of v (before the update) to `bits`.
void compress(float* v, int64_t n, float scale, uint8_t* bits) {
  pack_signs(v, n, bits);
  for (int64_t i = 0; i < n; ++i) v[i] -= v[i] < 0.f ? -scale : scale;
}

}  // namespace

int64_t onebit_padded_size(int64_t n, int world) {
  const int64_t divider = static_cast<int64_t>(world) * 8 / std::gcd(world, 8);  // lcm(world, 8)
  const int64_t unit = world * divider;
  return (n + unit - 1) / unit * unit;
}

int64_t onebit_bytes_sent(int64_t n, int world) {
  if (world <= 1) return 0;
  const int64_t np = onebit_padded_size(n, world), chunk_bytes = np / world / 8;
  return (world - 1) * chunk_bytes            // all-to-all: the other ranks' chunks of this rank's signs
         + (world - 1) * chunk_bytes          // all-gather: this rank's server signs to every other rank
         + 2 * (world - 1) * int64_t{4};      // the worker and server scales
}

void onebit_all_reduce(Communicator& c, float* x, int64_t n, OneBitErrors& e) {
  const int W = c.size();
  if (W <= 1) return;
  const int64_t np = onebit_padded_size(n, W), chunk = np / W, chunk_bytes = chunk / 8;
  if (static_cast<int64_t>(e.worker.size()) != np) e.worker.assign(static_cast<size_t>(np), 0.f);
  if (static_cast<int64_t>(e.server.size()) != chunk) e.server.assign(static_cast<size_t>(chunk), 0.f);
  // Worker: the input plus its last error (the padding adds nothing),
  // compressed; the buffer is left holding the new error b - s sign(b).
  float* b = e.worker.data();
  for (int64_t i = 0; i < n; ++i) b[i] += x[i];
  const float worker_scale = rms(b, np);
  std::vector<uint8_t> signs(static_cast<size_t>(np / 8)), recv(static_cast<size_t>(np / 8));
  compress(b, np, worker_scale, signs.data());
  c.all_to_all(signs.data(), recv.data(), chunk_bytes, DType::U8);
  std::vector<float> scales(static_cast<size_t>(W));
  c.all_gather(&worker_scale, scales.data(), 1, DType::F32);
  // Server: this rank's chunk, the mean of the ranks' compressed values plus
  // its error, compressed in place (leaving the new error).
  const float inv_w = 1.f / static_cast<float>(W);
  float* comp = e.server.data();
  for (int64_t k = 0; k < chunk; ++k) {
    float s = 0.f;
    for (int r = 0; r < W; ++r) s += sign_at(recv.data() + r * chunk_bytes, k) * (scales[r] * inv_w);
    comp[k] = s + comp[k];
  }
  const float server_scale = rms(comp, chunk);
  std::vector<uint8_t> server_signs(static_cast<size_t>(chunk_bytes));
  compress(comp, chunk, server_scale, server_signs.data());
  // Every chunk's signs and scale to every rank.
  std::vector<uint8_t> all_signs(static_cast<size_t>(np / 8));
  c.all_gather(server_signs.data(), all_signs.data(), chunk_bytes, DType::U8);
  c.all_gather(&server_scale, scales.data(), 1, DType::F32);
  for (int64_t i = 0; i < n; ++i) x[i] = scales[i / chunk] * sign_at(all_signs.data(), i);
}

}  // namespace ds
