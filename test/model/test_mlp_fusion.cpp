// The fused GELU MLP ops (GptModel::MlpFusion) on the CPU: the same losses
// and gradients, bit for bit, as the separate ops, in f32 and bf16, with and
// without recomputation, and no more saved activations.
#include <catch2/catch.hpp>
#include <cstring>

#include "lib/model/gpt.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

struct Outcome {
  std::vector<float> losses;
  std::vector<uint8_t> grads;  // the raw gradient buffer
  int64_t bytes = 0;
};

Outcome train(GptModel::MlpFusion f, DType compute, RecomputeConfig rc) {
  const ModelConfig cfg = test::tiny_model(false);
  GptModel m(cfg, Device::cpu(), 0, TpComm{}, PipeStage{1, 0, 1}, compute);
  m.set_mlp_fusion(f);
  m.set_recompute(rc);
  m.init_weights(3, 0.2f);
  m.grads().zero_();
  const int64_t B = 2, T = 8;
  Outcome o;
  o.bytes = m.saved_activation_bytes(B, T);
  for (int step = 0; step < 3; ++step)
    o.losses.push_back(m.forward_backward(test::random_tokens(B, T, cfg.vocab_size, 10 + step),
                                          test::random_tokens(B, T, cfg.vocab_size, 20 + step), 1.0f / (B * T)));
  const auto* g = static_cast<const uint8_t*>(m.grads().raw());
  o.grads.assign(g, g + m.grads().nbytes());
  return o;
}

}  // namespace

TEST_CASE("fused GELU MLP ops give the unfused losses and gradients bit for bit on the CPU", "[model]") {
  using K = RecomputeConfig::Kind;
  for (DType dt : {DType::F32, DType::BF16})
    for (RecomputeConfig rc : {RecomputeConfig{}, RecomputeConfig{K::Full, 0}}) {
      INFO(dtype_name(dt) << (rc.kind == K::Full ? " full recompute" : ""));
      const Outcome ref = train(GptModel::MlpFusion::Unfused, dt, rc);
      const Outcome fused = train(GptModel::MlpFusion::Fused, dt, rc);
      REQUIRE(fused.losses == ref.losses);
      REQUIRE(fused.grads == ref.grads);
      CHECK(fused.bytes == ref.bytes);
      bool any = false;  // the gradients are not all zero (the comparison means something)
      for (uint8_t b : ref.grads) any |= b != 0;
      CHECK(any);
    }
}
