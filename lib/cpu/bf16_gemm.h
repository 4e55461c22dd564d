// bf16 GEMMs on the CPU: bf16 inputs, f32 accumulation and output, on the
// CPU's bf16 dot-product instructions (AMX tiles or AVX512-BF16) through
// oneDNN's matmul primitive. The choice is made once per process
// (bf16_gemm_mode) from cpuid, the kernel's permission for AMX tile data and
// the environment variable DS_CPU_BF16_GEMM (`auto`, the default, or `f32`:
// bf16 matmuls run on the f32 kernels over upcast copies, as on a CPU without
// either instruction set). Without oneDNN in the build the mode is always f32.
//
// bf16_gemm() runs one GEMM single-threaded: the caller (lib/cpu/matmul.cpp)
// cuts a GEMM into output tiles chosen from its shape and runs the tiles on
// its OpenMP threads, so the result does not depend on the thread count.
#pragma once
#include <cstdint>
#include <string>

namespace ds::cpu {

enum class Bf16GemmIsa : uint8_t { None, Avx512Bf16, AmxBf16 };

struct Bf16GemmMode {
  Bf16GemmIsa isa = Bf16GemmIsa::None;  // None: bf16 matmuls are emulated in f32
  std::string description;              // one line for the start-up log
};

// Decided on first call (thread-safe); an invalid DS_CPU_BF16_GEMM throws
// ds::UserError naming it.
const Bf16GemmMode& bf16_gemm_mode();

// True where bf16 operands run as bf16 GEMMs (not emulated in f32).
inline bool bf16_gemm_available() { return bf16_gemm_mode().isa != Bf16GemmIsa::None; }

// C (M, N) [+]= op(A) (M, K) @ op(B) (K, N), single-threaded. A(i, k) =
// a[i * a_rs + k * a_cs] and B(k, j) = b[k * b_rs + j * b_cs] (bf16 bits; one
// of each pair of strides is 1), C row-major f32 with leading dimension ldc.
// accumulate: C += product (f32 adds onto what C holds), else C = product.
// Products are exact and summed in f32 in the kernel's order. Needs
// bf16_gemm_mode().isa != None.
struct Bf16Gemm {
  int64_t M = 0, N = 0, K = 0;
  const uint16_t* a = nullptr;
  int64_t a_rs = 0, a_cs = 1;
  const uint16_t* b = nullptr;
  int64_t b_rs = 0, b_cs = 1;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
};
void bf16_gemm(const Bf16Gemm& g);

}  // namespace ds::cpu
