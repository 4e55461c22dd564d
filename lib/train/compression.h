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
// named_modules order: language_model.embedding.position_embeddings (learned
// positions; the word embedding is a VocabParallelEmbedding, which
// init_compression leaves alone), then per layer
// language_model.encoder.layers.N.self_attention.query_key_value,
// .self_attention.dense, .mlp.dense_h_to_4h, .mlp.dense_4h_to_h, then
// language_model.output_layer when the head is untied.
std::vector<std::string> megatron_module_names(const ModelConfig& m);

// DeepSpeed's MoQ (runtime/quantize.py Quantizer, driven by the compression
// config's weight_quantization): each call quantizes, in place, the fp16
// weights of the matched linear layers (the f32 master weights stay exact).
// A call first counts itself (qsteps); a weight whose bits are above its
// target drops one bit when qsteps reaches its period, and its period then
// doubles. Its values are cut into quantize_groups equal groups in
// Megatron-DeepSpeed's layout (query_key_value: each head's q, k and v rows
// together) and quantized with the group's extremes in f16 arithmetic:
//   symmetric:  scale = 2 max(|min|, |max|) / 2^bits, clamp(round(x / scale), -2^(bits-1), 2^(bits-1) - 1) * scale
//   asymmetric: scale = (max - min) / 2^bits, zp = round(min / scale) * scale,
//               clamp(round((x - zp) / scale), 0, 2^bits - 1) * scale + zp
class WeightQuantizer {
 public:
  // UserError for a weight whose size the groups do not divide (as torch's
  // reshape upstream) and for patterns as activation_quantization's.
  WeightQuantizer(const TrainConfig& cfg, const ModelLayout& layout);
  int weights() const { return static_cast<int>(w_.size()); }
  void quantize(const Tensor& params);  // the f16 compute weights, at the layout's offsets
  int64_t qsteps() const { return qsteps_; }
  // Whether quantize() has rewritten `name` (a layout parameter) at least once.
  bool quantized(const std::string& name) const;

 private:
  struct Weight {
    std::string name;
    int64_t offset = 0, rows = 0, cols = 0;
    bool qkv = false;
    int bits = 0, target = 0;
    int64_t period = 1;
  };
  std::vector<Weight> w_;
  int64_t qsteps_ = 0, groups_ = 1;
  bool symmetric_ = true, verbose_ = false;
  int64_t heads_ = 1, head_size_ = 1;
};

// The activation quantization cfg.compression asks for. UserError, naming the
// group and the module, for a pattern that is not a regular expression, a
// module two groups claim (DeepSpeed's "already added to compression") and a
// pattern that picks an embedding or the output layer.
ActivationQuantization activation_quantization(const TrainConfig& cfg);

}  // namespace ds
