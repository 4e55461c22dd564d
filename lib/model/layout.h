// Parameter layout of a GPT model: every weight is a named range of one flat
// buffer. Params, grads and optimizer states share this layout, so ZeRO
// partitions, checkpoints and HF export are all expressed as ranges and names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/train/config.h"

namespace ds {

// How a weight is initialised.
enum class InitKind { Normal, ScaledNormal, Zeros, Ones };

struct ParamSpec {
  std::string name;   // e.g. "layers.3.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0; // elements from the start of the flat buffer
  int64_t numel = 0;
  int layer = -1;     // transformer layer index; -1 embeddings, num_layers for the final norm / head
  bool decay = true;  // weight decay applies (matrices yes; biases, norms no)
  InitKind init = InitKind::Normal;
};

struct ModelLayout {
  std::vector<ParamSpec> params;
  int64_t total = 0;
  const ParamSpec& find(const std::string& name) const;  // throws if absent
  const ParamSpec* try_find(const std::string& name) const;
};

// Resolved dimensions of a model (derived once from ModelConfig).
struct ModelDims {
  int L = 0, C = 0, NH = 0, HS = 0, F = 0;  // F: FFN hidden size
  int V = 0, Vp = 0, maxT = 0;              // real vocab, padded vocab, max positions
  bool gpt2 = true;                         // LayerNorm/GELU/learned pos/bias family
  bool bias = true, untied = false, rope = false, rmsnorm = false, swiglu = false;
};
ModelDims model_dims(const ModelConfig& m);

ModelLayout build_layout(const ModelConfig& m);
int64_t count_parameters(const ModelConfig& m);

}  // namespace ds
