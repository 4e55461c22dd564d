// dsgen's pieces shared by its modes (main.cpp: flags, model, the prompt
// modes; megatron_samples.cpp: Megatron-DeepSpeed's generate_samples_gpt.py modes).
#pragma once
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/data/tokenizer.h"
#include "lib/gen/generator.h"
#include "lib/gen/model_source.h"
#include "lib/gen/prompts.h"
#include "lib/model/gpt.h"

namespace dsgen {

// Megatron-DeepSpeed's tools/generate_samples_gpt.py flags (megatron_samples.cpp).
struct MegatronFlags {
  std::optional<int> num_samples;  // given: generate_samples_gpt's modes
  std::string genfile, sample_input_file, sample_output_file;
  int seq_length = 0;
  // The model's shape as the script states it, checked against the model read.
  int num_layers = 0, hidden_size = 0, num_attention_heads = 0, max_position_embeddings = 0;
  std::vector<int> num_experts;
  std::string mlp_type;
  bool use_tutel = false, ds_inference = false;
};

struct Args {
  ds::gen::ModelSource src;
  std::string tokenizer_type, tokenizer_model, vocab_file, merge_file;
  std::vector<std::string> prompts, stops;
  std::string prompt_file, output_file, device;
  int max_new_tokens = 64, batch_size = 8, tp = 1;
  bool greedy = false, ignore_eos = false, bf16 = false, fp16 = false, no_kv_cache = false, timing = false;
  ds::gen::SamplingConfig sampling;
  std::string temperature, top_p, repetition_penalty;  // as given; parsed by sampling_floats()
  bool sampling_given = false;
  MegatronFlags meg;
};

// Generated text of one sample, cut before the first stop string; `stopped`
// tells whether one was found.
inline std::string cut_at_stop(std::string text, const std::vector<std::string>& stops, bool* stopped = nullptr) {
  size_t at = std::string::npos;
  for (const auto& s : stops)
    if (!s.empty()) at = std::min(at, text.find(s));
  if (stopped) *stopped = at != std::string::npos;
  if (at != std::string::npos) text.resize(at);
  return text;
}

struct Session {
  const Args& a;
  ds::GptModel& model;
  const ds::data::Tokenizer& tok;
  ds::gen::GenOptions opt;
  bool rank0 = true;

  // The ids of prompts number first, first + 1, ...: a UserError naming the
  // prompt for one that holds a NUL byte, encodes to nothing or is too long,
  // before anything about it is printed.
  std::vector<std::vector<int32_t>> encode(const std::vector<std::string>& prompts, int64_t first) const {
    std::vector<std::vector<int32_t>> ids;
    for (const auto& p : prompts) {
      const int64_t index = first + static_cast<int64_t>(ids.size());
      ids.push_back(ds::gen::encode_prompt(tok, p, index, model.dims().maxT, model.dims().V));
    }
    return ids;
  }

  // Generates for a batch of encoded prompts; `stream` prints sample 0's text as it is produced.
  std::vector<std::string> run(std::vector<std::vector<int32_t>> ids, bool stream,
                               std::vector<ds::gen::GenResult>* results = nullptr,
                               std::vector<std::vector<int32_t>>* prompt_ids = nullptr) {
    size_t hold = 0;  // bytes held back while they might start a stop string
    for (const auto& s : a.stops) hold = std::max(hold, s.empty() ? 0 : s.size() - 1);
    std::vector<std::vector<int32_t>> gen(ids.size());
    size_t printed = 0;
    auto on_token = [&](int64_t b, int32_t t) {
      gen[b].push_back(t);
      bool stopped = false;
      std::string text = a.stops.empty() && !stream ? std::string() : cut_at_stop(tok.decode(gen[b]), a.stops, &stopped);
      if (stream && rank0 && b == 0) {
        const size_t ready = stopped ? text.size() : (text.size() > hold ? text.size() - hold : 0);
        if (ready > printed) {
          std::fwrite(text.data() + printed, 1, ready - printed, stdout);
          std::fflush(stdout);
          printed = ready;
        }
      }
      return stopped;
    };
    ds::gen::GenStats st;
    auto res = ds::gen::generate(model, ids, opt, on_token, &st);
    std::vector<std::string> texts;
    for (size_t b = 0; b < res.size(); ++b) texts.push_back(cut_at_stop(tok.decode(res[b].tokens), a.stops));
    if (stream && rank0 && texts[0].size() > printed) std::fwrite(texts[0].data() + printed, 1, texts[0].size() - printed, stdout);
    if (a.timing && rank0)
      std::fprintf(stderr, "dsgen: prefill %lld tokens in %.3f s (%.1f tokens/s), decode %lld tokens in %.3f s "
                   "(%.1f tokens/s)\n", static_cast<long long>(st.prefill_tokens), st.prefill_s,
                   st.prefill_tokens / std::max(st.prefill_s, 1e-9), static_cast<long long>(st.decode_tokens),
                   st.decode_s, st.decode_tokens / std::max(st.decode_s, 1e-9));
    if (results) *results = std::move(res);
    if (prompt_ids) *prompt_ids = std::move(ids);
    return texts;
  }
};

// Rank 0's string on every rank of `c` (stdin prompts under tensor parallelism).
std::string broadcast_text(ds::Communicator* c, std::string s, ds::Device dev);
// One JSON line (invalid UTF-8 written as U+FFFD).
std::string json_line(const nlohmann::json& r);
// Writes JSON lines to `path` atomically (temporary name, then rename), or
// to stdout when it is empty; `flag` names the path in errors.
void write_jsonl(const std::string& path, const std::vector<nlohmann::json>& rows, const char* flag);
// Checks the Megatron shape flags against the model; then runs
// generate_samples_gpt's mode (unconditional samples to --genfile, prompts of
// --sample-input-file, or the interactive prompt on stdin). Returns the exit code.
void check_megatron_shape(const MegatronFlags& m, const ds::ModelConfig& model);
int run_megatron_samples(const Args& a, Session& s, ds::Communicator* world, ds::Device dev);

}  // namespace dsgen
