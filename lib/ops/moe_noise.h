// Random numbers and selection keys of the Mixture-of-Experts gate
// (moe_gate_forward, lib/ops/op_args.h), shared by the CPU and CUDA backends
// so that both draw the same noise and keep the same tokens. Every draw is a
// pure function of (noise_seed, noise_stream, purpose, token, expert), hashed
// with the dropout masks' splitmix64 finaliser (lib/ops/dropout_mask.h): no
// generator state, any thread order. The drop decisions compare 64-bit
// integer keys, never floats computed by a backend's own math library.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/ops/dropout_mask.h"
#include "lib/ops/host_device.h"

namespace ds {

// What a draw is for: the two never share values.
enum class MoeNoise : uint64_t { Gumbel = 1, Rts = 2, Jitter = 3 };

// DeepSpeed's multiplicative jitter (noisy gate policy "Jitter"): element
// (row, col) of the gate's input is scaled by a uniform in (1 - eps, 1 + eps).
DS_HOST_DEVICE float moe_jitter_factor(uint64_t key, int64_t row, int64_t col, float eps);

// The key of one gate call's draws of one purpose.
DS_HOST_DEVICE uint64_t moe_noise_key(uint64_t seed, uint64_t stream, MoeNoise what) {
  uint64_t h = dropout_mix(seed ^ 0x6d6f652d67617465ull);  // "moe-gate"
  h = dropout_mix(h ^ stream);
  return dropout_mix(h ^ static_cast<uint64_t>(what));
}

// 64 random bits of (token, expert).
DS_HOST_DEVICE uint64_t moe_noise_bits(uint64_t key, int64_t token, int64_t expert) {
  return dropout_mix(dropout_mix(key ^ static_cast<uint64_t>(token)) ^ static_cast<uint64_t>(expert));
}

// Uniform in (0, 1) strictly: the top 53 bits, centred in their interval.
DS_HOST_DEVICE double moe_uniform(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// A standard Gumbel sample, -log(-log(u)), in double (finite: u is never 0 or 1).
DS_HOST_DEVICE double moe_gumbel(uint64_t bits) { return -log(-log(moe_uniform(bits))); }

// The gate's token order. With seq > 0 the N rows are (N / seq samples, seq
// positions) and the i-th token is position i / B of sample i % B (B = N /
// seq): Megatron's [s, b, h] order; else the i-th token is row i.
DS_HOST_DEVICE int64_t moe_token_row(int64_t i, int64_t N, int64_t seq) {
  if (seq <= 0) return i;
  const int64_t B = N / seq;
  return (i % B) * seq + i / B;
}
// The inverse: the order index of row n.
DS_HOST_DEVICE int64_t moe_token_order(int64_t n, int64_t N, int64_t seq) {
  if (seq <= 0) return n;
  const int64_t B = N / seq;
  return (n % seq) * B + n / seq;
}

// Selection keys: a strict total order on (value descending, token ascending),
// as one unsigned integer, larger = kept first. The token index fills the
// low 32 bits (N < 2^32), inverted so that the lower token wins a tie.
DS_HOST_DEVICE uint64_t moe_key(uint32_t value_order, int64_t token) {
  return (static_cast<uint64_t>(value_order) << 32) | (0xffffffffull - static_cast<uint64_t>(token));
}

// A float's bits mapped to an unsigned integer of the same order (-0 as +0).
DS_HOST_DEVICE uint32_t moe_float_order(float v) {
  if (v == 0.f) v = 0.f;
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The key of random token selection (top-1 `rts`): the uniform's top 32 bits
// (the uniform is monotone in them; ties go to the lower token).
DS_HOST_DEVICE uint64_t moe_rts_key(uint64_t rts_key, int64_t token, int64_t expert) {
  return moe_key(static_cast<uint32_t>(moe_noise_bits(rts_key, token, expert) >> 32), token);
}

DS_HOST_DEVICE float moe_jitter_factor(uint64_t key, int64_t row, int64_t col, float eps) {
  return static_cast<float>(1.0 - eps + 2.0 * eps * moe_uniform(moe_noise_bits(key, row, col)));
}

}  // namespace ds
