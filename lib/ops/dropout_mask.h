// Dropout masks from a counter-based hash. Whether one element of one dropout
// site is kept is a pure function of its key (seed, iteration, layer, site,
// global sample, global position, global channel, or global head + query/key
// positions): there is no generator state, so the CPU and CUDA backends, every
// parallel layout (each rank hashes the global indices of what it holds) and
// activation recomputation all draw the same mask. One header for host and
// device code; docs/dropout.md describes the key.
#pragma once
#include <cstdint>

#include "lib/ops/host_device.h"

namespace ds {

// The places Megatron applies dropout: the embedding output, the attention
// probabilities, and the attention and MLP outputs before their residual add.
enum class DropoutSite : uint32_t { Embedding = 1, AttentionProbs = 2, AttentionOut = 3, MlpOut = 4 };

// What a dropout op (or the attention ops) needs besides its tensors.
// p == 0 turns it off. The offsets turn the tensor's local indices into global
// ones: batch row b is sample sample0 + b, sequence row t is position pos0 + t
// (a sequence-parallel shard starts at tp_rank * T/TP), local head h is head
// head0 + h (a tensor-parallel rank holds heads from tp_rank * NH/TP).
//
// The per-step part of the key may instead live in the op's memory, so that a
// captured CUDA graph replays the same arguments every step: step_key points
// to {iteration, first sample} (i64, on the op's device) and the op computes
// stream = dropout_stream(seed, iteration, layer, site) and adds the first
// sample to sample0 (dropout_resolve). Callers never set the pointer: the op
// layer fills it from the args' `dropout_key` tensor (lib/ops/op_args.h).
struct DropoutSpec {
  float p = 0.f;         // drop probability in [0, 1)
  uint64_t stream = 0;   // dropout_stream(seed, iteration, layer, site); unused with step_key
  int64_t sample0 = 0;   // global sample index of batch row 0 (with step_key: relative to the first sample)
  int64_t pos0 = 0;      // global position of sequence row 0 (hidden dropout)
  int64_t head0 = 0;     // global head of local head 0 (attention dropout)
  // With step_key only:
  const int64_t* step_key = nullptr;  // (2) {iteration, first sample}, or null: the fields above are the key
  uint64_t seed = 0;
  int64_t layer = 0;                  // global layer, -1 for the embedding
  DropoutSite site = DropoutSite::Embedding;
};

// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
DS_HOST_DEVICE uint64_t dropout_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The key of one site of one training iteration. layer: global layer index
// (-1 for the embedding).
DS_HOST_DEVICE uint64_t dropout_stream(uint64_t seed, int64_t iteration, int64_t layer, DropoutSite site) {
  uint64_t h = dropout_mix(seed ^ 0x64726f706f7574ull);  // "dropout"
  h = dropout_mix(h ^ static_cast<uint64_t>(iteration));
  h = dropout_mix(h ^ static_cast<uint64_t>(layer));
  return dropout_mix(h ^ static_cast<uint64_t>(site));
}

// The spec with the per-step key read in: the stream and sample0 of the
// by-value spec for the same (seed, iteration, layer, site, first sample), and
// no step_key. A spec without step_key is returned as it is.
DS_HOST_DEVICE DropoutSpec dropout_resolve(DropoutSpec d) {
  if (d.step_key != nullptr) {
    d.stream = dropout_stream(d.seed, d.step_key[0], d.layer, d.site);
    d.sample0 += d.step_key[1];
    d.step_key = nullptr;
  }
  return d;
}

// Row key of hidden dropout: (global sample, global position); the column is
// the channel.
DS_HOST_DEVICE uint64_t dropout_hidden_row(uint64_t stream, int64_t sample, int64_t pos) {
  return dropout_mix(dropout_mix(stream ^ static_cast<uint64_t>(sample)) ^ static_cast<uint64_t>(pos));
}

// Row key of attention dropout: (global sample, global head, query position);
// the column is the key position. A kernel that walks many queries of one
// head may keep the head's key and finish each row with dropout_attn_query.
DS_HOST_DEVICE uint64_t dropout_attn_head(uint64_t stream, int64_t sample, int64_t head) {
  return dropout_mix(dropout_mix(stream ^ static_cast<uint64_t>(sample)) ^ static_cast<uint64_t>(head));
}
DS_HOST_DEVICE uint64_t dropout_attn_query(uint64_t head_key, int64_t query) {
  return dropout_mix(head_key ^ static_cast<uint64_t>(query));
}
DS_HOST_DEVICE uint64_t dropout_attn_row(uint64_t stream, int64_t sample, int64_t head, int64_t query) {
  return dropout_attn_query(dropout_attn_head(stream, sample, head), query);
}

// Elements whose 32-bit draw is below this are dropped: P(drop) = p to 2^-32.
DS_HOST_DEVICE uint32_t dropout_threshold(float p) {
  return static_cast<uint32_t>(static_cast<double>(p) * 4294967296.0);
}

// Inverted dropout: a kept element is multiplied by this.
DS_HOST_DEVICE float dropout_scale(float p) { return 1.0f / (1.0f - p); }

DS_HOST_DEVICE bool dropout_keep(uint64_t row, int64_t col, uint32_t threshold) {
  return static_cast<uint32_t>(dropout_mix(row ^ static_cast<uint64_t>(col)) >> 32) >= threshold;
}

// The factor of one element: 0 or 1/(1-p).
DS_HOST_DEVICE float dropout_factor(uint64_t row, int64_t col, uint32_t threshold, float scale) {
  return dropout_keep(row, col, threshold) ? scale : 0.f;
}

}  // namespace ds
