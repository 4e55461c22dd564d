// Shared by the interop probes: weights that exercise every mapping.
#pragma once
#include "lib/model/gpt.h"

namespace ds::test {

// Norm weights and biases away from their ones / zeros init, so that a
// mapping that drops or swaps them shows in the loss.
inline void vary_norms_and_biases(GptModel& model) {
  for (const ParamSpec& p : model.layout().params) {
    if (p.init != InitKind::Ones && p.init != InitKind::Zeros) continue;
    float* w = model.params().data<float>() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) w[i] += 0.05f * static_cast<float>((i * 37 + p.offset) % 11) - 0.25f;
  }
}

}  // namespace ds::test
