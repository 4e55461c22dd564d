// Helpers shared by the CPU op implementations: the CPU-only argument checks, fixed-size chunked parallel loops (results independent of the
// OpenMP thread count) and per-thread scratch buffers reused across calls.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/tensor.h"

namespace ds::cpu {

// The op API validates every call before it reaches this backend
// (lib/ops/op_validate.cpp: shapes, dtypes, devices); what is left here is
// what only the CPU backend needs.

// A field that the op declares optional but the CPU kernel needs.
inline void require_defined(const Tensor& t, const char* op, const char* name) {
  DS_CHECK(t.defined(), "{}: tensor '{}' is undefined (the CPU backend needs it)", op, name);
}

// Leading rows and trailing width of a (..., C) tensor.
inline bool is_bf16(const Tensor& t) { return t.defined() && t.dtype() == DType::BF16; }

inline int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.numel() / t.size(-1); }

// Elements per chunk for elementwise loops and reductions. Fixed (not derived
// from the thread count) so that the split into vector body and scalar tail is
// the same however many threads run.
constexpr int64_t kChunk = 4096;

// Calls fn(begin, end) over [0, n) in kChunk-sized pieces, in parallel.
template <class F>
inline void parallel_chunks(int64_t n, F&& fn) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) fn(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// exp(x) for float with ~2 ulp error, written without branches or library
// calls so that loops using it vectorise (std::exp does not without
// -ffast-math). Cephes-style: x = n ln2 + r, polynomial for e^r, scale by 2^n.
// Returns 0 below -87.3 (including -inf) and saturates at exp(88.7).
inline float fast_exp(float x) {
  const float xc = std::min(std::max(x, -87.3f), 88.7f);
  const float fx = xc * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(fx);
  n -= static_cast<int32_t>(static_cast<float>(n) > fx);  // floor
  const float nf = static_cast<float>(n);
  float r = xc - nf * 0.693359375f;
  r = r + nf * 2.12194440e-4f;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale * static_cast<float>(x >= -87.3f);  // no branch: keeps loops vectorised
}

// max(x[0..n)), -inf for n == 0. Written as 16 running lane maxima so that it
// vectorises (a plain max reduction over floats does not).
inline float row_max(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  const float ninf = -std::numeric_limits<float>::infinity();
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = ninf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) m[l] = std::max(m[l], x[j + l]);
  }
  float r = ninf;
  for (; j < n; ++j) r = std::max(r, x[j]);
  for (int l = 0; l < kLanes; ++l) r = std::max(r, m[l]);
  return r;
}

// sum over j of exp(x[j] - shift), returned in double. Lanes of 32 float
// partial sums (several independent vector chains, so the adds do not wait on
// each other) are flushed into a double every 1024 elements; the order is
// fixed, so the result is deterministic.
inline double sum_exp(const float* x, int64_t n, float shift) {
  constexpr int kLanes = 32;
  constexpr int64_t kFlush = 1024;
  double total = 0.0;
  int64_t j = 0;
  while (j + kLanes <= n) {
    float lanes[kLanes] = {};
    const int64_t end = std::min(n, j + kFlush);
    for (; j + kLanes <= end; j += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lanes[l] += fast_exp(x[j + l] - shift);
    }
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
  }
  for (; j < n; ++j) total += fast_exp(x[j] - shift);
  return total;
}

// Per-thread scratch: slot `slot` of the calling thread, at least n floats,
// 64-byte aligned, contents undefined. Grows, never shrinks. Slot 7 is reserved
// for tables the calling thread fills before a parallel region and the workers
// only read; code inside parallel regions uses slots 0..6.
inline float* thread_scratch(size_t n, int slot) {
  struct Buf {
    std::vector<float> v;
  };
  constexpr int kSlots = 8;
  thread_local Buf bufs[kSlots];
  std::vector<float>& v = bufs[slot].v;
  if (v.size() < n + 16) v.resize(n + 16);
  uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

// Scratch of doubles owned by the calling thread (for cross-thread partials
// allocated before a parallel region).
inline double* thread_scratch_f64(size_t n) {
  thread_local std::vector<double> v;
  if (v.size() < n) v.resize(n);
  return v.data();
}

// f32 or bf16 elements (bf16: exact upcast, nearest-even rounding), for the
// kernels that take bf16 as it is (lowp::<op>).
inline float load(float x) { return x; }
inline float load(uint16_t x) { return bf16_to_f32(x); }
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = f32_to_bf16(v); }
inline bool all_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16) return false;
  return true;
}

}  // namespace ds::cpu
