// Thin cuBLASLt wrapper: one column-major GEMM D = alpha*op(A)*op(B) + beta*D
// with optional bias and GELU epilogues. Descriptors and the heuristic's algorithm are
// cached per shape/dtype/alignment; the workspace is per stream.
// Host-only header (includes cuBLASLt but no kernels).
#pragma once
#include <cstdint>
#include <string>

#include "lib/core/dtype.h"
#include "lib/core/stream.h"

namespace ds::cuda {

// The activation part of the epilogue (combined with `bias`):
//  - GeluAux: D = gelu(alpha*op(A)*op(B) + bias), and aux = the GELU input
//    (cuBLASLt's GELU_AUX / GELU_AUX_BIAS).
//  - DGelu: D = (alpha*op(A)*op(B)) * gelu'(aux), aux read; with `bias` set,
//    `bias` RECEIVES the bias gradient (sum of D over its n columns, one value
//    per row, overwritten) (cuBLASLt's DGELU / DGELU_BGRAD).
// GELU is the tanh approximation in both. aux is (m, n) col-major with ld_aux
// (a multiple of 8) in D's dtype.
enum class LtAct : uint8_t { None, GeluAux, DGelu };

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
  const void* bias = nullptr;        // (m) added to every column, or null; DGelu: (m) bias gradient out
  DType bias_type = DType::F32;
  LtAct act = LtAct::None;
  void* aux = nullptr;               // (m, n) col-major, ld_aux; GeluAux: written, DGelu: read
  int64_t ld_aux = 0;
};

// Runs the GEMM on stream s. Returns false (and runs nothing) when a fused
// epilogue (bias, GELU) was asked for and cuBLASLt has no algorithm for it
// with these types, dtypes and pointer alignments (bias and aux included),
// or refuses the chosen one at run time (CUBLAS_STATUS_NOT_SUPPORTED); the
// caller then runs its unfused kernels; `why` (if given) receives the reason.
// Throws on other errors.
bool lt_gemm(const LtGemm& g, const Stream& s, std::string* why = nullptr);

// Whether the GELU epilogues (matmul_bias_gelu_forward, matmul_dgelu_bgrad)
// may be used: Fused (default) tries them and falls back per shape; Unfused
// always runs the separate GEMM + GELU kernels (tests and benchmarks compare
// the two). Until set, the environment variable DS_GEMM_EPILOGUES
// (fused|unfused) decides; another value is an error naming it.
enum class GemmEpilogues : uint8_t { Fused, Unfused };
void set_gemm_epilogues(GemmEpilogues e);
GemmEpilogues gemm_epilogues();
// DS_GEMM_EPILOGUES's value (null or empty: Fused); throws naming the variable.
GemmEpilogues parse_gemm_epilogues(const char* value);

// Calls of the GELU ops per path since start, so tests can assert which ran.
struct EpiloguePathCounts {
  int64_t fused_fwd = 0, unfused_fwd = 0, fused_bwd = 0, unfused_bwd = 0;
};
EpiloguePathCounts epilogue_path_counts();
void count_epilogue_path(bool backward, bool fused);

}  // namespace ds::cuda
