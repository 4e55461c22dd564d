// Module matching for DeepSpeed Compression (compression.h).
#include "lib/train/compression.h"

#include <regex>

#include "lib/core/error.h"

namespace ds {

namespace {

constexpr const char* kLinear[4] = {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                                    "mlp.dense_4h_to_h"};

}  // namespace

std::vector<std::string> megatron_module_names(const ModelConfig& m) {
  std::vector<std::string> names = {"language_model.embedding.word_embeddings"};
  if (m.position != PositionKind::Rope) names.push_back("language_model.embedding.position_embeddings");
  for (int l = 0; l < m.num_layers; ++l)
    for (const char* lin : kLinear) names.push_back("language_model.encoder.layers." + std::to_string(l) + "." + lin);
  if (m.untie_embeddings) names.push_back("language_model.output_layer");
  return names;
}

ActivationQuantization activation_quantization(const TrainConfig& cfg) {
  const CompressionConfig& c = cfg.compression;
  ActivationQuantization q;
  if (!c.act_quant) return q;
  q.symmetric = c.act_symmetric;
  q.calibrate_static = c.act_static;
  q.bits.assign(static_cast<size_t>(cfg.model.num_layers), {0, 0, 0, 0});
  const std::vector<std::string> names = megatron_module_names(cfg.model);
  std::vector<std::string> claimed(names.size());
  for (const ActQuantGroup& g : c.act_groups) {
    for (const std::string& pattern : g.modules) {
      std::regex re;
      try {
        re = std::regex(pattern);
      } catch (const std::regex_error& e) {
        DS_USER_ERROR("config: compression_training.activation_quantization.different_groups.{}.modules: '{}' is not "
                      "a regular expression ({})", g.name, pattern, e.what());
      }
      for (size_t i = 0; i < names.size(); ++i) {
        if (!std::regex_search(names[i], re)) continue;
        DS_USER_CHECK(claimed[i].empty() || claimed[i] == g.name,
                      "config: compression_training.activation_quantization: {} is already added to compression by "
                      "group '{}'; group '{}' claims it again (as DeepSpeed, an error)", names[i], claimed[i], g.name);
        claimed[i] = g.name;
        const std::string& n = names[i];
        const std::string layers = "language_model.encoder.layers.";
        DS_USER_CHECK(n.rfind(layers, 0) == 0,
                      "config: compression_training.activation_quantization.different_groups.{}.modules '{}' picks {}: "
                      "DeepSpeed quantizes the activations of linear layers only, and dstrain those of the "
                      "transformer layers; narrow the pattern (e.g. 'encoder.layers')", g.name, pattern, n);
        const size_t dot = n.find('.', layers.size());
        const int l = std::stoi(n.substr(layers.size(), dot - layers.size()));
        const std::string lin = n.substr(dot + 1);
        for (int k = 0; k < 4; ++k)
          if (lin == kLinear[k]) q.bits[static_cast<size_t>(l)][k] = g.bits;
      }
    }
  }
  return q;
}

}  // namespace ds
