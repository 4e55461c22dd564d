// Megatron-DeepSpeed's tools/generate_samples_gpt.py in dsgen (docs/dsgen.md,
// "Megatron's generate_samples_gpt.py"): with --num-samples N > 0, N samples
// generated from the end-of-document token alone, in batches of
// --micro-batch-size, as JSON lines to --genfile; with --num-samples 0, the
// prompts of --sample-input-file (one per line) to --sample-output-file, or
// without it the interactive prompt on stdin ("stop" ends it). As upstream
// (megatron/text_generation_utils.py): sampling unless --greedy (temperature,
// then top-k, then top-p; 0 turns either off), a prompt of half the sequence
// length or more is refused, and a sample runs to the end-of-document token or
// for min(--out-seq-length, seq_length - 1 - prompt length) + 1 tokens.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/dsgen/dsgen.h"
#include "lib/core/error.h"
#include "lib/core/log.h"

namespace dsgen {

using nlohmann::json;

void check_megatron_shape(const MegatronFlags& m, const ds::ModelConfig& model) {
  auto same = [](const char* flag, int given, int ours, const char* key) {
    DS_USER_CHECK(given == 0 || given == ours, "{} {} disagrees with the model read (its {} is {}): dsgen takes the "
                  "model's shape from the checkpoint", flag, given, key, ours);
  };
  same("--num-layers", m.num_layers, model.num_layers, "num_layers");
  same("--hidden-size", m.hidden_size, model.hidden_size, "hidden_size");
  same("--num-attention-heads", m.num_attention_heads, model.num_heads, "num_heads");
  same("--max-position-embeddings", m.max_position_embeddings, model.max_position_embeddings,
       "max_position_embeddings");
  if (!m.num_experts.empty()) {
    const bool dense_flag = m.num_experts.size() == 1 && m.num_experts[0] == 1;  // Megatron: no MoE layer
    const bool dense_model = !model.moe.enabled(model.num_layers);
    DS_USER_CHECK(dense_flag ? dense_model : m.num_experts == model.moe.num_experts,
                  "--num-experts disagrees with the model read ({}): dsgen takes the model's shape from the "
                  "checkpoint", dense_model ? "no MoE layers" : "another expert count");
  }
  if (!m.mlp_type.empty())
    DS_USER_CHECK(m.mlp_type == "standard" || m.mlp_type == "residual",
                  "--mlp-type {}: expected standard or residual", m.mlp_type);
  if (m.mlp_type == "residual")
    DS_USER_CHECK(model.moe.residual, "--mlp-type residual, but the model read has no PR-MoE layers");
}

namespace {

struct Megatron {
  const Args& a;
  Session& s;
  ds::Communicator* world;
  ds::Device dev;
  int64_t seq_length = 0;
  int32_t eod = 0;
  int64_t prompts_ = 0;  // prompts generated so far (the sampler's prompt index)

  // Upstream's maxlen: tokens are generated at positions ctx .. min(seq - 1, ctx + out).
  int new_tokens(int64_t ctx) const {
    const int64_t out = a.max_new_tokens;
    return static_cast<int>(std::min(out, seq_length - 1 - ctx) + 1);
  }

  // The generated text of one prompt (end-of-document token excluded).
  std::string generate_one(std::vector<int32_t> ids) {
    s.opt.max_new_tokens = new_tokens(static_cast<int64_t>(ids.size()));
    s.opt.first_prompt = prompts_++;
    return s.run({std::move(ids)}, false)[0];
  }

  // A prompt upstream takes: not empty of tokens and shorter than half the sequence.
  bool fits(const std::string& raw, std::vector<int32_t>* ids) const {
    *ids = s.tok.encode(raw);
    if (static_cast<int64_t>(ids->size()) >= seq_length / 2) {
      if (s.rank0)
        std::printf("\nContext length %zu \nPlease give smaller context (half of the sequence length)!\n",
                    ids->size());
      std::fflush(stdout);
      return false;
    }
    return !ids->empty();
  }

  int unconditional() {
    const int n = *a.meg.num_samples;
    DS_USER_CHECK(!a.meg.genfile.empty(), "--num-samples {} writes its samples to --genfile, which is not given "
                  "(generate_samples_gpt.py asserts it too)", n);
    const int batch = a.batch_size;  // --micro-batch-size
    std::vector<json> rows;
    s.opt.max_new_tokens = new_tokens(1);
    for (int done = 0; done < n; done += batch) {
      const int b = std::min(batch, n - done);
      s.opt.first_prompt = done;
      std::vector<ds::gen::GenResult> res;
      std::vector<std::string> texts = s.run(std::vector<std::vector<int32_t>>(static_cast<size_t>(b), {eod}), false,
                                             &res);
      for (size_t i = 0; i < res.size(); ++i)
        rows.push_back({{"text", texts[i]},
                        {"length", res[i].tokens.size()},
                        {"finished", res[i].reason == ds::gen::StopReason::EndOfDocument}});
    }
    if (!s.rank0) return 0;
    write_jsonl(a.meg.genfile, rows, "--genfile");
    std::printf("dsgen: %d samples written to %s\n", n, a.meg.genfile.c_str());
    return 0;
  }

  // Each line of the file (with its newline, as Python's readlines gives it)
  // is a prompt until one contains "stop".
  int from_file() {
    const std::string out_path =
        a.meg.sample_output_file.empty() ? a.meg.sample_input_file + ".out" : a.meg.sample_output_file;
    std::string content;
    if (s.rank0) {
      std::ifstream in(a.meg.sample_input_file, std::ios::binary);
      DS_USER_CHECK(in.good(), "--sample-input-file {}: cannot read it", a.meg.sample_input_file);
      std::stringstream ss;
      ss << in.rdbuf();
      content = ss.str();
      if (a.meg.sample_output_file.empty())
        std::printf("`sample-output-file` not specified, setting it to %s\n", out_path.c_str());
    }
    content = broadcast_text(world, content, dev);
    std::ofstream out;
    if (s.rank0) {
      out.open(out_path, std::ios::binary);
      DS_USER_CHECK(out.good(), "--sample-output-file {}: cannot write it", out_path);
    }
    size_t pos = 0;
    while (pos < content.size()) {
      const size_t nl = content.find('\n', pos);
      const size_t end = nl == std::string::npos ? content.size() : nl + 1;
      const std::string raw = content.substr(pos, end - pos);
      pos = end;
      if (raw.find("stop") != std::string::npos) break;
      std::vector<int32_t> ids;
      if (!fits(raw, &ids)) continue;
      const std::string text = generate_one(std::move(ids));
      if (!s.rank0) continue;
      std::printf("\nContext: %s\n\nMegatron-LM: %s\n", raw.c_str(), text.c_str());
      out << "\nContext:" << raw << "\n\nMegatron-LM:" << text << "\n";
    }
    DS_USER_CHECK(!s.rank0 || out.flush().good(), "--sample-output-file {}: write failed (disk full?)", out_path);
    return 0;
  }

  // Rank 0 reads a line of stdin; every rank gets it (nullopt at its end).
  std::optional<std::string> read_line(const char* prompt) {
    std::string line;
    bool ok = false;
    if (s.rank0) {
      std::printf("%s", prompt);
      std::fflush(stdout);
      ok = static_cast<bool>(std::getline(std::cin, line));
    }
    const std::string msg = broadcast_text(world, ok ? "1" + line : "0", dev);
    if (msg[0] == '0') return std::nullopt;
    return msg.substr(1);
  }

  int interactive() {
    for (;;) {
      std::optional<std::string> raw = read_line("\nContext prompt (stop to exit) >>> ");
      while (raw && raw->empty()) {
        if (s.rank0) std::printf("Prompt should not be empty!\n");
        raw = read_line("\nContext prompt (stop to exit) >>> ");
      }
      if (!raw || raw->find("stop") != std::string::npos) return 0;
      std::vector<int32_t> ids;
      if (!fits(*raw, &ids)) continue;
      const std::string text = generate_one(std::move(ids));
      if (s.rank0) std::printf("\nContext: %s\n\nMegatron-LM: %s\n", raw->c_str(), text.c_str());
      if (!read_line("\nPress Enter to continue >>>")) return 0;
    }
  }
};

}  // namespace

int run_megatron_samples(const Args& a, Session& s, ds::Communicator* world, ds::Device dev) {
  const int n = *a.meg.num_samples;
  DS_USER_CHECK(n >= 0, "--num-samples {} must be >= 0 (0: prompts from --sample-input-file or stdin)", n);
  DS_USER_CHECK(a.prompts.empty() && a.prompt_file.empty(), "--num-samples selects generate_samples_gpt.py's modes; "
                "give prompts with --sample-input-file or on stdin, not --prompt / --prompt-file");
  Megatron m{a, s, world, dev};
  m.seq_length = a.meg.seq_length > 0 ? a.meg.seq_length : s.model.dims().maxT;
  DS_USER_CHECK(m.seq_length >= 2 && m.seq_length <= s.model.dims().maxT,
                "--seq-length {}: generation needs 2 to the model's {} positions", m.seq_length, s.model.dims().maxT);
  DS_USER_CHECK(a.max_new_tokens >= 0, "--out-seq-length {} must be >= 0", a.max_new_tokens);
  m.eod = s.tok.info().eod_id >= 0 ? s.tok.info().eod_id : s.tok.info().eos_id;
  DS_USER_CHECK(m.eod >= 0, "the tokenizer has no end-of-document token, which generate_samples_gpt.py starts and "
                "stops samples with");
  if (s.rank0 && (a.meg.use_tutel || a.meg.ds_inference))
    std::fprintf(stderr, "dsgen: warning: %s only choose%s kernels upstream; dsgen runs its own\n",
                 a.meg.use_tutel && a.meg.ds_inference ? "--use-tutel and --ds-inference"
                 : a.meg.use_tutel                     ? "--use-tutel"
                                                       : "--ds-inference",
                 a.meg.use_tutel && a.meg.ds_inference ? "" : "s");
  if (n > 0) return m.unconditional();
  if (!a.meg.sample_input_file.empty()) return m.from_file();
  return m.interactive();
}

}  // namespace dsgen
