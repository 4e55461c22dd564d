// CPU matmul pieces other code shares with lib/cpu/matmul.cpp: the bias
// gradient's column sum, so that the fused GELU backward's CPU version
// (lib/cpu/matmul_gelu.cpp) sums in the same order as matmul_backward.
#pragma once
#include <cstdint>

namespace ds::cpu {

// dbias[c] += sum over n of dout[n, c], per block of 64 columns in row order,
// in double.
void matmul_bias_grad(float* dbias /* (OC) += */, const float* dout /* (N, OC) */, int64_t N, int64_t OC);

}  // namespace ds::cpu
