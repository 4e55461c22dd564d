// Generation on the CPU backend: the sampler's rules, the KV-cache forward
// against the training forward over the whole prefix (logits and greedy
// tokens), batches of different-length prompts against one prompt at a time,
// and seeded sampling reproducibility.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "lib/ckpt/hf.h"
#include "lib/core/error.h"
#include "lib/gen/generator.h"
#include "lib/gen/model_source.h"
#include "test/gen/gen_fixture.h"

using namespace ds;
using namespace ds::gen;

namespace {

std::vector<float> logits3(float a, float b, float c) { return {a, b, c}; }

double max_rel(const float* a, const float* b, int64_t n) {
  double err = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
  }
  return err / mx;
}

}  // namespace

TEST_CASE("sampler: greedy, penalty, top-k, top-p, temperature", "[gen]") {
  SamplingConfig g;
  auto l = logits3(1.f, 3.f, 2.f);
  CHECK(sample_next(l, {}, g, 0, 0) == 1);
  l = logits3(1.f, 3.f, 3.f);
  CHECK(sample_next(l, {}, g, 0, 0) == 1);  // ties: lowest id
  // Penalty 2 on token 1 (positive logit: divided) makes token 2 the argmax;
  // on a negative logit it multiplies.
  g.repetition_penalty = 2.f;
  l = logits3(1.f, 3.f, 2.f);
  std::vector<int32_t> seen{1, 1};
  CHECK(sample_next(l, seen, g, 0, 0) == 2);
  CHECK(l[1] == 1.5f);
  l = logits3(-1.f, -3.f, -1.5f);
  seen = {0};
  CHECK(sample_next(l, seen, g, 0, 0) == 2);
  CHECK(l[0] == -2.f);
  SamplingConfig s;
  s.greedy = false;
  s.top_k = 1;
  for (uint64_t step = 0; step < 50; ++step) {
    l = logits3(1.f, 3.f, 2.9f);
    CHECK(sample_next(l, {}, s, 0, step) == 1);
  }
  s.top_k = 0;
  s.top_p = 0.3f;  // token 1 alone has p > 0.3
  for (uint64_t step = 0; step < 50; ++step) {
    l = logits3(1.f, 3.f, 2.9f);
    CHECK(sample_next(l, {}, s, 0, step) == 1);
  }
  // Two tokens with probabilities 1/4 and 3/4 at temperature 1; at temperature
  // 0.5 they become 1/10 and 9/10.
  s.top_p = 1.f;
  for (float temp : {1.f, 0.5f}) {
    s.temperature = temp;
    int ones = 0;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
      std::vector<float> two{0.f, std::log(3.f)};
      ones += sample_next(two, {}, s, 3, static_cast<uint64_t>(i));
    }
    const double want = temp == 1.f ? 0.75 : 0.9;
    CHECK(std::fabs(ones / double(n) - want) < 0.03);
  }
  SamplingConfig bad;
  bad.top_p = 0.f;
  CHECK_THROWS_AS(validate_sampling(bad), UserError);
  bad = {};
  bad.temperature = -1.f;
  CHECK_THROWS_AS(validate_sampling(bad), UserError);
}

// "mixtral": a dropless top-2 MoE model (each token's experts depend on the
// token alone, so the incremental decode routes as the full forward).
TEST_CASE("kv cache: decode logits equal the full-prefix forward", "[gen]") {
  for (const std::string kind : {"gpt2", "llama", "mixtral", "opt350m"}) {
    INFO(kind);
    auto model = test::gen_model(kind);
    const int64_t V = model->dims().V, Vp = model->dims().Vp, T = 24;
    std::vector<int32_t> ids;
    for (int t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>((t * 131 + 17) % V));
    Tensor all = Tensor::from_blob(ids.data(), {1, T}, DType::I32).clone();
    Tensor ref = model->forward_logits(all).clone();  // (T, Vp)
    KvCache cache = model->make_kv_cache(1, T);
    // Prefill 5 tokens, then one token at a time.
    Tensor pre = Tensor::from_blob(ids.data(), {1, 5}, DType::I32).clone();
    Tensor l = model->decode_forward(pre, {0}, cache);
    CHECK(max_rel(l.data<float>(), ref.data<float>() + 4 * Vp, V) < 1e-5);
    for (int t = 5; t < T; ++t) {
      Tensor one = Tensor::from_blob(ids.data() + t, {1, 1}, DType::I32).clone();
      l = model->decode_forward(one, {t}, cache);
      INFO("position " << t);
      CHECK(max_rel(l.data<float>(), ref.data<float>() + t * Vp, V) < 1e-5);
    }
  }
}

TEST_CASE("generate: KV cache and recompute give the same greedy tokens; batches equal single prompts", "[gen]") {
  for (const std::string kind : {"gpt2", "llama", "mixtral", "opt350m"}) {
    INFO(kind);
    auto model = test::gen_model(kind);
    const auto prompts = test::gen_prompts();
    GenOptions opt;
    opt.max_new_tokens = 24;
    auto cached = generate(*model, prompts, opt);
    opt.use_kv_cache = false;
    auto recomputed = generate(*model, prompts, opt);
    opt.use_kv_cache = true;
    REQUIRE(cached.size() == prompts.size());
    for (size_t b = 0; b < prompts.size(); ++b) {
      CHECK(cached[b].tokens.size() == 24);
      CHECK(cached[b].tokens == recomputed[b].tokens);
      auto single = generate(*model, {prompts[b]}, opt);
      CHECK(single[0].tokens == cached[b].tokens);
    }
    // The tokens are not trivially constant (the check above could not fail otherwise).
    std::set<int32_t> distinct(cached[1].tokens.begin(), cached[1].tokens.end());
    CHECK(distinct.size() > 3);
  }
}

TEST_CASE("generate: stop ids, stop callback, context limit", "[gen]") {
  auto model = test::gen_model("gpt2");
  const auto prompts = test::gen_prompts();
  GenOptions opt;
  opt.max_new_tokens = 10;
  auto base = generate(*model, {prompts[0]}, opt)[0];
  REQUIRE(base.tokens.size() == 10);
  opt.stop_ids = {base.tokens[3]};
  auto r = generate(*model, {prompts[0]}, opt)[0];
  const auto first = std::find(base.tokens.begin(), base.tokens.end(), base.tokens[3]) - base.tokens.begin();
  CHECK(r.reason == StopReason::EndOfDocument);
  CHECK(static_cast<int64_t>(r.tokens.size()) == first);
  opt.stop_ids.clear();
  int calls = 0;
  r = generate(*model, {prompts[0]}, opt, [&](int64_t, int32_t) { return ++calls == 2; })[0];
  CHECK(r.reason == StopReason::StopString);
  CHECK(r.tokens.size() == 2);
  opt.max_new_tokens = 100;  // prompt of 11 tokens in a 64-position model: 53 new tokens fit
  r = generate(*model, {prompts[1]}, opt)[0];
  CHECK(r.reason == StopReason::Context);
  CHECK(r.tokens.size() == 53);
  std::vector<int32_t> too_long(64, 1);
  CHECK_THROWS_AS(generate(*model, {too_long}, opt), UserError);
  CHECK_THROWS_AS(generate(*model, {{}}, opt), UserError);
}

// Weights holding NaN make NaN logits: an error naming the prompt and step,
// greedy or sampled, never token 0.
TEST_CASE("generate: non-finite logits are an error naming the prompt and step", "[gen]") {
  auto model = test::gen_model("gpt2");
  Tensor p = model->params().clone();
  p.data<float>()[p.numel() - 1] = std::nanf("");  // one parameter: every logit turns NaN
  model->store().set_full_params(p);
  const auto prompts = test::gen_prompts();
  for (bool greedy : {true, false}) {
    GenOptions opt;
    opt.max_new_tokens = 4;
    opt.sampling.greedy = greedy;
    CHECK_THROWS_WITH(generate(*model, {prompts[0], prompts[1]}, opt),
                      Catch::Contains("prompt 1, generated token 1: the model's logits are not finite"));
  }
}

// A model whose vocabulary is larger than the tokenizer's (Pythia, Qwen2)
// never generates the ids past the tokenizer's, greedy or sampled: their
// logits are cut off as the padded rows are. The limit is set where the
// unlimited greedy run generates some id above it, so the cut shows.
TEST_CASE("generate: ids past vocab_limit are never generated", "[gen]") {
  auto model = test::gen_model("gpt2");
  const auto prompts = test::gen_prompts();
  GenOptions opt;
  opt.max_new_tokens = 24;
  const auto free = generate(*model, prompts, opt);
  std::vector<int32_t> all;
  for (const auto& r : free) all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  std::sort(all.begin(), all.end());
  const int32_t limit = all[all.size() / 2];  // half of the greedy tokens lie at or above it
  REQUIRE(limit > 0);
  opt.vocab_limit = limit;
  for (bool greedy : {true, false}) {
    INFO("greedy " << greedy);
    opt.sampling.greedy = greedy;
    opt.sampling.temperature = 1.5f;
    for (const auto& r : generate(*model, prompts, opt)) {
      CHECK(r.tokens.size() == 24);
      for (int32_t t : r.tokens) CHECK(t < limit);
    }
  }
  opt.sampling.greedy = true;
  opt.vocab_limit = model->dims().V;  // the whole vocabulary: no change
  const auto same = generate(*model, prompts, opt);
  for (size_t b = 0; b < prompts.size(); ++b) CHECK(same[b].tokens == free[b].tokens);
}

TEST_CASE("generate: seeded sampling is reproducible and independent of batching", "[gen]") {
  auto model = test::gen_model("llama");
  const auto prompts = test::gen_prompts();
  GenOptions opt;
  opt.max_new_tokens = 16;
  opt.sampling.greedy = false;
  opt.sampling.temperature = 1.5f;
  opt.sampling.top_k = 50;
  opt.sampling.top_p = 0.95f;
  opt.sampling.seed = 42;
  auto a = generate(*model, prompts, opt), b = generate(*model, prompts, opt);
  for (size_t i = 0; i < prompts.size(); ++i) CHECK(a[i].tokens == b[i].tokens);
  auto last = generate(*model, {prompts[0], prompts[1], prompts[2], prompts[3]}, opt);
  CHECK(last[3].tokens == a[3].tokens);
  opt.sampling.seed = 43;
  auto c = generate(*model, prompts, opt);
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) differ += c[i].tokens != a[i].tokens;
  CHECK(differ > 0);
  opt.sampling.greedy = true;
  auto greedy = generate(*model, prompts, opt);
  int differ_greedy = 0;
  for (size_t i = 0; i < prompts.size(); ++i) differ_greedy += greedy[i].tokens != a[i].tokens;
  CHECK(differ_greedy > 0);
}

TEST_CASE("generate: bf16 KV cache tracks the f32 logits", "[gen]") {
  auto f32 = test::gen_model("llama"), bf = test::gen_model("llama", Device::cpu(), DType::BF16);
  const auto p = test::gen_prompts()[1];
  Tensor tok = Tensor::from_blob(const_cast<int32_t*>(p.data()), {1, static_cast<int64_t>(p.size())}, DType::I32).clone();
  KvCache c1 = f32->make_kv_cache(1, 16), c2 = bf->make_kv_cache(1, 16);
  Tensor a = f32->decode_forward(tok, {0}, c1), b = bf->decode_forward(tok, {0}, c2);
  const double rel = max_rel(b.data<float>(), a.data<float>(), f32->dims().V);
  CHECK(rel < 0.05);
  CHECK(rel > 0);  // really ran in bf16
}

TEST_CASE("model_config_from_hf: transformers config.json fields", "[gen]") {
  nlohmann::json j = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 96},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_hidden_layers", 2},
                      {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-6}, {"rope_theta", 500000.0},
                      {"vocab_size", 301}, {"tie_word_embeddings", false}};
  ModelConfig m = model_config_from_hf(j, "config.json", 2);
  CHECK(m.norm == NormKind::RMSNorm);
  CHECK(m.num_kv_heads == 2);
  CHECK(m.padded_vocab_size == 302);
  CHECK(m.rope_theta == 500000.f);
  CHECK(m.untie_embeddings);
  j["rope_scaling"] = {{"type", "linear"}};
  CHECK_THROWS_AS(model_config_from_hf(j, "config.json", 1), UserError);
  nlohmann::json g = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_head", 4}, {"n_layer", 2}, {"n_inner", nullptr},
                      {"vocab_size", 300}, {"activation_function", "gelu_new"}};
  m = model_config_from_hf(g, "config.json", 1);
  CHECK(m.ffn_hidden_size == 256);
  CHECK(m.max_position_embeddings == 1024);
  CHECK(!m.untie_embeddings);
  g["activation_function"] = "relu";
  CHECK_THROWS_AS(model_config_from_hf(g, "config.json", 1), UserError);
  CHECK_THROWS_AS(model_config_from_hf({{"model_type", "bert"}}, "config.json", 1), UserError);
}

// export_hf's config.json read back by model_config_from_hf gives the same
// model for each architecture it writes (GPT-2, LLaMA with GQA and untied
// output, GPT-NeoX with partial rotation): the two directions of one format.
TEST_CASE("model_config_from_hf reads back the config.json export_hf writes", "[gen]") {
  namespace fs = std::filesystem;
  using test::gen_model_config;
  ModelConfig neox = gen_model_config("gpt2");
  neox.position = PositionKind::Rope;
  neox.rotary_percent = 0.25f;
  neox.ffn_hidden_size = 160;
  ModelConfig llama = gen_model_config("llama");
  llama.untie_embeddings = true;
  for (const ModelConfig& c : {gen_model_config("gpt2"), llama, neox, gen_model_config("opt350m")}) {
    const ModelDims want = model_dims(c);
    INFO("L " << want.L << " rope " << want.rope << " rot " << want.rot << " NKV " << want.NKV);
    const ModelLayout layout = build_layout(c);
    Tensor params = Tensor::zeros({layout.total}, DType::F32);
    const fs::path dir = fs::temp_directory_path() / ("ds_hf_roundtrip_" + std::to_string(::getpid()));
    export_hf(c, layout, params, dir.string());
    std::ifstream in(dir / "config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    fs::remove_all(dir);
    const ModelDims got = model_dims(model_config_from_hf(j, "config.json", 1));
    CHECK(got.L == want.L);
    CHECK(got.C == want.C);
    CHECK(got.NH == want.NH);
    CHECK(got.NKV == want.NKV);
    CHECK(got.HS == want.HS);
    CHECK(got.F == want.F);
    CHECK(got.rot == want.rot);
    CHECK(got.V == want.V);
    CHECK(got.maxT == want.maxT);
    CHECK(got.gpt2 == want.gpt2);
    CHECK(got.bias == want.bias);
    CHECK(got.untied == want.untied);
    CHECK(got.rope == want.rope);
    CHECK(got.rmsnorm == want.rmsnorm);
    CHECK(got.swiglu == want.swiglu);
    CHECK(got.relu == want.relu);
    CHECK(got.post_norm == want.post_norm);
    CHECK(got.P == want.P);
  }
}

TEST_CASE("model_config_from_hf names the option that gave the file", "[gen]") {
  try {
    model_config_from_hf({{"model_type", "bert"}}, "x/config.json", 1, "--hf-config");
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("--hf-config: 'x/config.json' has model_type 'bert'") != std::string::npos);
  }
}

// A config.json past the model limits is refused before any size is computed
// from it: n_layer 1e8 would build a 20 GB layout, and 4 * n_embd 1e9 (the
// default n_inner) does not fit an int.
TEST_CASE("model_config_from_hf applies the model limits", "[gen]") {
  using Catch::Matchers::Contains;
  nlohmann::json g = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_head", 4}, {"n_layer", 100000000},
                      {"vocab_size", 300}};
  CHECK_THROWS_WITH(model_config_from_hf(g, "d/config.json", 1),
                    Contains("--init-from 'd/config.json': n_layer 100000000 is more than the 65536 layers"));
  g["n_layer"] = 2;
  g["n_embd"] = 1000000000;
  g["n_head"] = 1;
  CHECK_THROWS_WITH(model_config_from_hf(g, "d/config.json", 1),
                    Contains("n_embd 1000000000") && Contains("parameters, more than the 1e+13 dstrain supports"));
  nlohmann::json l = {{"model_type", "llama"}, {"hidden_size", 1 << 20}, {"intermediate_size", 1 << 20},
                      {"num_attention_heads", 8}, {"num_hidden_layers", 2}, {"vocab_size", 300}};
  CHECK_THROWS_WITH(model_config_from_hf(l, "d/config.json", 1),
                    Contains("num_hidden_layers 2, hidden_size 1048576 and intermediate_size 1048576 make at least"));
  l["hidden_size"] = l["intermediate_size"] = 64;
  CHECK(model_config_from_hf(l, "d/config.json", 1).hidden_size == 64);
}

namespace {

// An HF directory (config.json + model.safetensors) of the small GPT-2 test
// model, with config.json's fields then replaced by `edit`.
std::filesystem::path hf_dir_with(const std::string& name, const nlohmann::json& edit) {
  namespace fs = std::filesystem;
  const ModelConfig c = test::gen_model_config("gpt2");
  const ModelLayout layout = build_layout(c);
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  export_hf(c, layout, Tensor::zeros({layout.total}, DType::F32), dir.string());
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j.merge_patch(edit);
  std::ofstream(dir / "config.json") << j.dump();
  return dir;
}

}  // namespace

// dsgen --init-from checks config.json against the tensors the safetensors
// header declares before it allocates the model: a config of 3.4e12
// parameters (within the limits) over a 2-layer file is one line naming the
// first tensor that differs, not an allocation of 13 TB.
TEST_CASE("load_model --init-from checks config.json against the safetensors header first", "[gen]") {
  using Catch::Matchers::Contains;
  namespace fs = std::filesystem;
  const fs::path huge = hf_dir_with("ds_hf_huge", {{"n_layer", 5000}, {"n_embd", 8192}, {"n_head", 64},
                                                   {"n_inner", nullptr}});
  ModelSource src;
  src.init_from = huge.string();
  CHECK_THROWS_WITH(load_model(src, 1),
                    Contains("tensor 'transformer.wte.weight' is (300, 64), but '" + (huge / "config.json").string() +
                             "' makes it (300, 8192)"));
  fs::remove_all(huge);
  const fs::path deeper = hf_dir_with("ds_hf_deeper", {{"n_layer", 3}});
  src.init_from = deeper.string();
  CHECK_THROWS_WITH(load_model(src, 1), Contains("tensor 'transformer.h.2.ln_1.weight' is missing, but '" +
                                                 (deeper / "config.json").string() + "' needs it"));
  fs::remove_all(deeper);
  const fs::path same = hf_dir_with("ds_hf_same", nlohmann::json::object());
  src.init_from = same.string();
  CHECK(load_model(src, 1).model.num_layers == 2);
  fs::remove_all(same);
}
