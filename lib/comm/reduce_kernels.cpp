// Member-order host reductions, blocked so that aliasing dst with a source is
// safe and the inner loops vectorize.
#include "lib/comm/reduce_kernels.h"

#include <algorithm>
#include <type_traits>

#include "lib/core/error.h"

namespace ds {
namespace {

constexpr int64_t kBlock = 1024;

// Storage type <-> accumulator conversions per dtype.
struct F32Io {
  using T = float;
  using A = float;
  static A load(T v) { return v; }
  static T store(A v) { return v; }
};
struct Bf16Io {
  using T = uint16_t;
  using A = float;
  static A load(T v) { return bf16_to_f32(v); }
  static T store(A v) { return f32_to_bf16(v); }
};
struct F16Io {
  using T = uint16_t;
  using A = float;
  static A load(T v) { return f16_to_f32(v); }
  static T store(A v) { return f32_to_f16(v); }
};
template <class Int>
struct IntIo {
  using T = Int;
  using A = int64_t;
  static A load(T v) { return static_cast<A>(v); }
  static T store(A v) { return static_cast<T>(v); }
};

template <class A>
inline A combine_max(A acc, A x) {
  if constexpr (std::is_floating_point_v<A>) {
    return (x > acc || x != x) ? x : acc;  // NaN wins once seen
  } else {
    return x > acc ? x : acc;
  }
}

template <class Io>
void reduce_typed(ReduceOp op, const std::vector<const void*>& srcs, void* dst, int64_t count) {
  using T = typename Io::T;
  using A = typename Io::A;
  A acc[kBlock];
  T* out = static_cast<T*>(dst);
  for (int64_t b = 0; b < count; b += kBlock) {
    int64_t n = std::min(kBlock, count - b);
    const T* s0 = static_cast<const T*>(srcs[0]) + b;
    for (int64_t j = 0; j < n; ++j) acc[j] = Io::load(s0[j]);
    for (size_t i = 1; i < srcs.size(); ++i) {
      const T* s = static_cast<const T*>(srcs[i]) + b;
      if (op == ReduceOp::Sum) {
        for (int64_t j = 0; j < n; ++j) acc[j] += Io::load(s[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) acc[j] = combine_max(acc[j], Io::load(s[j]));
      }
    }
    for (int64_t j = 0; j < n; ++j) out[b + j] = Io::store(acc[j]);
  }
}

}  // namespace

void reduce_in_order(DType dtype, ReduceOp op, const std::vector<const void*>& srcs, void* dst,
                     int64_t count) {
  DS_CHECK(!srcs.empty(), "reduce of no buffers");
  switch (dtype) {
    case DType::F32: return reduce_typed<F32Io>(op, srcs, dst, count);
    case DType::BF16: return reduce_typed<Bf16Io>(op, srcs, dst, count);
    case DType::F16: return reduce_typed<F16Io>(op, srcs, dst, count);
    case DType::I32: return reduce_typed<IntIo<int32_t>>(op, srcs, dst, count);
    case DType::I64: return reduce_typed<IntIo<int64_t>>(op, srcs, dst, count);
    case DType::U16: return reduce_typed<IntIo<uint16_t>>(op, srcs, dst, count);
    case DType::U8: return reduce_typed<IntIo<uint8_t>>(op, srcs, dst, count);
  }
  DS_THROW("reduce: unsupported dtype {}", dtype_name(dtype));
}

}  // namespace ds
