// ModelConfig helpers: enum spellings and the model size limits every tool
// applies.
#include "lib/model/model_config.h"

#include <algorithm>
#include <cstdint>

#include "lib/core/error.h"

namespace ds {

int MoeConfig::experts(int layer, int num_layers) const {
  if (expert_interval <= 0 || num_experts.empty() || (layer + 1) % expert_interval != 0) return 1;
  const size_t k = num_experts.size() == 1 ? 0 : static_cast<size_t>(layer / expert_interval);
  DS_CHECK(k < num_experts.size(), "layer {}: {} expert counts for {} layers at interval {}", layer,
           num_experts.size(), num_layers, expert_interval);
  return std::max(1, num_experts[k]);
}

bool MoeConfig::enabled(int num_layers) const {
  for (int l = 0; l < num_layers; ++l)
    if (experts(l, num_layers) > 1) return true;
  return false;
}

const char* family_name(ModelFamily f) { return f == ModelFamily::LLaMA ? "llama" : "gpt2"; }

void check_model_limits(const ModelConfig& m, const std::string& where, const ModelSizeNames& names) {
  const std::string at = where.empty() ? std::string() : where + ": ";
  DS_USER_CHECK(m.num_layers > 0, "{}{} must be positive, got {}", at, names.layers, m.num_layers);
  DS_USER_CHECK(m.num_layers <= kMaxModelLayers, "{}{} {} is more than the {} layers dstrain supports", at,
                names.layers, m.num_layers, kMaxModelLayers);
  const double C = m.hidden_size, F = m.ffn_hidden_size, V = std::max(m.vocab_size, m.padded_vocab_size);
  const double positions = m.position == PositionKind::Learned ? double(m.max_position_embeddings) * C : 0.0;
  // Each MoE layer holds its experts' MLPs (the expert count is checked
  // against kMaxExperts before this).
  double mlps = 0;
  for (int l = 0; l < m.num_layers; ++l) mlps += m.moe.experts(l, m.num_layers);
  const double P = m.embed_proj_dim > 0 ? std::min<double>(m.embed_proj_dim, C) : C;  // the token embedding's width
  const double params =
      m.num_layers * 2 * C * C + mlps * (m.activation == Activation::SwiGLU ? 3 : 2) * C * F + V * P + positions;
  DS_USER_CHECK(params <= kMaxModelParams, "{}{} {}, {} {} and {} {} make at least {:.3g} parameters, more than "
                "the {:.0e} dstrain supports", at, names.layers, m.num_layers, names.hidden, m.hidden_size,
                names.ffn, m.ffn_hidden_size, params, kMaxModelParams);
}

}  // namespace ds
