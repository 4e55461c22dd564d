// Activation recomputation in one process: full (all layers and the first
// one per chunk) and selective give bit-identical losses and gradients, and
// fewer saved activation bytes per micro-batch.
#include <catch2/catch.hpp>
#include <cstring>

#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

struct Outcome {
  std::vector<float> losses, grads;
  int64_t bytes = 0;
};

Outcome train(bool llama, RecomputeConfig rc) {
  ModelConfig cfg = test::tiny_model(llama);
  GptModel m(cfg, Device::cpu(), 0, TpComm{}, PipeStage{1, 0, 1});
  m.set_recompute(rc);
  m.init_weights(3, 0.2f);
  m.grads().zero_();
  const int64_t B = 2, T = 8;
  Outcome o;
  o.bytes = m.saved_activation_bytes(B, T);
  for (int step = 0; step < 3; ++step)
    o.losses.push_back(m.forward_backward(test::random_tokens(B, T, cfg.vocab_size, 10 + step),
                                          test::random_tokens(B, T, cfg.vocab_size, 20 + step), 1.0f / (B * T)));
  const float* g = m.grads().data<float>();
  o.grads.assign(g, g + m.layout().total);
  return o;
}

}  // namespace

TEST_CASE("recomputation is bit-identical and saves activations", "[model][recompute]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    using K = RecomputeConfig::Kind;
    Outcome ref = train(llama, {});
    Outcome full = train(llama, {K::Full, 0});
    Outcome first = train(llama, {K::Full, 1});
    Outcome sel = train(llama, {K::Selective, 0});
    for (const Outcome* o : {&full, &first, &sel}) {
      REQUIRE(o->losses == ref.losses);
      REQUIRE(o->grads.size() == ref.grads.size());
      REQUIRE(std::memcmp(o->grads.data(), ref.grads.data(), ref.grads.size() * sizeof(float)) == 0);
    }
    CHECK(full.bytes < first.bytes);
    CHECK(first.bytes < ref.bytes);
    CHECK(sel.bytes < ref.bytes);
  }
}
