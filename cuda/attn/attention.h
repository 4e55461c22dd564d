// Internal interface between the attention dispatcher (attention.cu) and the
// implementations: the plain reference kernels and the fused flash kernels.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "lib/core/stream.h"
#include "lib/ops/op_args.h"

namespace ds::cuda {

struct AttnShape {
  int64_t B = 0, T = 0;
  int NH = 0, HS = 0;
  int NKV = 0;  // kv heads (grouped-query attention; NH otherwise)
};

void plain_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
void plain_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);

// Launch the fused kernels and return "" , or return why the case is not
// supported (dtype f32, head size other than 64/128, alignment, grid limits,
// shared memory) without running anything; the caller falls back and logs it.
std::string flash_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
std::string flash_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);
// The second generation (flash2_fwd.cu, flash2_bwd.cu): register-resident
// mma.sync kernels with cp.async double buffering; same contract and the
// same support conditions as flash_attention_* (opt-in until verified on a
// device: AttentionBackend::Flash2).
std::string flash2_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s);
std::string flash2_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s);
// The common support checks of both directions ("" when supported).
std::string flash_unsupported(const AttnShape& sh, DType dt, std::initializer_list<const Tensor*> ptrs);

}  // namespace ds::cuda
