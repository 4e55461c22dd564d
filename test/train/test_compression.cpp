// DeepSpeed Compression's activation quantization in dstrain: the
// compression_training section (DeepSpeed's keys and defaults, the module
// patterns matched against Megatron-DeepSpeed's module names, refusals naming
// the key), and the trainer: nothing changes before the schedule offset (bit
// for bit), the quantized steps after it differ and still learn, and the
// static ranges hold each linear layer's running extremes. The quantizer's
// arithmetic itself: test/ops/test_cpu_act_quant.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "lib/core/error.h"
#include "lib/train/compression.h"
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
  CHECK(megatron_module_names(one.model)[2] == "language_model.encoder.layers.0.self_attention.query_key_value");

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
             Contains("picks language_model.embedding.word_embeddings"));
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
  const fs::path wq = fixture().dir / "wq.json";
  std::ofstream(wq) << R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true},
                          "different_groups": {}}}})";
  CHECK_THAT(refused(wq.string()), Contains("'compression_training.weight_quantization.shared_parameters.enabled' "
                                            "is true: this DeepSpeed Compression technique is not implemented"));
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
