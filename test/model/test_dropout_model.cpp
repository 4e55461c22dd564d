// Dropout in the whole model on the CPU backend: only a training key drops
// (forward_loss and keyless calls equal a dropout-0 model bit for bit), the
// masks are a function of the key alone (same key: same loss and gradients;
// another iteration or first sample: another loss), activation recomputation
// (full and selective) redraws the same masks, a key whose per-step part is in
// a tensor (DropoutKey::step) draws the by-value key's masks, and the gradients
// with dropout on match central finite differences of the loss under the same
// key.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

ModelConfig dropout_model(bool llama, float hidden, float attention) {
  ModelConfig cfg = test::tiny_model(llama);
  cfg.hidden_dropout = hidden;
  cfg.attention_dropout = attention;
  return cfg;
}

struct Run {
  float loss = 0;
  std::vector<float> grads;
};

Run step(GptModel& m, const Tensor& tok, const Tensor& tgt, const DropoutKey& key) {
  m.grads().zero_();
  Run r;
  r.loss = m.forward_backward(tok, tgt, 1.0f / static_cast<float>(tok.numel()), key);
  r.grads.assign(m.grads().data<float>(), m.grads().data<float>() + m.layout().total);
  return r;
}

bool same(const Run& a, const Run& b) {
  return a.loss == b.loss && a.grads.size() == b.grads.size() &&
         std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)) == 0;
}

const DropoutKey kKey{.train = true, .seed = 1234, .iteration = 3, .first_sample = 16};

}  // namespace

TEST_CASE("dropout is active only with a training key, and the key fixes the masks", "[model][dropout]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const ModelConfig cfg = dropout_model(llama, 0.2f, 0.3f);
    GptModel m(cfg, Device::cpu()), plain(dropout_model(llama, 0.f, 0.f), Device::cpu());
    m.init_weights(5, 0.2f);
    plain.init_weights(5, 0.2f);
    const int64_t B = 2, T = 8;
    const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    // Evaluation and keyless training calls never drop.
    CHECK(m.forward_loss(tok, tgt) == plain.forward_loss(tok, tgt));
    CHECK(same(step(m, tok, tgt, {}), step(plain, tok, tgt, {})));
    CHECK(same(step(m, tok, tgt, kKey), step(plain, tok, tgt, {})) == false);
    // A dropout-0 model ignores the key.
    CHECK(same(step(plain, tok, tgt, kKey), step(plain, tok, tgt, {})));
    // The same key draws the same masks; another iteration or sample offset others.
    const Run a = step(m, tok, tgt, kKey);
    CHECK(same(a, step(m, tok, tgt, kKey)));
    DropoutKey next = kKey;
    next.iteration += 1;
    CHECK(step(m, tok, tgt, next).loss != a.loss);
    DropoutKey shifted = kKey;
    shifted.first_sample += B;
    CHECK(step(m, tok, tgt, shifted).loss != a.loss);
    // Evaluation after a training step is still undropped.
    CHECK(m.forward_loss(tok, tgt) == plain.forward_loss(tok, tgt));
  }
}

namespace {

// The key with its per-step part in a tensor (what --cuda-graph passes).
DropoutKey in_memory(const DropoutKey& k) {
  DropoutKey m = k;
  m.step = Tensor::empty({2}, DType::I64);
  m.step.data<int64_t>()[0] = k.iteration;
  m.step.data<int64_t>()[1] = k.first_sample;
  m.iteration = m.first_sample = -1;  // unused with `step`
  return m;
}

}  // namespace

TEST_CASE("a dropout key in memory gives the by-value key's loss and gradients bit for bit", "[model][dropout]") {
  using K = RecomputeConfig::Kind;
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const ModelConfig cfg = dropout_model(llama, 0.2f, 0.3f);
    const int64_t B = 2, T = 8;
    const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 7), tgt = test::random_tokens(B, T, cfg.vocab_size, 8);
    for (RecomputeConfig rc : {RecomputeConfig{}, RecomputeConfig{K::Full, 0}, RecomputeConfig{K::Selective, 0}}) {
      GptModel m(cfg, Device::cpu());
      m.set_recompute(rc);
      m.init_weights(5, 0.2f);
      for (const DropoutKey& k : {kKey, DropoutKey{.train = true, .seed = 99, .iteration = 0, .first_sample = 0},
                                  DropoutKey{.train = true, .seed = 1234, .iteration = 7, .first_sample = 1000}}) {
        INFO("iteration " << k.iteration << " first sample " << k.first_sample);
        const Run want = step(m, tok, tgt, k), got = step(m, tok, tgt, in_memory(k));
        CHECK(same(got, want));
      }
    }
  }
}

TEST_CASE("recomputation redraws the same dropout masks", "[model][dropout][recompute]") {
  using K = RecomputeConfig::Kind;
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const ModelConfig cfg = dropout_model(llama, 0.25f, 0.25f);
    const int64_t B = 2, T = 8;
    const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 3), tgt = test::random_tokens(B, T, cfg.vocab_size, 4);
    auto run = [&](RecomputeConfig rc) {
      GptModel m(cfg, Device::cpu());
      m.set_recompute(rc);
      m.init_weights(6, 0.2f);
      return step(m, tok, tgt, kKey);
    };
    const Run ref = run({});
    CHECK(same(run({K::Full, 0}), ref));
    CHECK(same(run({K::Full, 1}), ref));
    CHECK(same(run({K::Selective, 0}), ref));
  }
}

TEST_CASE("model gradients with dropout match finite differences under the same key", "[model][dropout]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const ModelConfig cfg = dropout_model(llama, 0.2f, 0.2f);
    GptModel m(cfg, Device::cpu());
    m.init_weights(7, 0.2f);
    const int64_t B = 2, T = 7;
    const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 5), tgt = test::random_tokens(B, T, cfg.vocab_size, 6);
    const Run r = step(m, tok, tgt, kKey);
    float* p = m.params().data<float>();
    Rng pick(9);
    for (const ParamSpec& s : m.layout().params) {
      for (int k = 0; k < 3; ++k) {
        int64_t i = s.offset + static_cast<int64_t>(pick.below(s.numel));
        if (s.name == "embed.wte" || s.name == "head.weight")
          i = s.offset + static_cast<int64_t>(pick.below(cfg.vocab_size * cfg.hidden_size));
        const float h = 1e-2f, orig = p[i];
        // Loss weight 0: the forward under the key, no gradient change that matters.
        p[i] = orig + h;
        const double lp = m.forward_backward(tok, tgt, 0.f, kKey);
        p[i] = orig - h;
        const double lm = m.forward_backward(tok, tgt, 0.f, kKey);
        p[i] = orig;
        const double fd = (lp - lm) / (2.0 * h), g = r.grads[i];
        INFO(s.name << " element " << i - s.offset << " analytic " << g << " fd " << fd);
        REQUIRE(std::abs(fd - g) <= 2e-3 + 3e-2 * std::abs(fd));
      }
    }
  }
}
