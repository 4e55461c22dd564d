// GPU tests of the Mixture-of-Experts ops against the CPU ops
// (test/ops_harness/moe_cases.h): the gate in every mode (top-1/2/3,
// dropless and dropping, RTS, RSample, second-expert sampling) must give the
// same choices, slots and counts exactly and the same gates, weights and
// l_aux to 1e-5, with token counts above one block's tile (the slot scan
// carries across tiles); dispatch and combine in f32, bf16 and f16.
// Skipped (exit 77) when no device is present.
#include "lib/ops/ops.h"
#include "test/ops_harness/moe_cases.h"
#include "test/ops_harness/op_case_cuda.h"

using namespace ds;
using namespace ds::test;

namespace {

struct GateMode {
  int K;
  int64_t capacity;
  bool rts = false, rsample = false, second_sampling = false;
};

MoeGateArgs gate_args(int64_t N, int64_t E, const GateMode& m, uint64_t seed) {
  MoeGateArgs a = moe_gate_args(randn({N, E}, seed, 1.5f), m.K, m.capacity);
  a.rts = m.rts, a.rsample = m.rsample, a.second_sampling = m.second_sampling;
  a.noise_seed = 77, a.noise_stream = seed;
  return a;
}

}  // namespace

TEST_CASE("cuda moe gate forward and backward match the CPU") {
  if (!gpu_or_skip()) return;
  const GateMode modes[] = {{1, 0}, {1, 40}, {1, 40, true}, {1, 40, false, true}, {1, 0, true, true},
                            {2, 0}, {2, 70}, {2, 70, false, false, true},   {3, 0}, {3, 90}};
  struct Size {
    int64_t N, E;
  };
  for (const Size sz : {Size{37, 6}, Size{1000, 16}, Size{4099, 64}})
    for (const GateMode& m : modes) {
      INFO("N " << sz.N << " E " << sz.E << " K " << m.K << " capacity " << m.capacity << " rts " << m.rts
                << " rsample " << m.rsample << " second_sampling " << m.second_sampling);
      const MoeGateArgs a = gate_args(sz.N, sz.E, m, 500 + m.K);
      check_cuda_vs_cpu(moe_gate_forward_case(a), DType::F32);
      // The backward on the CPU forward's outputs.
      MoeGateArgs f = gate_args(sz.N, sz.E, m, 500 + m.K);
      ops::moe_gate_forward(f, Stream{});
      const MoeGateBwdArgs b{.dlogits = randn({sz.N, sz.E}, 3), .dweight = randn({sz.N, m.K}, 4),
                             .gates = f.gates, .expert = f.expert, .slot = f.slot, .daux = 0.3f};
      check_cuda_vs_cpu(moe_gate_backward_case(b, f.logits), DType::F32);
    }
}

TEST_CASE("cuda moe dispatch and combine match the CPU") {
  if (!gpu_or_skip()) return;
  const int64_t N = 301, E = 8, D = 129;
  for (int K : {1, 2, 3}) {
    MoeGateArgs g = moe_gate_args(randn({N, E}, 600 + K), K, 50);
    ops::moe_gate_forward(g, Stream{});
    const int64_t C = 50;
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      INFO("K " << K << " dtype " << dtype_name(dt));
      check_cuda_vs_cpu_offsets(moe_dispatch_forward_case({.out = randn({E, C, D}, 1), .inp = randn({N, D}, 2),
                                                           .expert = g.expert, .slot = g.slot}),
                                dt);
      check_cuda_vs_cpu_offsets(moe_dispatch_backward_case({.dinp = randn({N, D}, 3), .dout = randn({E, C, D}, 4),
                                                            .expert = g.expert, .slot = g.slot},
                                                           randn({N, D}, 2)),
                                dt);
      check_cuda_vs_cpu_offsets(moe_combine_forward_case({.out = randn({N, D}, 5), .inp = randn({E, C, D}, 6),
                                                          .weight = g.weight, .expert = g.expert, .slot = g.slot}),
                                dt);
      check_cuda_vs_cpu_offsets(
          moe_combine_backward_case({.dinp = randn({E, C, D}, 7), .dweight = randn({N, K}, 8),
                                     .dout = randn({N, D}, 9), .inp = randn({E, C, D}, 6), .weight = g.weight,
                                     .expert = g.expert, .slot = g.slot}),
          dt);
    }
  }
}

TEST_CASE("cuda moe mix (PR-MoE) matches the CPU") {
  if (!gpu_or_skip()) return;
  const int64_t N = 301, D = 129;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    INFO("dtype " << dtype_name(dt));
    check_cuda_vs_cpu_offsets(moe_mix_forward_case({.out = randn({N, D}, 1), .moe = randn({N, D}, 2),
                                                    .mlp = randn({N, D}, 3), .coef = randn({N, 2}, 4, 2.f)}),
                              dt);
    check_cuda_vs_cpu_offsets(moe_mix_backward_case({.dmoe = randn({N, D}, 5), .dmlp = randn({N, D}, 6),
                                                     .dcoef = randn({N, 2}, 7), .dout = randn({N, D}, 8),
                                                     .moe = randn({N, D}, 2), .mlp = randn({N, D}, 3),
                                                     .coef = randn({N, 2}, 4, 2.f)}),
                              dt);
  }
}
