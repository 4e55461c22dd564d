// The tiny model configurations shared by the model and checkpoint tests.
#pragma once
#include "lib/model/model_config.h"

namespace ds::test {

// 2 layers, hidden 16, 2 heads, 8 positions, vocab 37 padded to 40.
inline ModelConfig tiny_model(bool llama) {
  ModelConfig m;
  if (llama) set_model_family(m, ModelFamily::LLaMA);
  m.num_layers = 2;
  m.hidden_size = 16;
  m.num_heads = 2;
  m.seq_length = 8;
  m.max_position_embeddings = 8;
  m.vocab_size = 37;
  m.padded_vocab_size = 40;
  if (llama) m.ffn_hidden_size = 24;
  return m;
}

}  // namespace ds::test
