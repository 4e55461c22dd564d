// cuBLASLt wrapper (see lt_gemm.h). FP32 problems use CUBLAS_COMPUTE_32F (no
// TF32), bf16/f16 use fp32 accumulation. Plans (descriptors + algorithm) are
// cached per (device, shape, dtypes, epilogue, pointer alignment) because the
// heuristic query costs far more than the GEMM for small shapes. The bias is a
// view into the flat parameter buffer, so its alignment varies: it is part of
// the key, the heuristic sees the real bias pointer, and an algorithm that
// cublasLtMatmul refuses for it turns the plan into "no fused bias" (the
// caller then adds the bias with its own kernel). The GELU epilogues work the
// same way: the aux matrix's alignment and leading dimension are part of the
// key, and any refusal (no algorithm, NOT_SUPPORTED or INVALID_VALUE at run
// time) makes the plan "unfused" for its key, with the reason kept for the
// caller's one log line.
#include "cuda/blas/lt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/core/allocator.h"
#include "cuda/core/capture.h"
#include "cuda/core/check.h"

namespace ds::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::F32: return CUDA_R_32F;
    default: require_fail("dtype", std::string("lt_gemm: unsupported dtype ") + dtype_name(t),
                          __FILE__, __LINE__);
  }
}

int alignment_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

using PlanKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int, int, bool, int, int, int, int, int, int, int64_t, int>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  std::string refused;  // why a fused epilogue has no plan (for the caller's log line)
};

bool is_fused(const LtGemm& g) { return g.bias != nullptr || g.act != LtAct::None; }

cublasLtEpilogue_t epilogue_of(const LtGemm& g) {
  const bool b = g.bias != nullptr;
  switch (g.act) {
    case LtAct::GeluAux: return b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case LtAct::DGelu: return b ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    case LtAct::None: break;
  }
  return b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<PlanKey, Plan> plans;
};

LtState& state() {
  static LtState* s = new LtState();  // never destroyed (used until exit)
  return *s;
}

cublasLtHandle_t handle_for(LtState& st, int dev) {
  auto it = st.handles.find(dev);
  if (it != st.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  DS_CUBLAS_CHECK(cublasLtCreate(&h));
  st.handles[dev] = h;
  return h;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

Plan make_plan(cublasLtHandle_t h, const LtGemm& g, int al_a, int al_b, int al_d) {
  Plan p;
  DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (is_fused(g)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_of(g));
  if (g.bias) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(g.bias_type));
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);  // the heuristic sees the real pointer
  }
  if (g.act != LtAct::None) {  // aux keeps its default dtype: D's
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_aux);
  }
  cudaDataType_t tab = cuda_type(g.ab_type), td = cuda_type(g.d_type);
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, tab, g.transa ? g.k : g.m,
                                             g.transa ? g.m : g.k, g.lda));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, tab, g.transb ? g.n : g.k,
                                             g.transb ? g.k : g.n, g.ldb));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, td, g.m, g.n, g.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  uint32_t a32 = al_a, b32 = al_b, d32 = al_d;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof(a32)));
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof(b32)));
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d32, sizeof(d32)));
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d32, sizeof(d32)));
  cublasLtMatmulHeuristicResult_t res{};
  int count = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.d, p.d, pref, 1, &res, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
    p.algo = res.algo;
    p.ok = true;
  } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !is_fused(g)) {
    // With a fused epilogue any refusal (e.g. INVALID_VALUE for an f32 bias on
    // a 16-bit D) means "no fused algorithm": the caller runs its own kernels.
    DS_CUBLAS_CHECK(st);
  }
  if (!p.ok)
    p.refused = st == CUBLAS_STATUS_SUCCESS ? std::string("no cuBLASLt algorithm for this epilogue")
                                            : std::string("no cuBLASLt algorithm (") + cublasLtGetStatusName(st) + ")";
  return p;
}

// -1: not decided yet; the first use reads DS_GEMM_EPILOGUES.
std::atomic<int> g_epilogues{-1};
std::atomic<int64_t> g_fused_fwd{0}, g_unfused_fwd{0}, g_fused_bwd{0}, g_unfused_bwd{0};

}  // namespace

GemmEpilogues parse_gemm_epilogues(const char* value) {
  if (!value || !*value || std::strcmp(value, "fused") == 0) return GemmEpilogues::Fused;
  if (std::strcmp(value, "unfused") == 0) return GemmEpilogues::Unfused;
  require_fail("DS_GEMM_EPILOGUES",
               std::string("DS_GEMM_EPILOGUES='") + value + "' is not a choice: use 'fused' (default) or 'unfused'",
               __FILE__, __LINE__);
}

void set_gemm_epilogues(GemmEpilogues e) { g_epilogues = int(e); }

GemmEpilogues gemm_epilogues() {
  int v = g_epilogues.load();
  if (v < 0) {
    int unset = -1;
    g_epilogues.compare_exchange_strong(unset, int(parse_gemm_epilogues(std::getenv("DS_GEMM_EPILOGUES"))));
    v = g_epilogues.load();
  }
  return GemmEpilogues(v);
}

EpiloguePathCounts epilogue_path_counts() {
  return {g_fused_fwd.load(), g_unfused_fwd.load(), g_fused_bwd.load(), g_unfused_bwd.load()};
}

void count_epilogue_path(bool backward, bool fused) {
  (backward ? (fused ? g_fused_bwd : g_unfused_bwd) : (fused ? g_fused_fwd : g_unfused_fwd))++;
}

bool lt_gemm(const LtGemm& g, const Stream& s, std::string* why) {
  if (g.m == 0 || g.n == 0) return true;
  // cuBLASLt rejects k = 0; callers handle empty reductions themselves.
  DS_CUDA_REQUIRE(g.k > 0, "lt_gemm: k must be > 0");
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  int al_a = alignment_of(g.A), al_b = alignment_of(g.B), al_d = alignment_of(g.D);
  int al_bias = g.bias ? alignment_of(g.bias) : 0;
  int al_aux = g.act != LtAct::None ? alignment_of(g.aux) : 0;
  PlanKey key{dev, g.transa, g.transb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd,
              int(g.ab_type), int(g.d_type), g.bias != nullptr, int(g.bias_type),
              al_a, al_b, al_d, al_bias, int(g.act), g.ld_aux, al_aux};
  void* ws = stream_workspace(s, kWorkspaceBytes, WorkspaceSlot::Blas);
  LtState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  cublasLtHandle_t h = handle_for(st, dev);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, make_plan(h, g, al_a, al_b, al_d)).first;
  Plan& p = it->second;
  if (!p.ok) {
    if (why) *why = p.refused;
    DS_CUDA_REQUIRE(is_fused(g),
                    "cuBLASLt found no algorithm for GEMM m=" + std::to_string(g.m) +
                        " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " " +
                        dtype_name(g.ab_type) + "->" + dtype_name(g.d_type));
    return false;
  }
  if (g.bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.act != LtAct::None) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  const cublasStatus_t r = cublasLtMatmul(h, p.desc, &g.alpha, g.A, p.a, g.B, p.b, &g.beta, g.D, p.d, g.D, p.d,
                                          &p.algo, ws, kWorkspaceBytes, resolve_stream(s.handle));
  if ((r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE) && is_fused(g)) {
    p.ok = false;  // this key keeps falling back to the caller's unfused kernels
    p.refused = std::string("cublasLtMatmul refused it (") + cublasLtGetStatusName(r) + ")";
    if (why) *why = p.refused;
    return false;
  }
  DS_CUBLAS_CHECK(r);
  return true;
}

}  // namespace ds::cuda
