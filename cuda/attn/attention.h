// Internal interface between the attention dispatcher (attention.cu) and the
// implementations: the plain reference kernels and the fused flash kernels.
#pragma once
#include <cstdint>

#include "lib/core/stream.h"
#include "lib/ops/op_args.h"

namespace ds::cuda {

struct AttnShape {
  int64_t B = 0, T = 0;
  int NH = 0, HS = 0;
};

void plain_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
void plain_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);

// Return false (running nothing) when the case is not supported by the fused
// kernels (dtype f32, head size other than 64/128); the caller falls back.
bool flash_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
bool flash_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);

}  // namespace ds::cuda
