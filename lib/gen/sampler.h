// Choosing the next token from a row of logits: greedy, or sampling with
// temperature, top-k and top-p (nucleus), after a repetition penalty, in the
// order transformers' generate() applies them (penalty, temperature, top-k,
// top-p). Random draws are counter-based: the draw of step `step` of sample
// `sample` depends only on (seed, sample, step), so a fixed seed gives the
// same text whatever the batch, thread count or tensor-parallel size.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ds::gen {

struct SamplingConfig {
  bool greedy = true;            // argmax (after the penalty); the rest is ignored
  float temperature = 1.0f;      // > 0
  int top_k = 0;                 // keep the k largest (0: all)
  float top_p = 1.0f;            // keep the smallest set with probability >= p, in (0, 1]
  float repetition_penalty = 1.0f;  // > 0; CTRL's rule: logit / p if > 0 else logit * p, for seen tokens
  uint64_t seed = 1234;
};

// UserError naming the flag when a value is out of range.
void validate_sampling(const SamplingConfig& s);

// The next token of sample `sample` at generation step `step` from its
// logits (V); `seen` holds the tokens the repetition penalty applies to
// (prompt and generated so far). `logits` is used as scratch.
int32_t sample_next(std::span<float> logits, std::span<const int32_t> seen, const SamplingConfig& s,
                    uint64_t sample, uint64_t step);

}  // namespace ds::gen
