// Whole-model tests on the CPU backend: parameter counts of known models, and
// the gradients of tiny GPT-2 and LLaMA models against central finite
// differences of the loss (every op is also checked alone in test/ops).
#include <catch2/catch.hpp>
#include <cmath>

#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "test/model/tiny_model.h"
#include "lib/train/config.h"

using namespace ds;

namespace {

Tensor random_tokens(int64_t B, int64_t T, int V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  Rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(r.below(V));
  return t;
}

void check_gradients(bool llama) {
  ModelConfig cfg = test::tiny_model(llama);
  GptModel model(cfg, Device::cpu());
  model.init_weights(7, 0.2f);
  const int64_t B = 2, T = 7;
  Tensor tok = random_tokens(B, T, cfg.vocab_size, 1), tgt = random_tokens(B, T, cfg.vocab_size, 2);
  tgt.data<int32_t>()[3] = -1;  // an ignored target
  model.grads().zero_();
  model.forward_backward(tok, tgt, 1.0f / (B * T));
  // forward_loss returns the mean over non-ignored targets; the gradient was
  // taken of sum(loss)/(B*T); rescale.
  const double scale = static_cast<double>(B * T - 1) / (B * T);
  Rng pick(3);
  float* p = model.params().data<float>();
  const float* g = model.grads().data<float>();
  int checked = 0;
  for (const ParamSpec& s : model.layout().params) {
    for (int k = 0; k < 4; ++k) {
      int64_t i = s.offset + static_cast<int64_t>(pick.below(s.numel));
      if (s.name == "embed.wte" || s.name == "head.weight") {
        // Padded vocab rows never get gradient; sample real rows.
        i = s.offset + static_cast<int64_t>(pick.below(cfg.vocab_size * cfg.hidden_size));
      }
      const float h = 1e-2f, orig = p[i];
      p[i] = orig + h;
      double lp = model.forward_loss(tok, tgt) * scale;
      p[i] = orig - h;
      double lm = model.forward_loss(tok, tgt) * scale;
      p[i] = orig;
      double fd = (lp - lm) / (2.0 * h);
      INFO(s.name << " element " << i - s.offset << " analytic " << g[i] << " fd " << fd);
      REQUIRE(std::abs(fd - g[i]) <= 2e-3 + 3e-2 * std::abs(fd));
      ++checked;
    }
  }
  REQUIRE(checked == 4 * static_cast<int>(model.layout().params.size()));
  // Padded rows of the output embedding get exactly zero gradient.
  const ParamSpec& wte = model.layout().find("embed.wte");
  for (int64_t i = cfg.vocab_size * cfg.hidden_size; i < wte.numel; ++i)
    REQUIRE(g[wte.offset + i] == 0.f);
}

}  // namespace

TEST_CASE("GPT-2 124M and LLaMA shapes have the published parameter counts") {
  ModelConfig g;
  g.vocab_size = 50257;
  g.padded_vocab_size = 50257;
  REQUIRE(count_parameters(g) == 124439808);
  ModelConfig l;  // LLaMA-2 7B shape (no GQA)
  set_model_family(l, ModelFamily::LLaMA);
  l.num_layers = 32;
  l.hidden_size = 4096;
  l.num_heads = 32;
  l.ffn_hidden_size = 11008;
  l.max_position_embeddings = 4096;
  l.vocab_size = 32000;
  l.padded_vocab_size = 32000;
  REQUIRE(count_parameters(l) == 6738415616);
}

TEST_CASE("GPT-2 family gradients match finite differences") { check_gradients(false); }

TEST_CASE("LLaMA family gradients match finite differences") { check_gradients(true); }

TEST_CASE("init is deterministic and layer-local") {
  ModelConfig cfg = test::tiny_model(false);
  GptModel a(cfg, Device::cpu()), b(cfg, Device::cpu());
  a.init_weights(11, 0.02f);
  b.init_weights(11, 0.02f);
  REQUIRE(std::equal(a.params().data<float>(), a.params().data<float>() + a.params().numel(),
                     b.params().data<float>()));
  // Output projections use the scaled std: std / sqrt(2L).
  Tensor w = a.param("layers.0.attn.proj.weight");
  double sq = 0;
  for (int64_t i = 0; i < w.numel(); ++i) sq += w.data<float>()[i] * w.data<float>()[i];
  double std = std::sqrt(sq / w.numel());
  REQUIRE(std == Approx(0.02 / std::sqrt(4.0)).epsilon(0.15));
  REQUIRE(a.param("layers.1.norm2.weight").data<float>()[3] == 1.f);
  REQUIRE(a.param("layers.1.mlp.fc.bias").data<float>()[3] == 0.f);
}
