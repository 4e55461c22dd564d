// ModelConfig helpers: the padded-vocabulary rule, enum spellings and the
// model size limits every tool applies.
#include "lib/model/model_config.h"

#include <algorithm>
#include <cstdint>

#include "lib/core/error.h"

namespace ds {

int padded_vocab(int vocab, int divisible_by, int tp) {
  DS_USER_CHECK(vocab > 0 && divisible_by > 0 && tp > 0,
                "padded vocab: vocab {}, make_vocab_size_divisible_by {} and tp {} must be positive", vocab,
                divisible_by, tp);
  const int64_t multiple = static_cast<int64_t>(divisible_by) * tp;
  return static_cast<int>((vocab + multiple - 1) / multiple * multiple);
}

const char* family_name(ModelFamily f) { return f == ModelFamily::LLaMA ? "llama" : "gpt2"; }

void check_model_limits(const ModelConfig& m, const std::string& where, const ModelSizeNames& names) {
  const std::string at = where.empty() ? std::string() : where + ": ";
  DS_USER_CHECK(m.num_layers > 0, "{}{} must be positive, got {}", at, names.layers, m.num_layers);
  DS_USER_CHECK(m.num_layers <= kMaxModelLayers, "{}{} {} is more than the {} layers dstrain supports", at,
                names.layers, m.num_layers, kMaxModelLayers);
  const double C = m.hidden_size, F = m.ffn_hidden_size, V = std::max(m.vocab_size, m.padded_vocab_size);
  const double positions = m.position == PositionKind::Learned ? double(m.max_position_embeddings) * C : 0.0;
  const double params =
      m.num_layers * (2 * C * C + (m.activation == Activation::SwiGLU ? 3 : 2) * C * F) + V * C + positions;
  DS_USER_CHECK(params <= kMaxModelParams, "{}{} {}, {} {} and {} {} make at least {:.3g} parameters, more than "
                "the {:.0e} dstrain supports", at, names.layers, m.num_layers, names.hidden, m.hidden_size,
                names.ffn, m.ffn_hidden_size, params, kMaxModelParams);
}

}  // namespace ds
