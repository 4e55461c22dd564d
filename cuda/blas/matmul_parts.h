// Pieces of cuda/blas/matmul.cu that the fused GELU GEMMs
// (cuda/blas/matmul_gelu.cu) reuse on their unfused path. Host-only header.
#pragma once
#include <cstdint>
#include <string>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds::cuda {

// dbias (OC) += column sums of dout (N, OC), by the deterministic column
// reduction (cuda/core/reduce.cuh); dbias f32 or dout's dtype.
void add_bias_grad(const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC, const Stream& s);

// Why a bias is not handed to a cuBLASLt epilogue ("" when it may be): it
// must be 16-byte aligned (biases are views into the flat parameter buffer;
// a misaligned bias has faulted cuBLASLt kernels, a sticky error no fallback
// catches) and of the output's dtype (cuBLASLt's rule outside int8/fp8).
std::string fused_bias_problem(const Tensor& bias, const Tensor& out);

}  // namespace ds::cuda
