// The tiny model configurations and random token batches shared by the model
// and checkpoint tests.
#pragma once
#include "lib/core/rng.h"
#include "lib/core/tensor.h"
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

// (B, T) i32 token ids uniform in [0, V), from `seed`.
inline Tensor random_tokens(int64_t B, int64_t T, int V, uint64_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  Rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(r.below(V));
  return t;
}

}  // namespace ds::test
