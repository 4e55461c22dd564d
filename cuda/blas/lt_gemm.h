// Thin cuBLASLt wrapper: one column-major GEMM D = alpha*op(A)*op(B) + beta*D
// with optional bias epilogue. Descriptors and the heuristic's algorithm are
// cached per shape/dtype/alignment; the workspace is per stream.
// Host-only header (includes cuBLASLt but no kernels).
#pragma once
#include <cstdint>

#include "lib/core/dtype.h"
#include "lib/core/stream.h"

namespace ds::cuda {

struct LtGemm {
  bool transa = false, transb = false;
  int64_t m = 0, n = 0, k = 0;       // op(A): (m, k), op(B): (k, n), D: (m, n)
  const void* A = nullptr;           // stored (transa ? k : m, transa ? m : k), col-major
  int64_t lda = 0;
  const void* B = nullptr;           // stored (transb ? n : k, transb ? k : n), col-major
  int64_t ldb = 0;
  void* D = nullptr;                 // (m, n) col-major, also the C input when beta != 0
  int64_t ldd = 0;
  DType ab_type = DType::F32;        // A and B
  DType d_type = DType::F32;
  float alpha = 1.0f, beta = 0.0f;
  const void* bias = nullptr;        // (m) added to every column, or null
  DType bias_type = DType::F32;
};

// Runs the GEMM on stream s. Returns false (and runs nothing) when cuBLASLt has
// no algorithm for the bias epilogue with these types, dtypes and pointer
// alignments (including the bias's), or refuses the chosen one at run time
// (CUBLAS_STATUS_NOT_SUPPORTED); throws on other errors.
bool lt_gemm(const LtGemm& g, const Stream& s);

}  // namespace ds::cuda
