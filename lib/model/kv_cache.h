// The key/value cache of incremental decoding (lib/model/gpt_decode.cpp): per
// transformer layer, the keys and values of every position a sample has seen
// so far, in the model's compute dtype, on its device. With tensor
// parallelism a rank caches only its kv heads (NKVl). Scratch activations of
// the decode forward live beside it, so a model serves any number of caches.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/core/tensor.h"

namespace ds {

struct KvCache {
  int64_t B = 0, Tmax = 0;     // samples, positions per sample
  std::vector<Tensor> k, v;    // L tensors (B, Tmax, NKVl*HS)
  // Decode scratch, (re)allocated by the model for B*Tq rows; views into
  // these for smaller calls.
  int64_t work_rows = 0;
  Tensor x, h, qkv, attn, mid, fc, act, stat1, stat2;  // (N, ...) activations; (N) f32 statistics
  Tensor emb;                  // (N, P) a projected embedding's token rows (ModelDims::projects)
  Tensor last, last_norm, last_mean, last_rstd, logits_local, logits_full, logits_f32;  // per sample (B)
  Tensor last_proj;            // (B, P) project_out's output (ModelDims::projects)
  Tensor pos;                                         // (B) i32 on the device
};

// Samples [b0, b0 + n) of a cache (views sharing its storage; no scratch):
// prefill one prompt of a batch into its own rows.
KvCache kv_cache_rows(const KvCache& c, int64_t b0, int64_t n);

}  // namespace ds
