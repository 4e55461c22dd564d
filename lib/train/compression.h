// DeepSpeed Compression as dstrain runs it (docs/config.md, "DeepSpeed
// Compression"): which of the layers' linear layers quantize their inputs,
// found the way init_compression finds them, by searching the config's
// module patterns (regular expressions) in Megatron-DeepSpeed's module names.
#pragma once
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/model/gpt.h"

namespace ds {

// The compressible modules of Megatron-DeepSpeed's GPTModel (no pipeline), in
// named_modules order: language_model.embedding.word_embeddings (and
// .position_embeddings with learned positions), then per layer
// language_model.encoder.layers.N.self_attention.query_key_value,
// .self_attention.dense, .mlp.dense_h_to_4h, .mlp.dense_4h_to_h, then
// language_model.output_layer when the head is untied.
std::vector<std::string> megatron_module_names(const ModelConfig& m);

// The activation quantization cfg.compression asks for. UserError, naming the
// group and the module, for a pattern that is not a regular expression, a
// module two groups claim (DeepSpeed's "already added to compression") and a
// pattern that picks an embedding or the output layer.
ActivationQuantization activation_quantization(const TrainConfig& cfg);

}  // namespace ds
