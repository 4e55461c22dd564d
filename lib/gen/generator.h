// Batched token generation with a key/value cache: every prompt is prefilled
// into its own rows of one cache (prompts may differ in length), then the
// batch advances one token per step, each sample at its own position, until
// every sample has stopped (end-of-document, a stop condition the caller
// reports, the token budget, or the model's context). Without the cache
// (use_kv_cache false) each step recomputes the whole prefix through the
// training forward: the reference the cache is checked against.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "lib/gen/sampler.h"
#include "lib/model/gpt.h"

namespace ds::gen {

enum class StopReason { Length, EndOfDocument, StopString, Context };
const char* stop_reason_name(StopReason r);  // "length" | "eod" | "stop" | "context"

struct GenOptions {
  int max_new_tokens = 64;
  SamplingConfig sampling;
  std::vector<int32_t> stop_ids;  // tokens that end a sample (end-of-document); not part of its output
  bool use_kv_cache = true;
  // Ids >= this are never generated (the tokenizer's vocabulary, when the
  // model's is larger, as Pythia's and Qwen2's are): their logits are cut off
  // as the padded vocabulary rows are. 0: the model's whole vocabulary.
  int64_t vocab_limit = 0;
  // When set, the batch stops only when this returns true for every rank
  // (given whether this rank's samples are all done): a rank that is done
  // keeps running the decode steps (on its finished rows, whose output is
  // dropped) while another is not, so that every rank takes part in the
  // same collectives (a ZeRO-3 gather per step; transformers' synced_gpus).
  std::function<bool(bool local_done)> synced;
  // The run-wide index of prompts[0]: prompt b draws its tokens as prompt
  // first_prompt + b (the sampler's key), so that a run split into calls
  // draws what one call would.
  int64_t first_prompt = 0;
};

struct GenResult {
  std::vector<int32_t> tokens;  // generated ids (without the prompt, without a stop id)
  StopReason reason = StopReason::Length;
};

// Called on every generated token (not stop ids) of sample `b`, in order; the
// caller streams text and returns true to stop that sample (a stop string).
using TokenCallback = std::function<bool(int64_t b, int32_t token)>;

// Timing of the last generate() call, for the benchmark.
struct GenStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;
};

// Generates for every prompt (each passing check_prompt(), lib/gen/prompts.h). Logits that are not finite (NaN or inf: weights holding them, an
// fp16 overflow) are a UserError naming the prompt and step. Collective with tensor parallelism: every tp rank calls it with
// the same prompts and options and gets the same tokens.
std::vector<GenResult> generate(GptModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                const GenOptions& opt, const TokenCallback& on_token = {}, GenStats* stats = nullptr);

}  // namespace ds::gen
