// Hugging Face interop: export a model as model.safetensors + config.json in
// transformers' naming and layout (GPT2LMHeadModel, LlamaForCausalLM), and
// import such a file as initial weights. Export writes the real vocabulary
// rows only; import zero-fills the padded rows.
#pragma once
#include <string>

#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/model/model_config.h"

namespace ds {

// params: (layout.total) f32 on any device. Writes OUTDIR/model.safetensors and
// OUTDIR/config.json (into a temp dir renamed into place).
void export_hf(const ModelConfig& cfg, const ModelLayout& layout, const Tensor& params, const std::string& outdir);

// Fills params (layout.total, any device) from an HF safetensors file or a
// directory holding model.safetensors. Mismatched names/shapes -> UserError.
void import_hf(const ModelConfig& cfg, const ModelLayout& layout, Tensor& params, const std::string& path);

}  // namespace ds
