// 128-bit vectorised memory access for the memory-bound kernels.
//
// Packed<T, N> is N elements moved as one aligned unit (16 bytes for
// N = 16 / sizeof(T); an f32 Packed<float, 8> is two 16-byte accesses).
// Pointers reaching a kernel are not always aligned: parameters and
// gradients are views into one flat buffer at arbitrary element offsets, and
// row lengths need not be multiples of N. So every vectorised kernel runs
// from a VecPlan computed on the host: a scalar head (elements before the
// first pointer reaches 16-byte alignment), a vector body, a scalar tail.
// When the pointers of one call disagree in alignment phase (e.g. f32 master
// weights at an odd offset beside moments allocated at 0), the body is empty
// and every element takes the scalar path: slower, same result. The
// per-element arithmetic is the same on both paths, so results do not depend
// on alignment.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "cuda/core/common.cuh"

namespace ds::cuda {

constexpr int kVecBytes = 16;

template <class T, int N> struct alignas(sizeof(T) * N < kVecBytes ? sizeof(T) * N : kVecBytes) Packed {
  T v[N];
};

// N elements of p[i..i+N) (p + i aligned as Packed<T, N> requires).
template <int N, class T> __device__ __forceinline__ Packed<T, N> load_vec(const T* p, int64_t i) {
  return *reinterpret_cast<const Packed<T, N>*>(p + i);
}
template <int N, class T> __device__ __forceinline__ void store_vec(T* p, int64_t i, const Packed<T, N>& x) {
  *reinterpret_cast<Packed<T, N>*>(p + i) = x;
}
// Loads converted to f32 / stores from f32.
template <int N, class T> __device__ __forceinline__ void load_f(const T* p, int64_t i, float (&out)[N]) {
  Packed<T, N> x = load_vec<N>(p, i);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_f(x.v[k]);
}
template <int N, class T> __device__ __forceinline__ void store_f(T* p, int64_t i, const float (&in)[N]) {
  Packed<T, N> x;
#pragma unroll
  for (int k = 0; k < N; ++k) x.v[k] = from_f<T>(in[k]);
  store_vec<N>(p, i, x);
}

// Elements per vector for a kernel whose narrowest array has `min_elem_bytes`.
constexpr int vec_width(int min_elem_bytes) { return kVecBytes / min_elem_bytes; }

// One array of a call: its address and element size.
struct VecPtr {
  const void* p;
  int elem;  // bytes per element
};

// Split of [0, n) into scalar head [0, head), vector body [head, head + nvec*N)
// and scalar tail [head + nvec*N, n).
struct VecPlan {
  int64_t n = 0, head = 0, nvec = 0;
  int width = 1;  // N
  int64_t tail() const { return head + nvec * width; }
};

inline int64_t align_of_vec(int elem, int N) {
  int64_t b = int64_t(elem) * N;
  return b < kVecBytes ? b : kVecBytes;
}

// Plan for arrays indexed by the same element index (null pointers are skipped).
inline VecPlan plan_vec(int64_t n, int N, std::initializer_list<VecPtr> ptrs) {
  VecPlan pl;
  pl.n = n;
  pl.width = N;
  const VecPtr* first = nullptr;
  for (const VecPtr& v : ptrs)
    if (v.p) {
      first = &v;
      break;
    }
  if (!first || N <= 1) return pl;
  const int64_t a0 = align_of_vec(first->elem, N);
  const auto addr0 = reinterpret_cast<uintptr_t>(first->p);
  if (addr0 % first->elem) return pl;
  int64_t head = int64_t((a0 - int64_t(addr0 % a0)) % a0) / first->elem;
  if (head > n) return pl;
  for (const VecPtr& v : ptrs) {
    if (!v.p) continue;
    const auto addr = reinterpret_cast<uintptr_t>(v.p) + uintptr_t(head) * v.elem;
    if (addr % uintptr_t(align_of_vec(v.elem, N))) return pl;  // phases disagree: all scalar
  }
  pl.head = head;
  pl.nvec = (n - head) / N;
  return pl;
}

// Grid-stride loop over a plan: vf(i) for each vector start i of the body,
// sf(i) for every head and tail element. Each element is visited once.
template <int N, class VF, class SF>
__device__ __forceinline__ void vec_loop(const VecPlan& pl, VF&& vf, SF&& sf) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = tid; k < pl.nvec; k += stride) vf(pl.head + k * N);
  const int64_t tail0 = pl.head + pl.nvec * N, nscalar = pl.head + (pl.n - tail0);
  for (int64_t k = tid; k < nscalar; k += stride) sf(k < pl.head ? k : tail0 + (k - pl.head));
}

// Elementwise maps over a plan, out[i] = f(a[i]) or f(a[i], b[i]) in f32:
// the same function on the vector body and on the scalar head/tail, so the
// result cannot depend on alignment. `out` may alias an input (every input of
// an element is loaded before it is stored).
template <int N, class To, class Ta, class F>
__device__ __forceinline__ void vec_map(const VecPlan& pl, To* out, const Ta* a, F&& f) {
  vec_loop<N>(
      pl,
      [&](int64_t i) {
        float x[N];
        load_f<N>(a, i, x);
#pragma unroll
        for (int k = 0; k < N; ++k) x[k] = f(x[k]);
        store_f<N>(out, i, x);
      },
      [&](int64_t i) { out[i] = from_f<To>(f(to_f(a[i]))); });
}
template <int N, class To, class Ta, class Tb, class F>
__device__ __forceinline__ void vec_map(const VecPlan& pl, To* out, const Ta* a, const Tb* b, F&& f) {
  vec_loop<N>(
      pl,
      [&](int64_t i) {
        float x[N], y[N];
        load_f<N>(a, i, x);
        load_f<N>(b, i, y);
#pragma unroll
        for (int k = 0; k < N; ++k) x[k] = f(x[k], y[k]);
        store_f<N>(out, i, x);
      },
      [&](int64_t i) { out[i] = from_f<To>(f(to_f(a[i]), to_f(b[i]))); });
}

// Blocks for a plan: enough threads for the body (or the scalars when the
// body is empty), capped.
inline unsigned grid_for_plan(const VecPlan& pl, int threads, int64_t max_blocks = 65536) {
  int64_t work = pl.nvec + pl.head + (pl.n - pl.tail());
  return grid_for(work, threads, max_blocks);
}

// True when a row-major (rows, C) array at p can be read as whole vectors of
// N per row: base aligned and C a multiple of N (every row start aligned).
inline bool rows_vectorisable(const void* p, int elem, int64_t C, int N) {
  if (!p) return true;
  return C % N == 0 && reinterpret_cast<uintptr_t>(p) % uintptr_t(align_of_vec(elem, N)) == 0;
}

// N elements of a run-time typed vector (AnyPtr: f32 or the compute dtype),
// p + i aligned for its element type.
template <int N> __device__ __forceinline__ void load_any(AnyPtr a, int64_t i, float (&out)[N]) {
  switch (a.t) {
    case FType::BF16: load_f<N>(static_cast<const bf16*>(a.p), i, out); break;
    case FType::F16: load_f<N>(static_cast<const f16*>(a.p), i, out); break;
    default: load_f<N>(static_cast<const float*>(a.p), i, out); break;
  }
}
template <int N> __device__ __forceinline__ void store_any(AnyPtr a, int64_t i, const float (&in)[N]) {
  switch (a.t) {
    case FType::BF16: store_f<N>(static_cast<bf16*>(a.p), i, in); break;
    case FType::F16: store_f<N>(static_cast<f16*>(a.p), i, in); break;
    default: store_f<N>(static_cast<float*>(a.p), i, in); break;
  }
}
inline int elem_bytes(const AnyPtr& a) { return a.t == FType::F32 ? 4 : 2; }

}  // namespace ds::cuda
