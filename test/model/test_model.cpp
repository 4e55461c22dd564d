// Whole-model tests on the CPU backend: parameter counts of known models, and
// the gradients of tiny GPT-2 and LLaMA models (also with grouped-query
// attention and partial RoPE) against central finite differences of the loss
// (every op is also checked alone in test/ops), and the deferred loss sink.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "lib/config/config.h"
#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "lib/model/tp_shard.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

// The loss the gradient is of: the mean loss (rescaled) plus, with MoE
// layers, loss_coeff times the sum of their l_aux (Megatron-DeepSpeed's).
void check_gradients(const ModelConfig& cfg) {
  GptModel model(cfg, Device::cpu());
  model.init_weights(7, 0.2f);
  const int64_t B = 2, T = 7;
  Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
  tgt.data<int32_t>()[3] = -1;  // an ignored target
  model.grads().zero_();
  model.forward_backward(tok, tgt, 1.0f / (B * T));
  // forward_loss returns the mean over non-ignored targets; the gradient was
  // taken of sum(loss)/(B*T); rescale.
  const double scale = static_cast<double>(B * T - 1) / (B * T);
  Rng pick(3);
  float* p = model.params().data<float>();
  const float* g = model.grads().data<float>();
  int checked = 0, jumps = 0;
  const bool moe = cfg.moe.enabled(cfg.num_layers);
  const double coeff = cfg.moe.loss_coeff;
  for (const ParamSpec& s : model.layout().params) {
    for (int k = 0, retries = 0; k < 4; ++k) {
      int64_t i = s.offset + static_cast<int64_t>(pick.below(s.numel));
      if (s.name == "embed.wte" || s.name == "head.weight") {
        // Padded vocab rows never get gradient; sample real rows.
        i = s.offset + static_cast<int64_t>(pick.below(cfg.vocab_size * s.shape[1]));
      }
      const float orig = p[i];
      auto central = [&](float h) {
        p[i] = orig + h;
        const double lp = model.forward_loss(tok, tgt) * scale + coeff * model.moe_aux_loss();
        p[i] = orig - h;
        const double lm = model.forward_loss(tok, tgt) * scale + coeff * model.moe_aux_loss();
        p[i] = orig;
        return (lp - lm) / (2.0 * h);
      };
      // MoE: a token that changes its experts or loses its row between the
      // two evaluations makes the loss jump. A jump shows as a difference
      // quotient that does not settle when the step shrinks: take the largest
      // step (1e-3 down to 1e-4) whose quotient agrees with the one at a
      // quarter of it, or another element when none does (at most 3 per tensor).
      double fd = moe ? 0.0 : central(1e-2f);
      if (moe) {
        bool settled = false;
        for (float h : {1e-3f, 2.5e-4f, 1e-4f}) {
          fd = central(h);
          if (std::abs(fd - central(h / 4)) <= 1e-2 + 0.05 * std::abs(fd)) {
            settled = true;
            break;
          }
        }
        if (!settled && retries < 3) {
          ++retries, ++jumps, --k;
          continue;
        }
      }
      INFO(s.name << " element " << i - s.offset << " analytic " << g[i] << " fd " << fd);
      REQUIRE(std::abs(fd - g[i]) <= 2e-3 + 3e-2 * std::abs(fd));
      ++checked;
    }
  }
  INFO(jumps << " elements skipped at a routing change");
  REQUIRE(jumps <= static_cast<int>(model.layout().params.size()) / 4);
  REQUIRE(checked == 4 * static_cast<int>(model.layout().params.size()));
  // Padded rows of the output embedding get exactly zero gradient.
  const ParamSpec& wte = model.layout().find("embed.wte");
  for (int64_t i = cfg.vocab_size * wte.shape[1]; i < wte.numel; ++i)
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

TEST_CASE("grouped-query shapes have the published parameter counts (LLaMA-2 70B, LLaMA-3 8B)") {
  ModelConfig l;
  set_model_family(l, ModelFamily::LLaMA);
  l.num_layers = 80;
  l.hidden_size = 8192;
  l.num_heads = 64;
  l.num_kv_heads = 8;
  l.ffn_hidden_size = 28672;
  l.max_position_embeddings = 4096;
  l.vocab_size = l.padded_vocab_size = 32000;
  REQUIRE(count_parameters(l) == 68976648192);
  l.num_layers = 32;
  l.hidden_size = 4096;
  l.num_heads = 32;
  l.num_kv_heads = 8;
  l.ffn_hidden_size = 14336;
  l.vocab_size = l.padded_vocab_size = 128256;
  REQUIRE(count_parameters(l) == 8030261248);
}

TEST_CASE("GPT-2 family gradients match finite differences") { check_gradients(test::tiny_model(false)); }

TEST_CASE("LLaMA family gradients match finite differences") { check_gradients(test::tiny_model(true)); }

TEST_CASE("grouped-query attention and partial RoPE gradients match finite differences") {
  ModelConfig cfg = test::tiny_model(true);
  cfg.num_kv_heads = 1;  // multi-query: both query heads share one kv head
  SECTION("GQA") { check_gradients(cfg); }
  SECTION("GQA with half of each head rotated, base 500000") {
    cfg.rotary_percent = 0.5f;
    cfg.rope_theta = 500000.f;
    check_gradients(cfg);
  }
}

// Mixture of Experts (docs/moe.md): the router, the experts and the load-
// balancing loss, with tokens dropped at capacity (top-2: 14 tokens, 4
// experts, factor 1 gives 7 rows per expert for 28 choices), dropless, and
// top-1 on a LLaMA (SwiGLU experts, no biases). No random draws: RTS and
// second-expert sampling off, so forward_loss routes as the training pass.
TEST_CASE("Mixture-of-Experts gradients match finite differences, l_aux included") {
  auto moe = [](bool llama, int experts, int k, bool drop) {
    ModelConfig m = test::tiny_model(llama);
    m.moe.num_experts = {experts};
    m.moe.expert_interval = 1;
    m.moe.topk = k;
    m.moe.drop_tokens = drop;
    m.moe.use_rts = false;
    m.moe.top2_2nd_expert_sampling = false;
    m.moe.min_capacity = 0;
    m.moe.loss_coeff = 0.5f;  // large, so that l_aux's gradient shows
    return m;
  };
  SECTION("GPT-2, top-2, capacity drops") { check_gradients(moe(false, 4, 2, true)); }
  SECTION("GPT-2, top-3, dropless") { check_gradients(moe(false, 4, 3, false)); }
  SECTION("LLaMA, top-1, capacity drops") { check_gradients(moe(true, 3, 1, true)); }
  SECTION("PR-MoE (a dense MLP beside the experts), GPT-2 top-1 and LLaMA top-2") {
    ModelConfig gpt = moe(false, 4, 1, true), llama = moe(true, 4, 2, false);
    gpt.moe.residual = llama.moe.residual = true;
    check_gradients(gpt);
    check_gradients(llama);
  }
}

// Knowledge distillation (docs/distillation.md): the student's gradient is
// that of its lm loss plus Megatron-DeepSpeed's KD loss, beta * temp^2 *
// sum_rows KL(p_t || p_s) / (B * seq_length), here computed from the two
// models' logits in double on the host (T = 7 < seq_length 8: the divisor is
// the configured length, as under a curriculum). The sink gets that value.
TEST_CASE("distillation: the student's gradients are those of lm loss + KD loss") {
  const ModelConfig cfg = test::tiny_model(false);
  ModelConfig tcfg = cfg;
  tcfg.num_layers = 3;
  GptModel model(cfg, Device::cpu()), teacher(tcfg, Device::cpu());
  model.init_weights(7, 0.2f);
  teacher.init_weights(8, 0.4f);
  const float beta = 1.7f, temp = 2.0f;
  model.set_distillation({.teacher = &teacher, .beta = beta, .temp = temp, .seq_length = 8, .seed = 5});
  const int64_t B = 2, T = 7, Vp = cfg.padded_vocab_size, V = cfg.vocab_size;
  Tensor tok = test::random_tokens(B, T, V, 1), tgt = test::random_tokens(B, T, V, 2);
  auto kd_ref = [&] {
    const Tensor t = teacher.forward_logits(tok, {}).clone(), s = model.forward_logits(tok, {});
    double sum = 0;
    for (int64_t n = 0; n < B * T; ++n) {
      auto lse = [&](const float* x) {
        double mx = -1e300, e = 0;
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j] / double(temp));
        for (int64_t j = 0; j < V; ++j) e += std::exp(x[j] / double(temp) - mx);
        return mx + std::log(e);
      };
      const float* xs = s.data<float>() + n * Vp;
      const float* xt = t.data<float>() + n * Vp;
      const double ls = lse(xs), lt = lse(xt);
      for (int64_t j = 0; j < V; ++j) {
        const double a = xt[j] / double(temp) - lt, b = xs[j] / double(temp) - ls;
        sum += std::exp(a) * (a - b);
      }
    }
    return beta * double(temp) * temp * sum / double(B * 8);
  };
  Tensor sink = Tensor::zeros({1}, DType::F32);
  model.set_kd_loss_sink(sink);
  model.grads().zero_();
  model.forward_backward(tok, tgt, 1.0f / (B * T));
  model.set_kd_loss_sink(Tensor());
  const double kd0 = kd_ref();
  REQUIRE(kd0 > 1e-3);
  CHECK(std::abs(sink.data<float>()[0] - kd0) <= 1e-5 * kd0);
  Rng pick(4);
  float* p = model.params().data<float>();
  const float* g = model.grads().data<float>();
  for (const ParamSpec& sp : model.layout().params) {
    for (int k = 0; k < 3; ++k) {
      int64_t i = sp.offset + static_cast<int64_t>(pick.below(sp.numel));
      if (sp.name == "embed.wte") i = sp.offset + static_cast<int64_t>(pick.below(V * cfg.hidden_size));
      const float orig = p[i], h = 1e-2f;
      p[i] = orig + h;
      const double lp = model.forward_loss(tok, tgt) + kd_ref();
      p[i] = orig - h;
      const double lm = model.forward_loss(tok, tgt) + kd_ref();
      p[i] = orig;
      const double fd = (lp - lm) / (2.0 * h);
      INFO(sp.name << " element " << i - sp.offset << " analytic " << g[i] << " fd " << fd);
      REQUIRE(std::abs(fd - g[i]) <= 2e-3 + 3e-2 * std::abs(fd));
    }
  }
  // beta 0: exactly the gradients without a teacher.
  GptModel plain(cfg, Device::cpu());
  plain.init_weights(7, 0.2f);
  plain.grads().zero_();
  plain.forward_backward(tok, tgt, 1.0f / (B * T));
  model.set_distillation({.teacher = &teacher, .beta = 0.f, .temp = temp, .seq_length = 8, .seed = 5});
  model.grads().zero_();
  model.forward_backward(tok, tgt, 1.0f / (B * T));
  REQUIRE(std::memcmp(model.grads().data<float>(), plain.grads().data<float>(),
                      static_cast<size_t>(model.layout().total) * 4) == 0);
  ModelConfig other = cfg;
  other.vocab_size = 30;
  GptModel wrong(other, Device::cpu());
  REQUIRE_THROWS(model.set_distillation({.teacher = &wrong, .seq_length = 8}));
}

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

TEST_CASE("pipeline stage layouts split the layers and chain to the full model's loss and gradients") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    ModelConfig cfg = test::tiny_model(llama);
    cfg.num_layers = 4;
    CHECK_THROWS_WITH(build_layout(cfg, {.pp = 3}), Catch::Contains("num_layers 4 is not divisible by "
                                                                      "pipeline_model_parallel_size 3"));
    {  // interleaved: chunk c of rank r is virtual stage c * PP + r
      ModelLayout r0 = build_layout(cfg, {.pp = 2, .pp_rank = 0, .vp = 2}), r1 = build_layout(cfg, {.pp = 2, .pp_rank = 1, .vp = 2});
      REQUIRE((r0.chunks.size() == 2 && r0.chunks[0].begin == 0 && r0.chunks[1].begin == 2));
      REQUIRE((r1.chunks[0].begin == 1 && r1.chunks[1].begin == 3 && r1.chunks[1].end == 4));
      REQUIRE(r0.try_find("layers.1.norm1.weight") == nullptr);
      REQUIRE(r0.try_find("layers.2.norm1.weight") != nullptr);
      REQUIRE(r0.try_find("embed.wte") != nullptr);
      REQUIRE(r1.try_find("final_norm.weight") != nullptr);
    }
    GptModel full(cfg, Device::cpu());
    full.init_weights(7, 0.2f);
    const int64_t B = 2, T = 7;
    Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    full.grads().zero_();
    const float w = 1.0f / (B * T);
    const float ref_loss = full.forward_backward(tok, tgt, w);
    const int P = 2;
    std::vector<std::unique_ptr<GptModel>> st;
    for (int s = 0; s < P; ++s) {
      st.push_back(std::make_unique<GptModel>(cfg, Device::cpu(), 0, TpComm{}, PipeStage{P, s}));
      st[s]->init_weights(7, 0.2f);
      st[s]->grads().zero_();
      REQUIRE(st[s]->layout().first_layer == s * 2);
      REQUIRE(st[s]->layout().end_layer == s * 2 + 2);
      REQUIRE((st[s]->layout().try_find("embed.wte") != nullptr) == (s == 0 || !llama));
      REQUIRE((st[s]->layout().try_find("final_norm.weight") != nullptr) == (s == P - 1));
    }
    st[0]->stage_forward(0, 0, tok, tgt, w, true);
    st[1]->stage_input(0, 0, B, T).copy_from(st[0]->stage_output(0, 0));
    const float loss = st[1]->stage_forward(0, 0, tok, tgt, w, true);
    REQUIRE(loss == Approx(ref_loss).epsilon(1e-6));
    st[1]->stage_backward(0, 0, tok, Tensor());
    st[0]->stage_backward(0, 0, tok, st[1]->stage_input_grad());
    for (const ParamSpec& p : full.layout().params) {
      INFO(p.name);
      Tensor want = full.grad(p.name);
      std::vector<float> got(p.numel, 0.f);  // tied wte: both stages' sum (the embedding all-reduce)
      for (auto& m : st) {
        if (!m->layout().try_find(p.name)) continue;
        Tensor g = m->grad(p.name);
        for (int64_t i = 0; i < p.numel; ++i) got[i] += g.data<float>()[i];
      }
      for (int64_t i = 0; i < p.numel; ++i)
        REQUIRE(got[i] == Approx(want.data<float>()[i]).margin(1e-6).epsilon(1e-4));
    }
  }
}

TEST_CASE("a target outside the vocabulary is an error, a negative one is ignored") {
  ModelConfig cfg = test::tiny_model(false);
  GptModel model(cfg, Device::cpu());
  model.init_weights(7, 0.2f);
  Tensor tok = test::random_tokens(1, 4, cfg.vocab_size, 1), tgt = test::random_tokens(1, 4, cfg.vocab_size, 2);
  tgt.data<int32_t>()[1] = -1;
  CHECK(std::isfinite(model.forward_loss(tok, tgt)));
  tgt.data<int32_t>()[2] = cfg.vocab_size;  // a padded row: not a real token
  CHECK_THROWS_WITH(model.forward_loss(tok, tgt), Catch::Contains("target 37 at row 2 is >= V=37"));
}

TEST_CASE("tensor-parallel shards of a grouped-query model hold every weight, and count each once") {
  struct Case {
    int NH, NKV, tp;
  };
  // kv heads split (NKV % tp == 0) and replicated over a query group (tp % NKV == 0)
  for (const Case c : {Case{4, 2, 2}, Case{4, 2, 4}, Case{4, 1, 4}, Case{8, 2, 4}, Case{8, 4, 2}, Case{4, 4, 4}}) {
    INFO("NH=" << c.NH << " NKV=" << c.NKV << " TP=" << c.tp);
    ModelConfig cfg = test::tiny_model(true);
    cfg.num_heads = c.NH;
    cfg.num_kv_heads = c.NKV;
    cfg.hidden_size = 4 * c.NH;  // HS 4
    const ModelLayout full = build_layout(cfg);
    Tensor values = Tensor::empty({full.total}, DType::F32);  // element i holds i (exact in f32 here)
    for (int64_t i = 0; i < full.total; ++i) values.data<float>()[i] = static_cast<float>(i);
    std::vector<int> held(static_cast<size_t>(full.total), 0), counted(static_cast<size_t>(full.total), 0);
    for (int r = 0; r < c.tp; ++r) {
      const ModelLayout local = build_layout(cfg, {c.tp, r, 1, 0, 1});
      Tensor mine = Tensor::empty({local.total}, DType::F32);
      slice_tp_params(local, full, values, mine);
      std::vector<bool> dup(static_cast<size_t>(local.total), false);
      for (const Range& d : duplicate_ranges(local))
        for (int64_t i = d.begin; i < d.end; ++i) dup[static_cast<size_t>(i)] = true;
      for (int64_t i = 0; i < local.total; ++i) {
        const auto f = static_cast<size_t>(mine.data<float>()[i]);
        held[f] += 1;
        counted[f] += dup[static_cast<size_t>(i)] ? 0 : 1;
      }
    }
    int64_t missing = 0, miscounted = 0;
    for (int64_t i = 0; i < full.total; ++i) {
      missing += held[static_cast<size_t>(i)] == 0;
      miscounted += counted[static_cast<size_t>(i)] != 1;
    }
    CHECK(missing == 0);
    CHECK(miscounted == 0);
  }
}

// data_types.grad_accum_dtype bf16: the backward computes each unit's gradient
// in f32 and the flat store rounds it to bf16 and adds it into the bf16
// accumulator, micro-batch by micro-batch (bf16 + bf16, rounded once more).
TEST_CASE("bf16 gradient accumulation rounds each micro-batch's f32 gradient and adds it in bf16") {
  const ModelConfig cfg = test::tiny_model(false);
  GptModel f32acc(cfg, Device::cpu(), 0, {}, {}, DType::BF16);
  GptModel lowp(cfg, Device::cpu(), 0, {}, {}, DType::BF16, FlatStoreOptions{.grad = DType::BF16});
  f32acc.init_weights(5, 0.2f);
  lowp.init_weights(5, 0.2f);
  REQUIRE(lowp.grads().dtype() == DType::BF16);
  const int64_t B = 2, T = 8, n = f32acc.layout().total;
  Tensor tok[2], tgt[2];
  for (int m = 0; m < 2; ++m) {
    tok[m] = test::random_tokens(B, T, cfg.vocab_size, 10 + m);
    tgt[m] = test::random_tokens(B, T, cfg.vocab_size, 20 + m);
  }
  std::vector<std::vector<float>> g(2);  // each micro-batch's own f32 gradient
  for (int m = 0; m < 2; ++m) {
    f32acc.grads().zero_();
    f32acc.forward_backward(tok[m], tgt[m], 0.25f);
    g[m].assign(f32acc.grads().data<float>(), f32acc.grads().data<float>() + n);
  }
  lowp.grads().zero_();
  for (int m = 0; m < 2; ++m) lowp.forward_backward(tok[m], tgt[m], 0.25f);
  const uint16_t* acc = lowp.grads().data<uint16_t>();
  int64_t mismatches = 0, nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(g[0][i])) + bf16_to_f32(f32_to_bf16(g[1][i]))));
    mismatches += bf16_to_f32(acc[i]) != want;
    nonzero += want != 0.f;
  }
  CHECK(mismatches == 0);
  CHECK(nonzero > n / 2);
}

// A pass interrupted midway (a CUDA graph capture that failed: the trainer
// runs the step again eagerly) leaves units acquired; abandon_pass forgets
// them, so the repeated pass gives the gradients of an uninterrupted one
// (bf16 accumulation: the units' f32 gradients live in the store).
TEST_CASE("abandon_pass: a pass interrupted in its backward, repeated, gives the uninterrupted gradients") {
  const ModelConfig cfg = test::tiny_model(false);
  GptModel clean(cfg, Device::cpu(), 0, {}, {}, DType::BF16, FlatStoreOptions{.grad = DType::BF16});
  GptModel hit(cfg, Device::cpu(), 0, {}, {}, DType::BF16, FlatStoreOptions{.grad = DType::BF16});
  clean.init_weights(5, 0.2f);
  hit.init_weights(5, 0.2f);
  const Tensor tok = test::random_tokens(2, 8, cfg.vocab_size, 10), tgt = test::random_tokens(2, 8, cfg.vocab_size, 20);
  clean.grads().zero_();
  clean.forward_backward(tok, tgt, 0.25f);
  hit.grads().zero_();
  int acquired = 0;
  hit.store().set_grads_hook([&](int, bool ready) {
    if (!ready && ++acquired == 3) throw std::runtime_error("capture failed");  // two units acquired, unfinished
  });
  CHECK_THROWS_WITH(hit.forward_backward(tok, tgt, 0.25f), "capture failed");
  hit.store().set_grads_hook(nullptr);
  hit.abandon_pass();
  hit.grads().zero_();
  hit.forward_backward(tok, tgt, 0.25f);
  CHECK(std::memcmp(hit.grads().raw(), clean.grads().raw(), clean.grads().nbytes()) == 0);
}

TEST_CASE("a loss sink receives the weighted mean loss forward_backward would return, ignored targets left out") {
  ModelConfig cfg = test::tiny_model(false);
  GptModel model(cfg, Device::cpu());
  model.init_weights(7, 0.2f);
  const int64_t B = 2, T = 7;
  Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1);
  std::vector<float> means;
  for (uint64_t seed : {2, 3}) {
    Tensor tgt = test::random_tokens(B, T, cfg.vocab_size, seed);
    tgt.data<int32_t>()[static_cast<int64_t>(seed)] = -1;  // an ignored row per micro-batch
    means.push_back(model.forward_backward(tok, tgt, 1.0f / (B * T)));
  }
  REQUIRE(std::isfinite(means[0]));
  REQUIRE(means[0] != means[1]);
  Tensor sink = Tensor::zeros({1}, DType::F32);
  model.set_loss_sink(sink, 0.25f);
  for (uint64_t seed : {2, 3}) {
    Tensor tgt = test::random_tokens(B, T, cfg.vocab_size, seed);
    tgt.data<int32_t>()[static_cast<int64_t>(seed)] = -1;
    CHECK(std::isnan(model.forward_backward(tok, tgt, 1.0f / (B * T))));  // the mean went to the sink
  }
  const double want = 0.25 * means[0] + 0.25 * means[1];
  CHECK(std::fabs(sink.data<float>()[0] - want) <= 1e-6 * std::fabs(want));
  // Weight 0: the sink is left alone (a tp rank whose copy another rank reports).
  model.set_loss_sink(sink, 0.f);
  const float before = sink.data<float>()[0];
  model.forward_backward(tok, test::random_tokens(B, T, cfg.vocab_size, 4), 1.0f / (B * T));
  CHECK(sink.data<float>()[0] == before);
  // Unset: forward_backward returns its mean again.
  model.set_loss_sink(Tensor());
  CHECK(std::isfinite(model.forward_backward(tok, test::random_tokens(B, T, cfg.vocab_size, 4), 1.0f / (B * T))));
  CHECK_THROWS_WITH(model.set_loss_sink(Tensor::zeros({2}, DType::F32)), Catch::Contains("loss sink"));
}

namespace {

// Central difference of loss(model) in parameter element i (flat index) with
// step h, against the analytic gradient g[i] (the loss scaled by `scale`).
void check_element(GptModel& model, const std::function<double()>& loss, int64_t i, double scale,
                   const std::string& name) {
  float* p = model.params().data<float>();
  const float orig = p[i], h = 1e-2f;
  p[i] = orig + h;
  const double lp = loss();
  p[i] = orig - h;
  const double lm = loss();
  p[i] = orig;
  const double fd = scale * (lp - lm) / (2.0 * h), g = model.grads().data<float>()[i];
  INFO(name << " element " << i << " analytic " << g << " fd " << fd);
  REQUIRE(std::abs(fd - g) <= 2e-3 + 3e-2 * std::abs(fd));
}

}  // namespace

namespace {

// A head loss of the values alone: sum over rows of c_r * (v_r - y_r)^2 / 2
// with c_r, y_r from the row's token, so that every value (and the tokens'
// use) shows in the gradient.
struct QuadraticHeadLoss final : HeadLoss {
  int calls = 0;
  double apply(const Tensor& out, const Tensor& tokens, const Tensor&, float weight, bool backward) override {
    ++calls;
    REQUIRE(out.size(1) == 1);
    REQUIRE(out.size(0) == tokens.numel());
    double loss = 0;
    for (int64_t r = 0; r < tokens.numel(); ++r) {
      const int32_t t = tokens.data<int32_t>()[r];
      const double c = 1 + t % 3, y = 0.1 * (t % 5) - 0.2, v = out.data<float>()[r];
      loss += 0.5 * c * (v - y) * (v - y);
      if (backward) out.data<float>()[r] = static_cast<float>(weight * c * (v - y));
    }
    return loss;
  }
};

}  // namespace

TEST_CASE("a value head with a head loss: its gradients match finite differences") {
  for (bool llama : {false, true}) {
    ModelConfig cfg = test::tiny_model(llama);
    cfg.value_head = true;
    GptModel model(cfg, Device::cpu());
    model.init_weights(7, 0.2f);
    const ParamSpec& head = model.layout().find("head.weight");
    REQUIRE(head.shape == Shape{1, cfg.hidden_size});
    // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)), not the N(0, std) of the other weights.
    const float bound = 1.0f / std::sqrt(static_cast<float>(cfg.hidden_size));
    float lo = 1, hi = -1;
    for (int64_t i = 0; i < head.numel; ++i) {
      lo = std::min(lo, model.params().data<float>()[head.offset + i]);
      hi = std::max(hi, model.params().data<float>()[head.offset + i]);
    }
    REQUIRE(lo >= -bound);
    REQUIRE(hi <= bound);
    REQUIRE(hi - lo > bound / 2);
    const int64_t B = 2, T = 7;
    Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    REQUIRE_THROWS_WITH(model.forward_loss(tok, tgt), Catch::Contains("value-head model has no loss of its own"));
    QuadraticHeadLoss h;
    model.set_head_loss(&h);
    model.grads().zero_();
    const float w = 0.75f;  // the micro-batch loss's weight
    model.forward_backward(tok, tgt, w);
    Rng pick(3);
    for (const ParamSpec& s : model.layout().params)
      for (int k = 0; k < 4; ++k)
        check_element(model, [&] { return model.forward_loss(tok, tgt); },
                      s.offset + static_cast<int64_t>(pick.below(s.name == "embed.wte" ? cfg.vocab_size * cfg.hidden_size
                                                                                     : s.numel)),
                      w, (llama ? "llama " : "gpt2 ") + s.name);
    REQUIRE(h.calls > 1);
  }
}

// OPT-350m's blocks (docs/dschat.md): post-norm layers without a final norm,
// and a token embedding narrower than the hidden size between project_in and
// project_out; alone and together, tied and untied, with OPT's position
// offset and right-padding lengths (the padding rows read the padding
// position), with a value head, and under full recomputation. (With OPT's
// ReLU, compared with transformers in test_hf_interop and test_dschat_*.)
TEST_CASE("OPT-350m blocks: post-norm layers and a projected embedding match finite differences") {
  ModelConfig cfg = test::tiny_model(false);  // GELU: ReLU's kinks make central differences jump
  cfg.position_offset = 2;
  cfg.max_position_embeddings = 10;
  auto layout_has = [](const GptModel& m, const char* name) { return m.layout().try_find(name) != nullptr; };
  SECTION("post-norm") {
    cfg.post_norm = true;
    GptModel m(cfg, Device::cpu());
    REQUIRE(!layout_has(m, "final_norm.weight"));
    REQUIRE(!layout_has(m, "embed.project_in"));
    check_gradients(cfg);
  }
  SECTION("projected embedding, untied") {
    cfg.embed_proj_dim = 8;
    cfg.untie_embeddings = true;
    GptModel m(cfg, Device::cpu());
    REQUIRE(m.layout().find("embed.wte").shape == Shape{40, 8});
    REQUIRE(m.layout().find("embed.project_in").shape == Shape{16, 8});
    REQUIRE(m.layout().find("head.project_out").shape == Shape{8, 16});
    REQUIRE(m.layout().find("head.weight").shape == Shape{40, 8});
    check_gradients(cfg);
  }
  SECTION("both, tied (OPT-350m)") {
    cfg.post_norm = true;
    cfg.embed_proj_dim = 8;
    check_gradients(cfg);
  }
  SECTION("both, with padding lengths, full recompute giving the same gradients") {
    cfg.post_norm = true;
    cfg.embed_proj_dim = 8;
    GptModel model(cfg, Device::cpu());
    model.init_weights(7, 0.2f);
    const int64_t B = 2, T = 7;
    Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    Tensor len = Tensor::empty({B}, DType::I32);
    len.data<int32_t>()[0] = 4;
    len.data<int32_t>()[1] = 7;
    model.set_lengths(len);
    model.grads().zero_();
    model.forward_backward(tok, tgt, 1.0f / (B * T));
    const Tensor plain = model.grads().clone();
    Rng pick(5);
    for (const ParamSpec& s : model.layout().params)
      for (int k = 0; k < 3; ++k)
        check_element(model, [&] { return model.forward_loss(tok, tgt); },
                      s.offset + static_cast<int64_t>(pick.below(s.name == "embed.wte" ? cfg.vocab_size * 8 : s.numel)),
                      1.0, s.name);
    // Row 1 of the position table (padding's position) gets gradient from sample 0's padding rows.
    const ParamSpec& wpe = model.layout().find("embed.wpe");
    float row1 = 0;
    for (int64_t c = 0; c < cfg.hidden_size; ++c) row1 += std::abs(model.grads().data<float>()[wpe.offset + 16 + c]);
    REQUIRE(row1 > 0);
    model.set_recompute({.kind = RecomputeKind::Full});
    model.grads().zero_();
    model.forward_backward(tok, tgt, 1.0f / (B * T));
    REQUIRE(std::memcmp(plain.data<float>(), model.grads().data<float>(), plain.nbytes()) == 0);
  }
  SECTION("both, with a value head") {
    cfg.post_norm = true;
    cfg.embed_proj_dim = 8;
    cfg.value_head = true;
    GptModel model(cfg, Device::cpu());
    REQUIRE(model.layout().find("head.weight").shape == Shape{1, 8});
    model.init_weights(7, 0.2f);
    const int64_t B = 2, T = 7;
    Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    QuadraticHeadLoss h;
    model.set_head_loss(&h);
    model.grads().zero_();
    model.forward_backward(tok, tgt, 0.5f);
    Rng pick(3);
    for (const ParamSpec& s : model.layout().params)
      for (int k = 0; k < 4; ++k)
        check_element(model, [&] { return model.forward_loss(tok, tgt); },
                      s.offset + static_cast<int64_t>(pick.below(s.name == "embed.wte" ? cfg.vocab_size * 8 : s.numel)),
                      0.5, s.name);
  }
}

TEST_CASE("OPT-350m blocks refuse the layouts they do not run in, with one line") {
  ModelConfig cfg = test::tiny_model(false);
  cfg.activation = Activation::ReLU;
  cfg.post_norm = true;
  REQUIRE_THROWS_WITH(build_layout(cfg, ShardCoords{.tp = 2, .tp_rank = 0}),
                      Catch::Contains("run without tensor or pipeline parallelism"));
  REQUIRE_THROWS_WITH(build_layout(cfg, ShardCoords{.pp = 2, .pp_rank = 0}),
                      Catch::Contains("run without tensor or pipeline parallelism"));
  cfg.post_norm = false;
  cfg.embed_proj_dim = 8;
  REQUIRE_THROWS_WITH(build_layout(cfg, ShardCoords{.tp = 2, .tp_rank = 0}),
                      Catch::Contains("projected embedding"));
  cfg.post_norm = true;
  cfg.moe.num_experts = {2};
  REQUIRE_THROWS_WITH(build_layout(cfg), Catch::Contains("post-norm blocks (model.post_norm) with Mixture-of-Experts"));
}

TEST_CASE("a value-head model refuses tensor parallelism with one line") {
  ModelConfig cfg = test::tiny_model(false);
  cfg.value_head = true;
  REQUIRE_THROWS_WITH(build_layout(cfg, ShardCoords{.tp = 2, .tp_rank = 0}),
                      Catch::Contains("value-head model (reward / critic) runs on one tensor-parallel rank"));
}

// Right padding (GptModel::set_lengths): a real token attends only to real
// tokens before it whatever the mask, so its logits are those without
// lengths, bit for bit; a padding row attends to its sample's real tokens
// only, so its logits change; gradients still match finite differences.
TEST_CASE("right-padding lengths change only the padding rows") {
  ModelConfig cfg = test::tiny_model(false);
  GptModel model(cfg, Device::cpu());
  model.init_weights(7, 0.2f);
  const int64_t B = 2, T = 7;
  const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1);
  const Tensor plain = model.forward_logits(tok).to(Device::cpu());  // a copy
  Tensor len = Tensor::empty({B}, DType::I32);
  len.data<int32_t>()[0] = 4;
  len.data<int32_t>()[1] = 7;
  model.set_lengths(len);
  const Tensor& masked = model.forward_logits(tok);
  const int64_t V = masked.size(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* x = plain.data<float>() + (b * T + t) * V;
      const float* y = masked.data<float>() + (b * T + t) * V;
      const bool same = std::memcmp(x, y, static_cast<size_t>(V) * sizeof(float)) == 0;
      INFO("sample " << b << " row " << t);
      REQUIRE(same == (t < len.data<int32_t>()[b]));
    }
  // Gradients with lengths: every target counted, finite differences.
  Tensor tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
  model.grads().zero_();
  model.forward_backward(tok, tgt, 1.0f / (B * T));
  Rng pick(5);
  for (const ParamSpec& s : model.layout().params)
    if (s.name.find("attn.qkv.weight") != std::string::npos)
      for (int k = 0; k < 6; ++k)
        check_element(model, [&] { return model.forward_loss(tok, tgt); },
                      s.offset + static_cast<int64_t>(pick.below(s.numel)), 1.0, s.name);
}

// Generation holds a LoRA model's weights (GptModel::hold_params): the
// effective weights are computed once and serve every decode step, which
// gives the same logits bit for bit as computing them per step; a backward
// while they are held is refused, and training goes on after the release.
TEST_CASE("LoRA: held weights decode as per-step ones") {
  ModelConfig cfg = test::tiny_model(true);
  cfg.lora.dim = 2;
  for (int l = 0; l < cfg.num_layers; ++l) cfg.lora.targets.push_back({l, "attn.proj.weight", 0, cfg.hidden_size});
  GptModel model(cfg, Device::cpu());
  model.init_weights(3, 0.2f);
  Rng r(5);
  for (const ParamSpec& p : model.layout().params)
    if (p.name.ends_with(".left"))
      for (int64_t i = 0; i < p.numel; ++i) model.params().data<float>()[p.offset + i] = static_cast<float>(r.uniform() - 0.5);
  const Tensor tok = test::random_tokens(1, 5, cfg.vocab_size, 3);
  auto decode = [&] {
    KvCache c = model.make_kv_cache(1, 8);
    std::vector<float> out;
    Tensor l = model.decode_forward(tok, {0}, c);
    out.insert(out.end(), l.data<float>(), l.data<float>() + l.numel());
    for (int32_t step = 0; step < 2; ++step) {
      Tensor next = test::random_tokens(1, 1, cfg.vocab_size, 10 + static_cast<uint64_t>(step));
      l = model.decode_forward(next, {5 + step}, c);
      out.insert(out.end(), l.data<float>(), l.data<float>() + l.numel());
    }
    return out;
  };
  const std::vector<float> per_step = decode();
  model.hold_params(true);
  const std::vector<float> held = decode();
  model.hold_params(false);
  REQUIRE(held == per_step);
  model.grads().zero_();
  model.forward_backward(tok, tok, 1.f);  // training goes on after the release
  model.hold_params(true);
  REQUIRE_THROWS_WITH(model.forward_backward(tok, tok, 1.f), Catch::Contains("held"));
}

// LoRA (ModelConfig::lora, lib/model/lora.cpp): the adapted weights compute
// with W + s L^T R (s = scaling / dim) per target block, their own gradient
// is zero, the left and right gradients match finite differences, and a
// zero left (the initialisation) leaves the model's outputs as they were.
TEST_CASE("LoRA: effective weights, frozen bases and finite-difference gradients") {
  for (bool llama : {false, true}) {
    ModelConfig cfg = test::tiny_model(llama);
    const int64_t C = cfg.hidden_size, F = llama ? 24 : 4 * C;
    cfg.lora.dim = 3;
    cfg.lora.scaling = 1.5f;
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int k = 0; k < 3; ++k) cfg.lora.targets.push_back({l, "attn.qkv.weight", k * C, C});  // q, k, v
      cfg.lora.targets.push_back({l, "attn.proj.weight", 0, C});
      if (llama) {  // gate and up
        cfg.lora.targets.push_back({l, "mlp.fc.weight", 0, F});
        cfg.lora.targets.push_back({l, "mlp.fc.weight", F, F});
      } else {
        cfg.lora.targets.push_back({l, "mlp.fc.weight", 0, F});
      }
      cfg.lora.targets.push_back({l, "mlp.proj.weight", 0, C});
    }
    ModelConfig plain_cfg = test::tiny_model(llama);
    GptModel model(cfg, Device::cpu()), plain(plain_cfg, Device::cpu());
    model.init_weights(7, 0.2f);
    // The same base weights in the model without LoRA.
    for (const ParamSpec& p : plain.layout().params) plain.param(p.name).copy_from(model.param(p.name));
    const ParamSpec& right = model.layout().find("layers.0.lora.0.right");
    REQUIRE(right.shape == Shape{3, C});
    REQUIRE(model.layout().find("layers.0.lora.0.left").shape == Shape{3, C});
    REQUIRE(model.layout().find("layers.0.attn.qkv.weight").lr_scale == 0.f);
    if (!llama) REQUIRE(model.layout().find("layers.0.attn.qkv.bias").lr_scale == 1.f);
    const int64_t B = 2, T = 7;
    const Tensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
    {
      const Tensor a = model.forward_logits(tok).to(Device::cpu()), b = plain.forward_logits(tok).to(Device::cpu());
      REQUIRE(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(a.nbytes())) == 0);
    }
    // Non-zero left tensors, then the fused weights in the plain model give the same loss.
    Rng r(9);
    const float s = cfg.lora.scaling / cfg.lora.dim;
    for (const ParamSpec& p : model.layout().params)
      if (p.name.ends_with(".left"))
        for (int64_t i = 0; i < p.numel; ++i) model.params().data<float>()[p.offset + i] = static_cast<float>(0.3 * (r.uniform() - 0.5));
    for (size_t k = 0; k < cfg.lora.targets.size(); ++k) {
      const LoraTarget& t = cfg.lora.targets[k];
      const std::string pre = "layers." + std::to_string(t.layer) + ".";
      const Tensor L = model.param(pre + "lora." + std::to_string(k) + ".left");
      const Tensor R = model.param(pre + "lora." + std::to_string(k) + ".right");
      Tensor W = plain.param(pre + t.weight);
      const int64_t K = W.size(1);
      for (int64_t o = 0; o < t.rows; ++o)
        for (int64_t i = 0; i < K; ++i) {
          double d = 0;
          for (int64_t j = 0; j < 3; ++j) d += L.data<float>()[j * t.rows + o] * R.data<float>()[j * K + i];
          W.data<float>()[(t.row0 + o) * K + i] += static_cast<float>(s * d);
        }
    }
    INFO((llama ? "llama" : "gpt2"));
    REQUIRE(std::abs(model.forward_loss(tok, tgt) - plain.forward_loss(tok, tgt)) < 1e-5);
    model.grads().zero_();
    model.forward_backward(tok, tgt, 1.0f / (B * T));
    const float* g = model.grads().data<float>();
    Rng pick(4);
    int checked = 0;
    for (const ParamSpec& sp : model.layout().params) {
      if (sp.lr_scale == 0.f) {  // frozen: exactly zero gradient
        for (int64_t i = 0; i < sp.numel; ++i) REQUIRE(g[sp.offset + i] == 0.f);
        continue;
      }
      if (sp.name.find(".lora.") == std::string::npos && sp.name.find("bias") == std::string::npos) continue;
      for (int k = 0; k < 2; ++k, ++checked)
        check_element(model, [&] { return model.forward_loss(tok, tgt); },
                      sp.offset + static_cast<int64_t>(pick.below(sp.numel)), 1.0, sp.name);
    }
    REQUIRE(checked >= 2 * static_cast<int>(2 * cfg.lora.targets.size()));
  }
}

TEST_CASE("LoRA: the targets of a fused weight must cover it; tensor parallelism refused") {
  ModelConfig cfg = test::tiny_model(false);
  cfg.lora.dim = 2;
  cfg.lora.targets = {{0, "attn.qkv.weight", 0, cfg.hidden_size}};  // q_proj alone
  REQUIRE_THROWS_WITH(build_layout(cfg), Catch::Contains("cover 16 of its 48 rows"));
  cfg.lora.targets = {{0, "attn.nope.weight", 0, 4}};
  REQUIRE_THROWS_WITH(build_layout(cfg), Catch::Contains("layer 0 has no weight 'attn.nope.weight'"));
  cfg.lora.targets = {{0, "attn.proj.weight", 0, cfg.hidden_size}};
  REQUIRE_THROWS_WITH(build_layout(cfg, ShardCoords{.tp = 2, .tp_rank = 0}), Catch::Contains("LoRA runs on one"));
}

