// Fuzz target: Hugging Face config.json reading (model_config_from_hf in
// lib/ckpt/hf.cpp, with the model limits of lib/model/model_config.cpp). A
// config it accepts must give a model whose dimensions resolve; a small one
// must also give a layout (the sizes stay in range).
#include <nlohmann/json.hpp>

#include "fuzz/targets/fuzz_common.h"
#include "lib/ckpt/hf.h"
#include "lib/model/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  return ds::fuzz::run_one([&] {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return;
    const int tp = 1 + static_cast<int>(size % 4);
    const ds::ModelConfig m = ds::model_config_from_hf(j, "fuzz/config.json", tp);
    const ds::ModelDims d = ds::model_dims(m);
    if (d.L < 1 || d.C < 1 || d.V < 1 || d.Vp < d.V) std::abort();
    if (d.L <= 64 && static_cast<double>(d.C) * d.Vp <= 1e8) {
      const ds::ModelLayout layout = ds::build_layout(m);
      if (layout.total < 1) std::abort();
    }
  });
}
