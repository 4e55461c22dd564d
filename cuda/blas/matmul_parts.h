// Pieces of cuda/blas/matmul.cu that the fused GELU GEMMs
// (cuda/blas/matmul_gelu.cu) reuse on their unfused path. Host-only header.
#pragma once
#include <cstdint>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds::cuda {

// dbias (OC) += column sums of dout (N, OC), by the deterministic column
// reduction (cuda/core/reduce.cuh); dbias f32 or dout's dtype.
void add_bias_grad(const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC, const Stream& s);

}  // namespace ds::cuda
