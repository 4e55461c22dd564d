// Case builders shared by the CPU tests (test/ops: double reference, finite
// differences) and the GPU tests (test/cuda: CUDA vs CPU): each turns an args
// struct of host tensors into an OpCase with its reference or loss, so an op's
// test is written once and run in every mode of the harness (op_case.h).
#pragma once
#include "lib/ops/ops.h"
#include "test/ops_harness/op_case.h"

namespace ds::test {

// Double references (rows N = numel / C).
struct NormRef {
  Vec out, mean, rstd;
};
NormRef ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C, double eps);
NormRef ref_rmsnorm(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps);
Vec ref_matmul(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C, int64_t OC);

// Forward cases: outputs against the double reference.
OpCase layernorm_forward_case(const LayerNormArgs& a);
OpCase rmsnorm_forward_case(const RMSNormArgs& a);
OpCase matmul_forward_case(const MatmulArgs& a);

// Backward cases calling the op `calls` times: gradients against central
// finite differences of sum(dout * forward) (weight gradients accumulate
// `calls` times; dinp per the accum field). `bias` is the forward's bias (the
// loss reads it; dbias is its gradient), `eps` the forward's (the saved
// statistics were computed with it); mean/rstd are f32 statistics.
OpCase layernorm_backward_case(const LayerNormBwdArgs& a, const Tensor& bias, float eps,
                               int calls = 1);
OpCase rmsnorm_backward_case(const RMSNormBwdArgs& a, float eps, int calls = 1);
// Matmul with a bias whose gradient dbias is: `bias` is the forward's.
OpCase matmul_backward_case(const MatmulBwdArgs& a, const Tensor& bias, int calls = 1);

// Random-LTD's row copies with their references: gather fills part, scatter
// overwrites the indexed rows of full and leaves the others as they were.
OpCase token_gather_case(const TokenRowsArgs& a);
OpCase token_scatter_case(const TokenRowsArgs& a);

}  // namespace ds::test
