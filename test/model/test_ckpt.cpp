// Checkpoint and Hugging Face interop tests: exact round trips, re-partitioned
// optimizer shards, and clear errors (never a partial load) on bad files.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/hf.h"
#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/model/gpt.h"
#include "test/model/tiny_model.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("dstrain_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void zero_padded_rows(GptModel& m) {
  const ModelDims& d = m.dims();
  for (const char* n : {"embed.wte", "head.weight"}) {
    if (!m.layout().try_find(n)) continue;
    Tensor w = m.param(n);
    std::fill(w.data<float>() + int64_t(d.V) * d.C, w.data<float>() + w.numel(), 0.f);
  }
}

bool same(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
}

}  // namespace

TEST_CASE("HF export then import is lossless for both families") {
  for (bool llama : {false, true}) {
    ModelConfig cfg = test::tiny_model(llama);
    GptModel a(cfg, Device::cpu()), b(cfg, Device::cpu());
    a.init_weights(5, 0.1f);
    zero_padded_rows(a);
    fs::path dir = temp_dir(llama ? "hf_llama" : "hf_gpt2");
    export_hf(cfg, a.layout(), a.params(), (dir / "out").string());
    REQUIRE(fs::exists(dir / "out" / "config.json"));
    SafetensorsFile f = SafetensorsFile::open((dir / "out" / "model.safetensors").string());
    if (llama) {
      REQUIRE(f.shape("model.layers.1.self_attn.k_proj.weight") == Shape{16, 16});
      REQUIRE(f.shape("model.layers.0.mlp.gate_proj.weight") == Shape{24, 16});
      REQUIRE(f.shape("lm_head.weight") == Shape{37, 16});
    } else {
      // Conv1D orientation: (in, out).
      REQUIRE(f.shape("transformer.h.0.attn.c_attn.weight") == Shape{16, 48});
      REQUIRE(f.shape("transformer.h.1.mlp.c_proj.weight") == Shape{64, 16});
      REQUIRE(f.shape("transformer.wte.weight") == Shape{37, 16});
      Tensor w = f.get("transformer.h.0.attn.c_attn.weight");
      // c_attn[k][j] == our qkv.weight[j][k]
      REQUIRE(w.data<float>()[3 * 48 + 20] == a.param("layers.0.attn.qkv.weight").data<float>()[20 * 16 + 3]);
    }
    import_hf(cfg, b.layout(), b.params(), (dir / "out").string());
    REQUIRE(same(a.params(), b.params()));
    fs::remove_all(dir);
  }
}

TEST_CASE("HF export of flag-built models: GQA as LLaMA with num_key_value_heads, unmappable blocks refused") {
  // Megatron's block flags without a family: RoPE, RMSNorm, SwiGLU, untied, no biases, 1 kv head of 2.
  ModelConfig cfg = test::tiny_model(false);
  cfg.norm = NormKind::RMSNorm;
  cfg.activation = Activation::SwiGLU;
  cfg.position = PositionKind::Rope;
  cfg.bias = false;
  cfg.untie_embeddings = true;
  cfg.ffn_hidden_size = 24;
  cfg.num_kv_heads = 1;
  GptModel a(cfg, Device::cpu()), b(cfg, Device::cpu());
  a.init_weights(6, 0.1f);
  zero_padded_rows(a);
  fs::path dir = temp_dir("hf_gqa");
  export_hf(cfg, a.layout(), a.params(), (dir / "out").string(), HfTokenIds{.bos = 1, .eos = 2});
  SafetensorsFile f = SafetensorsFile::open((dir / "out" / "model.safetensors").string());
  CHECK(f.shape("model.layers.0.self_attn.q_proj.weight") == Shape{16, 16});
  CHECK(f.shape("model.layers.0.self_attn.k_proj.weight") == Shape{8, 16});  // 1 kv head of size 8
  CHECK(f.shape("model.layers.1.self_attn.v_proj.weight") == Shape{8, 16});
  // v_proj row 3 == our qkv row C + KV + 3
  CHECK(f.get("model.layers.1.self_attn.v_proj.weight").data<float>()[3 * 16 + 5] ==
        a.param("layers.1.attn.qkv.weight").data<float>()[(16 + 8 + 3) * 16 + 5]);
  std::ifstream cj(dir / "out" / "config.json");
  const std::string config((std::istreambuf_iterator<char>(cj)), std::istreambuf_iterator<char>());
  CHECK(config.find("\"LlamaForCausalLM\"") != std::string::npos);
  CHECK(config.find("\"num_key_value_heads\": 1") != std::string::npos);
  CHECK(config.find("\"bos_token_id\": 1") != std::string::npos);
  CHECK(config.find("\"eos_token_id\": 2") != std::string::npos);
  import_hf(cfg, b.layout(), b.params(), (dir / "out").string());
  REQUIRE(same(a.params(), b.params()));

  struct Refused {
    const char* what;
    std::function<void(ModelConfig&)> change;
  };
  const std::vector<Refused> refused = {
      {"LayerNorm with RoPE", [](ModelConfig& m) { m.norm = NormKind::LayerNorm; }},
      {"GELU MLP with RoPE", [](ModelConfig& m) { m.activation = Activation::GELU; }},
      {"linear-layer biases with RoPE", [](ModelConfig& m) { m.bias = true; }},
      {"partial RoPE (rotary_percent: 4 of 8", [](ModelConfig& m) { m.rotary_percent = 0.5f; }},
      {"grouped-query attention with learned positions",
       [](ModelConfig& m) { set_model_family(m, ModelFamily::GPT2); }},
      {"RMSNorm with learned positions", [](ModelConfig& m) { m.position = PositionKind::Learned; }},
  };
  for (const Refused& r : refused) {
    INFO(r.what);
    ModelConfig c = cfg;
    r.change(c);
    GptModel m(c, Device::cpu());
    const fs::path out = dir / "refused";
    REQUIRE_THROWS_WITH(export_hf(c, m.layout(), m.params(), out.string()), Catch::Contains(r.what));
    CHECK(!fs::exists(out));  // nothing half-written
  }
  fs::remove_all(dir);
}

TEST_CASE("HF export of partial RoPE with LayerNorm, GELU and biases: GPT-NeoX, lossless") {
  ModelConfig cfg = test::tiny_model(false);  // GPT-2 blocks (tied), then RoPE on half of each head
  cfg.position = PositionKind::Rope;
  cfg.rotary_percent = 0.5f;
  GptModel a(cfg, Device::cpu()), b(cfg, Device::cpu());
  a.init_weights(8, 0.1f);
  zero_padded_rows(a);
  fs::path dir = temp_dir("hf_neox");
  export_hf(cfg, a.layout(), a.params(), (dir / "out").string());
  std::ifstream cj(dir / "out" / "config.json");
  const std::string config((std::istreambuf_iterator<char>(cj)), std::istreambuf_iterator<char>());
  CHECK(config.find("\"GPTNeoXForCausalLM\"") != std::string::npos);
  CHECK(config.find("\"rotary_pct\": 0.5") != std::string::npos);
  CHECK(config.find("\"use_parallel_residual\": false") != std::string::npos);
  SafetensorsFile f = SafetensorsFile::open((dir / "out" / "model.safetensors").string());
  CHECK(f.shape("gpt_neox.layers.0.attention.query_key_value.weight") == Shape{48, 16});
  CHECK(f.shape("embed_out.weight") == Shape{37, 16});
  // NeoX row 3*HS*h + HS*part + i is our qkv row part*C + h*HS + i: head 1's k row 2 = our row 16 + 8 + 2.
  CHECK(f.get("gpt_neox.layers.1.attention.query_key_value.weight").data<float>()[(24 + 8 + 2) * 16 + 7] ==
        a.param("layers.1.attn.qkv.weight").data<float>()[(16 + 8 + 2) * 16 + 7]);
  CHECK(f.get("gpt_neox.layers.0.attention.query_key_value.bias").data<float>()[24 + 16 + 1] ==
        a.param("layers.0.attn.qkv.bias").data<float>()[32 + 8 + 1]);
  import_hf(cfg, b.layout(), b.params(), (dir / "out").string());
  REQUIRE(same(a.params(), b.params()));
  cfg.bias = false;  // GPT-NeoX always has biases
  GptModel c(cfg, Device::cpu());
  REQUIRE_THROWS_WITH(export_hf(cfg, c.layout(), c.params(), (dir / "bad").string()),
                      Catch::Contains("LayerNorm and GELU with RoPE but no linear-layer biases"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoints round-trip and re-partition optimizer shards") {
  ModelConfig cfg = test::tiny_model(false);
  GptModel a(cfg, Device::cpu());
  a.init_weights(9, 0.1f);
  const int64_t total = a.layout().total;
  Tensor m = Tensor::empty({total}, DType::F32), v = Tensor::empty({total}, DType::F32);
  for (int64_t i = 0; i < total; ++i) {
    m.data<float>()[i] = 0.001f * i;
    v.data<float>()[i] = 1.0f + i;
  }
  fs::path dir = temp_dir("ckpt");
  TrainState st;
  st.iteration = 7;
  st.consumed_samples = 56;
  // Save as 3 uneven optimizer shards (like ZeRO with DP=3).
  int64_t cuts[4] = {0, total / 3, total / 2, total};
  for (int r = 0; r < 3; ++r) {
    int64_t lo = cuts[r], hi = cuts[r + 1];
    CheckpointData d{&a.layout(), a.params(), adam_states(m.view(lo, {hi - lo}), v.view(lo, {hi - lo})), lo, hi, 7, r, 3};
    write_checkpoint_files(dir.string(), st, d, nlohmann::json{{"k", 1}});
  }
  REQUIRE_FALSE(fs::exists(dir / "latest"));
  commit_checkpoint(dir.string(), 7);
  REQUIRE(fs::exists(dir / "global_step7" / "state.json"));

  // Load into 2 shards.
  GptModel b(cfg, Device::cpu());
  for (int r = 0; r < 2; ++r) {
    int64_t lo = r * (total / 2), hi = r ? total : total / 2;
    Tensor mm = Tensor::zeros({hi - lo}, DType::F32), vv = Tensor::zeros({hi - lo}, DType::F32);
    CheckpointData d{&b.layout(), b.params(), adam_states(mm, vv), lo, hi, 0, r, 2};
    TrainState got;
    REQUIRE(load_checkpoint(dir.string(), got, d));
    REQUIRE(got.iteration == 7);
    REQUIRE(got.consumed_samples == 56);
    REQUIRE(d.opt_step == 7);
    REQUIRE(same(mm, m.view(lo, {hi - lo})));
    REQUIRE(same(vv, v.view(lo, {hi - lo})));
  }
  REQUIRE(same(a.params(), b.params()));

  SECTION("a different model is refused before anything is touched") {
    ModelConfig other = cfg;
    other.hidden_size = 32;
    GptModel c(other, Device::cpu());
    c.init_weights(1, 0.1f);
    Tensor before = c.params().clone();
    Tensor mm = Tensor::zeros({c.layout().total}, DType::F32), vv = mm.clone();
    CheckpointData d{&c.layout(), c.params(), adam_states(mm, vv), 0, c.layout().total, 0, 0, 1};
    TrainState got;
    REQUIRE_THROWS_AS(load_checkpoint(dir.string(), got, d), UserError);
    REQUIRE(same(before, c.params()));
  }
  SECTION("a truncated weight file is a clear error") {
    fs::path f = dir / "global_step7" / "model.safetensors";
    fs::resize_file(f, fs::file_size(f) / 2);
    Tensor mm = Tensor::zeros({total}, DType::F32), vv = mm.clone();
    Tensor before = b.params().clone();
    CheckpointData d{&b.layout(), b.params(), adam_states(mm, vv), 0, total, 0, 0, 1};
    TrainState got;
    REQUIRE_THROWS_AS(load_checkpoint(dir.string(), got, d), UserError);
    REQUIRE(same(before, b.params()));
  }
  SECTION("a missing optimizer shard is a clear error") {
    fs::remove(dir / "global_step7" / "optim_rank00001_of_00003.safetensors");
    Tensor mm = Tensor::zeros({total}, DType::F32), vv = mm.clone();
    CheckpointData d{&b.layout(), b.params(), adam_states(mm, vv), 0, total, 0, 0, 1};
    TrainState got;
    try {
      load_checkpoint(dir.string(), got, d);
      FAIL("expected an error");
    } catch (const UserError& e) {
      REQUIRE(std::string(e.what()).find("optim_rank00001_of_00003") != std::string::npos);
    }
  }
  fs::remove_all(dir);
}
