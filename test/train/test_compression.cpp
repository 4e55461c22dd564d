// DeepSpeed Compression in dstrain. Activation quantization: the
// compression_training section (DeepSpeed's keys and defaults, the module
// patterns matched against Megatron-DeepSpeed's module names, refusals naming
// the key), and the trainer: nothing changes before the schedule offset (bit
// for bit), the quantized steps after it differ and still learn, and the
// static ranges hold each linear layer's running extremes (the quantizer's
// arithmetic itself: test/ops/test_cpu_act_quant.cpp). Weight quantization
// (MoQ): after a run the fp16 weights equal DeepSpeed's quantizer (numpy,
// test/train/moq_ref.py) applied to the cast master weights at the bits its
// schedule reached; its refusals.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>

#include "lib/core/error.h"
#include "lib/ckpt/safetensors.h"
#include "lib/train/compression.h"
#include "test/popen_lines.h"
#include "test/skip.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A config file with compression_training's activation_quantization: the
// given shared parameters and groups ({"name": [bits, "pattern", ...]}).
std::string act_quant_config(const std::string& name, const std::string& shared, const std::string& groups) {
  const fs::path p = fixture().dir / (name + ".json");
  std::ofstream(p) << R"({"compression_training": {"activation_quantization": {"shared_parameters": {"enabled": true)"
                   << (shared.empty() ? "" : ", " + shared) << R"(}, "different_groups": )" << groups << "}}}";
  return p.string();
}

std::string layers_8bit(const std::string& name, const std::string& shared) {
  return act_quant_config(name, shared, R"({"aq1": {"params": {"bits": 8}, "modules": ["encoder.layers"]}})");
}

}  // namespace

TEST_CASE("compression_training.activation_quantization: DeepSpeed's keys, the module patterns, the refusals") {
  const std::string ok = layers_8bit("aq_ok", R"("quantization_type": "asymmetric", "range_calibration": "static",
                                               "schedule_offset": 50)");
  const TrainConfig c = make_config({"--config", ok});
  CHECK(c.compression.act_quant);
  CHECK_FALSE(c.compression.act_symmetric);
  CHECK(c.compression.act_static);
  CHECK(c.compression.act_offset == 50);
  REQUIRE(c.compression.act_groups.size() == 1);
  // The resolved config carries the section and parses back to the same.
  CHECK(train_config_from_json(c.resolved, 1).resolved == c.resolved);
  const ActivationQuantization q = activation_quantization(c);
  REQUIRE(q.bits.size() == 2);
  for (const auto& layer : q.bits)
    for (int b : layer) CHECK(b == 8);
  // DeepSpeed's defaults: symmetric, dynamic, from step 1000.
  const TrainConfig d = make_config({"--config", layers_8bit("aq_defaults", R"("schedule_offset": 0)")});
  CHECK(d.compression.act_symmetric);
  CHECK_FALSE(d.compression.act_static);
  // Patterns are searched in Megatron's names: layer 1's MLP only.
  const TrainConfig one = make_config({"--config", act_quant_config("aq_mlp1", R"("schedule_offset": 0)",
                                       R"({"g": {"params": {"bits": 4}, "modules": ["layers\\.1\\.mlp"]}})")});
  const ActivationQuantization q1 = activation_quantization(one);
  CHECK(q1.bits[0] == std::array<int, 4>{0, 0, 0, 0});
  CHECK(q1.bits[1] == std::array<int, 4>{0, 0, 4, 4});
  CHECK(megatron_module_names(one.model)[1] == "language_model.encoder.layers.0.self_attention.query_key_value");

  auto refused = [](const std::string& file, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--config", file};
    args.insert(args.end(), more.begin(), more.end());
    try {
      activation_quantization(make_config(args));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refused(act_quant_config("aq_bits", "", R"({"g": {"params": {"bits": 6}, "modules": ["layers"]}})")),
             Contains("different_groups.g.params.bits' is 6: DeepSpeed quantizes activations to 4 or 8 bits"));
  CHECK_THAT(refused(act_quant_config("aq_regex", "", R"({"g": {"params": {"bits": 8}, "modules": ["("]}})")),
             Contains("different_groups.g.modules: '(' is not a regular expression"));
  CHECK_THAT(refused(act_quant_config("aq_emb", "", R"({"g": {"params": {"bits": 8}, "modules": ["embedding"]}})")),
             Contains("picks language_model.embedding.position_embeddings"));
  CHECK_THAT(refused(act_quant_config("aq_twice", "", R"({"a": {"params": {"bits": 8}, "modules": ["layers.0"]},
                                                          "b": {"params": {"bits": 4}, "modules": ["dense"]}})")),
             Contains("language_model.encoder.layers.0.self_attention.dense is already added to compression by "
                      "group 'a'"));
  CHECK_THAT(refused(layers_8bit("aq_type", R"("quantization_type": "ternary")")),
             Contains("quantization_type' must be symmetric or asymmetric, got 'ternary'"));
  CHECK_THAT(refused(layers_8bit("aq_symstatic", R"("range_calibration": "static")"), {"--bf16"}),
             Contains("symmetric with range_calibration static needs fp32"));
  CHECK_THAT(refused(layers_8bit("aq_moe", ""), {"--num-experts", "2"}),
             Contains("activation_quantization with Mixture-of-Experts layers is not implemented yet"));
}

TEST_CASE("activation quantization acts from the schedule offset on and keeps learning") {
  const std::vector<std::string> run = {"--train-iters", "8"};
  auto with = [&](const std::string& file) {
    std::vector<std::string> a = run;
    a.insert(a.end(), {"--config", file});
    return a;
  };
  const std::vector<float> base = train(run);
  REQUIRE(base.size() == 8);
  // An offset beyond the run: the same run, bit for bit.
  CHECK(train(with(layers_8bit("aq_never", R"("schedule_offset": 100)"))) == base);
  // From the third step (two applied before it) on, static asymmetric 8 bits.
  Trainer t(make_config(with(layers_8bit("aq_static", R"("quantization_type": "asymmetric",
                                                        "range_calibration": "static", "schedule_offset": 2)"))),
            single_process());
  const std::vector<float> s = t.run();
  REQUIRE(s.size() == 8);
  CHECK(s[0] == base[0]);
  CHECK(s[1] == base[1]);
  for (size_t i = 2; i < s.size(); ++i) {
    INFO("iteration " << i + 1 << ": " << s[i] << " vs " << base[i]);
    CHECK(s[i] != base[i]);
    CHECK(std::fabs(s[i] - base[i]) < 0.05f * base[i]);  // 8 bits: close to the unquantized run
  }
  CHECK(s.back() < s.front());
  // Each linear layer's running range brackets its inputs (a layer norm's output, the attention's, GELU's).
  const Tensor& r = t.model().activation_ranges();
  REQUIRE(r.numel() == 2 * 4 * 2);
  for (int64_t k = 0; k < 8; ++k) {
    INFO("linear " << k);
    CHECK(r.data<float>()[2 * k] < 0.f);
    CHECK(r.data<float>()[2 * k + 1] > 0.f);
  }
  // Dynamic symmetric 4 bits on the MLPs from the start: coarser, still
  // learning. (A dynamic range divides by a row's extremes, so a row of
  // equal values, such as an attention output that is exactly zero, turns
  // into NaN, as upstream; the MLP inputs here have none.)
  const std::vector<float> d = train(with(act_quant_config(
      "aq_dyn4", R"("schedule_offset": 0)", R"({"g": {"params": {"bits": 4}, "modules": ["encoder.layers.*mlp"]}})")));
  CHECK(d[0] != base[0]);
  for (float v : d) CHECK(std::isfinite(v));
  CHECK(d.back() < d.front());
}

namespace {

std::string wq_config(const std::string& name, const std::string& shared, int start, int target, int period) {
  const fs::path p = fixture().dir / (name + ".json");
  std::ofstream(p) << R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true)"
                   << (shared.empty() ? "" : ", " + shared) << R"(}, "different_groups": {"wq1": {"params": {)"
                   << "\"start_bits\": " << start << ", \"target_bits\": " << target
                   << ", \"quantization_period\": " << period << R"(}, "modules": ["encoder.layers"]}}}}})";
  return p.string();
}

std::string hex16(uint16_t v) {
  char b[5];
  std::snprintf(b, sizeof b, "%04x", v);
  return b;
}

}  // namespace

TEST_CASE("MoQ: the fp16 weights equal DeepSpeed's quantizer on the cast master weights, bits on its schedule") {
  for (const char* type : {"symmetric", "asymmetric"}) {
    INFO(type);
    const std::string file =
        wq_config(std::string("wq_") + type, std::string(R"("quantize_groups": 4, "quantization_type": ")") + type + "\"",
                  8, 6, 2);
    const fs::path hf = fixture().dir / (std::string("moq_export_") + type);
    fs::remove_all(hf);
    Trainer t(make_config({"--train-iters", "6", "--fp16", "--loss-scale", "1024", "--config", file, "--export-hf",
                           hf.string()}),
              single_process());
    const std::vector<float> losses = t.run();
    REQUIRE(losses.back() < losses.front());
    {  // The export holds the quantized f16 weights (DeepSpeed's checkpoint holds them), the rest as masters.
      const SafetensorsFile sf = SafetensorsFile::open((hf / "model.safetensors").string());
      const ParamSpec& fc = t.model().layout().find("layers.0.mlp.fc.weight");  // (F, C); GPT-2's c_fc is (C, F)
      const Tensor exported = sf.get("transformer.h.0.mlp.c_fc.weight");
      const int64_t F = fc.shape[0], C = fc.shape[1];
      bool quantized_equal = true, differs_from_master = false;
      for (int64_t f = 0; f < F; ++f)
        for (int64_t c = 0; c < C; ++c) {
          const float e = exported.data<float>()[c * F + f];
          const int64_t i = fc.offset + f * C + c;
          quantized_equal &= e == f16_to_f32(t.model().compute_params().data<uint16_t>()[i]);
          differs_from_master |= e != t.model().params().data<float>()[i];
        }
      CHECK(quantized_equal);
      CHECK(differs_from_master);
      const ParamSpec& ln = t.model().layout().find("layers.0.norm1.weight");
      const Tensor ln_exported = sf.get("transformer.h.0.ln_1.weight");
      CHECK(std::memcmp(ln_exported.data<float>(), t.model().params().data<float>() + ln.offset,
                        static_cast<size_t>(ln.numel) * sizeof(float)) == 0);
    }
    // Quantized before the first forward (offset 0) and after each applied step.
    const int64_t qsteps = 1 + t.optimizer_steps();
    int bits = 8;
    for (int64_t q = 1, period = 2; q <= qsteps; ++q)
      if (bits != 6 && q >= period) period <<= 1, bits -= 1;
    REQUIRE(bits == 6);
    const ModelLayout& layout = t.model().layout();
    const Tensor& master = t.model().params();
    const Tensor& half = t.model().compute_params();
    REQUIRE(half.dtype() == DType::F16);
    const int64_t C = 32, HS = 16;
    std::string cases;
    std::vector<std::string> ours;
    for (const char* name : {"layers.1.attn.qkv.weight", "layers.0.mlp.fc.weight", "layers.1.mlp.proj.weight"}) {
      const ParamSpec& p = layout.find(name);
      const bool qkv = std::string(name).find("qkv") != std::string::npos;
      auto row = [&](int64_t r) {  // Megatron's row r of ours (query_key_value: each head's q, k, v together)
        if (!qkv) return r;
        return ((r / HS) % 3) * C + (r / (3 * HS)) * HS + r % HS;
      };
      std::string line = std::to_string(bits) + " 4 " + type, mine;
      for (int64_t r = 0; r < p.shape[0]; ++r)
        for (int64_t c = 0; c < p.shape[1]; ++c) {
          const int64_t i = p.offset + row(r) * p.shape[1] + c;
          line += " " + hex16(f32_to_f16(master.data<float>()[i]));
          mine += (mine.empty() ? "" : " ") + hex16(half.data<uint16_t>()[i]);
        }
      cases += line + "\n";
      ours.push_back(mine);
    }
    const std::string path = (fixture().dir / (std::string("moq_cases_") + type)).string();
    std::ofstream(path) << cases;
    std::vector<std::string> ref;
    const int rc = test::popen_lines(
        "/usr/bin/python3 " + std::string(std::getenv("DS_SOURCE_DIR")) + "/test/train/moq_ref.py " + path + " 2>&1", ref);
    if (rc == 77) DS_SKIP("numpy not importable");
    REQUIRE(rc == 0);
    REQUIRE(ref.size() == ours.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      INFO("weight " << i);
      CHECK(ours[i] == ref[i]);
    }
  }
}

TEST_CASE("MoQ refusals name the key") {
  auto refused = [](std::vector<std::string> args) {
    try {
      const TrainConfig c = make_config(args);
      Trainer t(c, single_process());
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refused({"--config", wq_config("wq_bf16", "", 8, 4, 10), "--bf16"}),
             Contains("weight_quantization (MoQ: quantizing in the optimizer step) is only supported with fp16"));
  CHECK_THAT(refused({"--config", wq_config("wq_groups", R"("quantize_groups": 7)", 8, 4, 10), "--fp16"}),
             Contains("quantize_groups 7 does not divide the"));
  CHECK_THAT(refused({"--config", wq_config("wq_ternary", "", 8, 2, 10), "--fp16"}),
             Contains("dstrain quantizes weights to 3-16 bits"));
  CHECK_THAT(refused({"--config", wq_config("wq_forward", R"("quantize_weight_in_forward": true)", 8, 4, 10),
                      "--fp16"}),
             Contains("quantize_weight_in_forward' is true"));
}
