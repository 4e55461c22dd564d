// bf16 GEMMs through oneDNN's matmul primitive (see bf16_gemm.h).
//
// Determinism: every call runs on one thread with OpenMP's thread count for
// nested work set to 1 before the primitive is created and run, so oneDNN
// plans and runs the same single-threaded kernel however many threads the
// program has. Primitives are cached per thread and per shape (a training
// step has a few dozen tile shapes); each thread owns its scratchpad.
//
// Callers pass strided views (tiles of larger matrices, heads inside qkv
// rows); oneDNN 2.6 runs those on its gemm kernels (`gemm:jit`, AVX512-BF16),
// and only dense operands on its brgemm kernels, the ones that use AMX.
// Copying operands dense here measured no faster on AVX512-BF16 (brgemm 6-8%
// faster per GEMM, the copies eat it); to revisit on an AMX CPU.
#include "lib/cpu/bf16_gemm.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "lib/core/error.h"
#include "lib/cpu/cpu_ops.h"

#if DS_HAVE_DNNL
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dnnl.hpp>
#include <map>
#include <memory>
#include <tuple>
#include <vector>
#endif

namespace ds::cpu {
namespace {

#if DS_HAVE_DNNL
struct CpuFeatures {
  bool avx512_bf16 = false, amx_bf16 = false, amx_permitted = false;
};

uint64_t xcr0() {
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

CpuFeatures detect_features() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return f;  // OSXSAVE
  const uint64_t xcr = xcr0();
  const bool avx512_state = (xcr & 0xe6) == 0xe6;           // SSE, AVX, opmask, ZMM state
  const bool amx_state = (xcr & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30);
  f.amx_bf16 = amx_state && (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
  const unsigned max_sub = a;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = avx512_state && avx512f && avx512bw && (a & (1u << 5));
  }
  if (f.amx_bf16) {
    // Linux keeps AMX tile data off until a process asks for it
    // (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, kernel 5.16+).
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  return f;
}

std::string dnnl_version_string() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

// The implementation oneDNN picks for a bf16 matmul on a tile of a larger
// output (strided, as matmul.cpp passes them), e.g. "gemm:jit"; empty when it
// has none.
std::string probe_impl() {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc a({64, 64}, dt::bf16, tag::ab), b({64, 64}, dt::bf16, tag::ab),
        c({64, 64}, dt::f32, dnnl::memory::dims{128, 1});
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(eng, a, b, c);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
#endif
    return pd.impl_info_str();
  } catch (const dnnl::error&) {
    return {};
  }
}
#endif  // DS_HAVE_DNNL

Bf16GemmMode decide_mode() {
  Bf16GemmMode m;
  const char* env = std::getenv("DS_CPU_BF16_GEMM");
  const std::string want = env && *env ? env : "auto";
  DS_USER_CHECK(want == "auto" || want == "f32", "DS_CPU_BF16_GEMM '{}': expected auto or f32", want);
  const char* emulated = "bf16 matmuls on cpu: f32 kernels over upcast copies";
  if (want == "f32") {
    m.description = fmt::format("{} (DS_CPU_BF16_GEMM=f32)", emulated);
    return m;
  }
#if DS_HAVE_DNNL
  const CpuFeatures f = detect_features();
  const bool amx = f.amx_bf16 && f.amx_permitted;
  if (!amx && !f.avx512_bf16) {
    m.description = fmt::format("{} (the CPU has neither AMX-BF16{} nor AVX512-BF16)", emulated,
                                f.amx_bf16 ? " permitted by the kernel" : "");
    return m;
  }
  // oneDNN may be held below the CPU (ONEDNN_MAX_CPU_ISA): then its bf16
  // kernels convert to f32 and are slower than our f32 path.
  const unsigned eff = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned need = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((eff & need) != need) {
    m.description = fmt::format("{} ({} is limited to an ISA without bf16 dot products: ONEDNN_MAX_CPU_ISA)",
                                emulated, dnnl_version_string());
    return m;
  }
  const std::string impl = probe_impl();
  // oneDNN without a native bf16 kernel (ONEDNN_MAX_CPU_ISA set lower, or an
  // unknown CPU) would run a reference loop: slower than our f32 path.
  if (impl.empty() || impl.rfind("ref", 0) == 0) {
    m.description = fmt::format("{} ({} has no native bf16 matmul here: '{}')", emulated, dnnl_version_string(),
                                impl);
    return m;
  }
  m.isa = amx ? Bf16GemmIsa::AmxBf16 : Bf16GemmIsa::Avx512Bf16;
  m.description = fmt::format("bf16 matmuls on cpu: {} ({}, {}), f32 accumulation", dnnl_version_string(), impl,
                              amx ? "AMX-BF16" : "AVX512-BF16");
#else
  m.description = fmt::format("{} (built without oneDNN)", emulated);
#endif
  return m;
}

}  // namespace

const Bf16GemmMode& bf16_gemm_mode() {
  static std::once_flag once;
  static Bf16GemmMode mode;
  std::call_once(once, [] { mode = decide_mode(); });
  return mode;
}

const char* lowp::description() { return bf16_gemm_mode().description.c_str(); }

#if DS_HAVE_DNNL
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

struct Prim {
  dnnl::matmul mm;
  dnnl::memory::desc a, b, c;
  size_t scratch = 0;
};

// One thread's oneDNN objects: engine, stream, primitives by shape (at most
// kMaxPrims), scratchpad.
constexpr size_t kMaxPrims = 1024;
struct ThreadDnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  std::map<Key, std::unique_ptr<Prim>> prims;
  std::vector<uint8_t> scratch;

  const Prim& get(const Bf16Gemm& g) {
    const Key k{g.M, g.N, g.K, g.a_rs, g.a_cs, g.b_rs, g.b_cs, g.ldc, g.accumulate};
    auto it = prims.find(k);
    if (it != prims.end()) return *it->second;
    // Shapes that keep changing (curriculum sequence lengths, prompts) would
    // grow the cache without end: past kMaxPrims (about 30 KB each) it starts
    // over. A step at T 8192 needs about 950 (attention: 7 per 64-row block).
    if (prims.size() >= kMaxPrims) prims.clear();
    using dt = dnnl::memory::data_type;
    auto p = std::make_unique<Prim>();
    p->a = dnnl::memory::desc({g.M, g.K}, dt::bf16, {g.a_rs, g.a_cs});
    p->b = dnnl::memory::desc({g.K, g.N}, dt::bf16, {g.b_rs, g.b_cs});
    p->c = dnnl::memory::desc({g.M, g.N}, dt::f32, {g.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (g.accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(eng, p->a, p->b, p->c, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->a, p->b, p->c), attr, eng);
#endif
    p->scratch = pd.scratchpad_desc().get_size();
    p->mm = dnnl::matmul(pd);
    return *prims.emplace(k, std::move(p)).first->second;
  }
};

}  // namespace

void bf16_gemm(const Bf16Gemm& g) {
  DS_CHECK(bf16_gemm_mode().isa != Bf16GemmIsa::None, "bf16_gemm: no native bf16 GEMM on this CPU");
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) {
    if (!g.accumulate)
      for (int64_t i = 0; i < g.M; ++i) std::memset(g.c + i * g.ldc, 0, g.N * sizeof(float));
    return;
  }
  // oneDNN plans and runs one thread: OpenMP's thread count for this task's
  // nested work is 1 while it runs (restored after, also outside a parallel
  // region).
  struct OneThread {
    int prev = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(prev); }
  } one_thread;
  thread_local ThreadDnnl t;
  const Prim& p = t.get(g);
  if (t.scratch.size() < p.scratch) t.scratch.resize(p.scratch);
  dnnl::memory am(p.a, t.eng, const_cast<uint16_t*>(g.a)), bm(p.b, t.eng, const_cast<uint16_t*>(g.b)),
      cm(p.c, t.eng, g.c);
  dnnl::memory sm({{static_cast<int64_t>(p.scratch)}, dnnl::memory::data_type::u8, dnnl::memory::format_tag::a},
                  t.eng, t.scratch.data());
  p.mm.execute(t.st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  t.st.wait();
}

#else

void bf16_gemm(const Bf16Gemm&) { DS_CHECK(false, "bf16_gemm: built without oneDNN"); }

#endif

}  // namespace ds::cpu
