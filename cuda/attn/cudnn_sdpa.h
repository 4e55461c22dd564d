// The cudnn attention backend: causal scaled-dot-product attention forward and
// backward as cuDNN graphs (the fused flash-attention engines), built through
// cuDNN's backend API on our packed qkv layout, cached per shape, run on the
// caller's stream. cuDNN itself is loaded at run time (cudnn_api.h).
// docs/cuda.md ("cudnn") describes the graphs, the uids and the layout.
#pragma once
#include <string>

#include "cuda/attn/attention.h"

namespace ds::cuda {

// Same contract as flash_attention_*: run and return "", or return why the
// case is not supported (dtype f32, head size, alignment, attention dropout,
// a graph cuDNN has no engine for) without running anything; the dispatcher
// falls back and logs it. A cuDNN that cannot be loaded is a UserError, not a
// fallback: the user asked for this backend.
std::string cudnn_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
std::string cudnn_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);

// Builds and finalizes every tensor and operation of the forward or backward
// graph of a problem, short of the operation graph itself (which needs a
// device handle): "" or the first cuDNN error. Runs without a GPU (tests).
std::string cudnn_sdpa_check_graph(bool backward, const AttnShape& sh, DType dt);

// Number of cached forward + backward plans (tests: a second call of the same
// shape builds nothing).
size_t cudnn_sdpa_cached_plans();

}  // namespace ds::cuda
