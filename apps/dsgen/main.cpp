// dsgen: text generation from a dstrain checkpoint or a Hugging Face model.
//   dsgen --load CKPT_DIR [--tag global_stepN] --prompt "Once upon a time" [--prompt ...]
//   dsgen --init-from HF_DIR --vocab-file V --merge-file M --prompt-file prompts.jsonl --output-file out.jsonl
//   dsgen --load CKPT_DIR                       (no prompt flags: one prompt per stdin line, streamed)
//   dsrun --include localhost:0,1 dsgen --load CKPT_DIR --tensor-model-parallel-size 2 --prompt ...
// Greedy by default; --temperature / --top-k / --top-p sample (seeded by --seed).
// Only rank 0 prints. User errors print one line naming the input and exit 1;
// an --output-file is written to a temporary name and renamed when complete.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "lib/comm/communicator.h"
#include "lib/core/decimal.h"
#include "lib/core/device_runtime.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"
#include "lib/data/tokenizer.h"
#include "lib/gen/generator.h"
#include "lib/gen/model_source.h"
#include "lib/gen/prompts.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/rank_grid.h"
#include "apps/dsgen/dsgen.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dsgen {

// Rank 0's string on every rank of `c` (stdin prompts under tensor parallelism).
std::string broadcast_text(ds::Communicator* c, std::string s, ds::Device dev) {
  if (!c || c->size() == 1) return s;
  ds::Tensor n = ds::Tensor::zeros({1}, ds::DType::I64);
  n.data<int64_t>()[0] = static_cast<int64_t>(s.size());
  ds::Tensor nd = dev.is_cpu() ? n : n.to(dev);
  c->broadcast(nd.raw(), 1, ds::DType::I64, 0);
  const int64_t len = (dev.is_cpu() ? nd : nd.to(ds::Device::cpu())).data<int64_t>()[0];
  s.resize(static_cast<size_t>(len));
  if (len == 0) return s;
  ds::Tensor b = ds::Tensor::empty({len}, ds::DType::U8);
  std::memcpy(b.raw(), s.data(), s.size());
  ds::Tensor bd = dev.is_cpu() ? b : b.to(dev);
  c->broadcast(bd.raw(), len, ds::DType::U8, 0);
  ds::Tensor h = dev.is_cpu() ? bd : bd.to(ds::Device::cpu());
  std::memcpy(s.data(), h.raw(), static_cast<size_t>(len));
  return s;
}

// One JSON line. Sampled text may end inside a UTF-8 sequence (byte-level
// BPE): such bytes are written as U+FFFD; the ids are in "tokens".
std::string json_line(const json& r) { return r.dump(-1, ' ', false, json::error_handler_t::replace); }

// Writes JSON lines to `path` atomically (temporary name, then rename), or to stdout.
void write_jsonl(const std::string& path, const std::vector<json>& rows, const char* flag) {
  if (path.empty()) {
    for (const auto& r : rows) std::printf("%s\n", json_line(r).c_str());
    return;
  }
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp);
    DS_USER_CHECK(f.good(), "{} {}: cannot write it", flag, path);
    for (const auto& r : rows) f << json_line(r) << "\n";
    f.flush();
    if (!f.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      DS_USER_ERROR("{} {}: write failed (disk full?)", flag, path);
    }
  }
  fs::rename(tmp, path);
}

}  // namespace dsgen

namespace {

using namespace dsgen;

// The float sampling flags, from their text: plain decimals within float range
// (1e300 would be inf), so that an error echoes the value as given.
void sampling_floats(const Args& a, ds::gen::SamplingConfig& s) {
  auto one = [](const char* flag, const std::string& text, float& out) {
    if (text.empty()) return;
    const std::optional<double> v = ds::parse_decimal(text);
    const bool in_range = v && std::fabs(*v) <= std::numeric_limits<float>::max() &&
                          (*v == 0 || std::fabs(*v) >= std::numeric_limits<float>::min());
    DS_USER_CHECK(in_range, "{} '{}' is not a decimal number within float range (magnitude {:g} to {:g}, or 0)", flag,
                  text, std::numeric_limits<float>::min(), std::numeric_limits<float>::max());
    out = static_cast<float>(*v);
  };
  one("--temperature", a.temperature, s.temperature);
  one("--top-p", a.top_p, s.top_p);
  one("--repetition-penalty", a.repetition_penalty, s.repetition_penalty);
}

// The tokenizer: flags first, else what the checkpoint / HF directory names.
std::unique_ptr<ds::data::Tokenizer> make_tokenizer(const Args& a, const ds::gen::LoadedModel& m) {
  ds::data::TokenizerSpec spec = m.tokenizer;
  if (!a.tokenizer_type.empty() || !a.tokenizer_model.empty() || !a.vocab_file.empty()) {
    spec = {};
    spec.kind = !a.tokenizer_type.empty() ? ds::data::parse_tokenizer_kind(a.tokenizer_type)
                : !a.vocab_file.empty()   ? ds::data::TokenizerKind::GPT2BPE
                                          : ds::data::TokenizerKind::HF;
    spec.model_path = a.tokenizer_model;
    spec.vocab_file = a.vocab_file;
    spec.merge_file = a.merge_file;
  } else {
    ds::gen::check_model_tokenizer(m);
  }
  auto tok = ds::data::load_tokenizer(spec);
  DS_USER_CHECK(tok->info().vocab_size <= m.model.vocab_size, "the tokenizer has {} ids but the model only {}: "
                "not the tokenizer it was trained with", tok->info().vocab_size, m.model.vocab_size);
  return tok;
}



// Interactive mode: one prompt per stdin line, streamed. A prompt that cannot
// be generated for (a NUL byte, too long for the context, no tokens) is one
// error line naming its line, not echoed, and the next line is read; the exit
// code is 1 when any prompt failed.
int run_stdin(Session& s, ds::Communicator* world, ds::Device dev) {
  const bool rank0 = s.rank0;
  const bool tty = rank0 && ::isatty(0);
  int64_t line_no = 0, failed = 0;
  for (;;) {
    if (tty) std::fprintf(stderr, "prompt> ");
    std::string line;
    bool ok = rank0 && static_cast<bool>(std::getline(std::cin, line));
    std::string msg = broadcast_text(world, ok ? "1" + line : "0", dev);
    if (msg[0] == '0') break;
    ++line_no;
    line = msg.substr(1);
    if (line.empty()) continue;
    std::vector<std::vector<int32_t>> ids;
    try {
      ids = s.encode({line}, line_no);
    } catch (const ds::UserError& e) {  // every rank sees the same line and skips it
      ++failed;
      if (rank0) std::fprintf(stderr, "dsgen: error: stdin line %lld: %s; skipped\n", static_cast<long long>(line_no),
                              e.what());
      continue;
    }
    if (rank0) std::fwrite(line.data(), 1, line.size(), stdout);
    s.opt.first_prompt = line_no - 1;
    s.run(std::move(ids), true);
    if (rank0) std::printf("\n");
    std::fflush(stdout);
  }
  if (failed > 0 && rank0)
    std::fprintf(stderr, "dsgen: %lld stdin prompt%s failed (see above)\n", static_cast<long long>(failed),
                 failed == 1 ? "" : "s");
  return failed > 0 ? 1 : 0;
}

int run(const Args& a) {
  DS_USER_CHECK(a.max_new_tokens >= 0, "--max-new-tokens {} must be >= 0", a.max_new_tokens);
  DS_USER_CHECK(a.batch_size >= 1, "--batch-size {} must be >= 1", a.batch_size);
  DS_USER_CHECK(!(a.bf16 && a.fp16), "--bf16 and --fp16 exclude each other");
  DS_USER_CHECK(a.prompts.empty() || a.prompt_file.empty(), "give --prompt or --prompt-file, not both");
  ds::gen::SamplingConfig sampling = a.sampling;
  sampling_floats(a, sampling);
  ds::RendezvousInfo rv = ds::RendezvousInfo::from_env();
  DS_USER_CHECK(a.tp >= 1 && rv.world_size == a.tp, "--tensor-model-parallel-size {}: dsgen runs one model "
                "replica, so the job must have exactly that many processes (it has {}; launch with dsrun)", a.tp,
                rv.world_size);
  ds::gen::LoadedModel lm = ds::gen::load_model(a.src, a.tp);  // before anything else: the errors a user makes
  check_megatron_shape(a.meg, lm.model);
  auto tok = make_tokenizer(a, lm);
  const std::string device = a.device.empty() ? lm.device : a.device;
  DS_USER_CHECK(device == "cpu" || device == "cuda", "--device {}: expected cpu or cuda", device);
  ds::Device dev = ds::Device::cpu();
  if (device == "cuda") {
    ds::DeviceRuntime& rt = ds::device_runtime(ds::DeviceType::CUDA);
    DS_USER_CHECK(rt.available(), "--device cuda: {}", rt.unavailable_reason());
    rt.init_device(rv.local_rank % rt.device_count());
    dev = ds::Device::cuda(rv.local_rank % rt.device_count());
  }
  auto world = ds::make_world_communicator(dev.is_cuda() ? ds::Backend::Nccl : ds::Backend::Gloo, rv);
  ds::RankGrid grid = ds::make_rank_grid(rv.world_size, a.tp, 1, rv.rank);
  ds::Comms comms = ds::build_comms(*world, grid);
  ds::TpComm tp{.comm = a.tp > 1 ? comms.tp : nullptr, .size = a.tp, .rank = a.tp > 1 ? comms.tp->rank() : 0};
  const ds::DType compute = a.bf16 ? ds::DType::BF16 : a.fp16 ? ds::DType::F16 : ds::DType::F32;
  ds::GptModel model(lm.model, dev, 0, tp, {}, compute);
  {
    ds::Tensor local = lm.params;
    if (tp.active()) {
      local = ds::Tensor::empty({model.layout().total}, ds::DType::F32);
      ds::slice_tp_params(model.layout(), lm.full, lm.params, local);
    }
    model.store().set_full_params(local);
    lm.params = ds::Tensor();
  }
  Session s{a, model, *tok, {}, rv.rank == 0};
  s.opt.max_new_tokens = a.max_new_tokens;
  s.opt.sampling = sampling;
  // generate_samples_gpt.py samples unless --greedy; its top-p 0 is no limit.
  s.opt.sampling.greedy = a.greedy || (!a.sampling_given && !a.meg.num_samples);
  if (a.meg.num_samples && s.opt.sampling.top_p == 0.f) s.opt.sampling.top_p = 1.f;
  s.opt.use_kv_cache = !a.no_kv_cache;
  s.opt.vocab_limit = tok->info().vocab_size;
  if (rv.rank == 0 && tok->info().vocab_size < lm.model.vocab_size)
    std::fprintf(stderr, "dsgen: the model's vocabulary has %d ids, the tokenizer's %lld; ids %lld and up are "
                 "never generated\n", lm.model.vocab_size, static_cast<long long>(tok->info().vocab_size),
                 static_cast<long long>(tok->info().vocab_size));
  ds::gen::validate_sampling(s.opt.sampling);
  if (!a.ignore_eos) {
    for (int32_t id : {tok->info().eod_id, tok->info().eos_id, static_cast<int32_t>(lm.eos_id)})
      if (id >= 0 && std::find(s.opt.stop_ids.begin(), s.opt.stop_ids.end(), id) == s.opt.stop_ids.end())
        s.opt.stop_ids.push_back(id);
  }
  if (a.meg.num_samples) return run_megatron_samples(a, s, comms.world, dev);
  if (a.prompts.empty() && a.prompt_file.empty()) return run_stdin(s, comms.world, dev);
  const bool jsonl = !a.prompt_file.empty();
  const std::vector<std::string> prompts = jsonl ? ds::gen::read_prompt_file(a.prompt_file) : a.prompts;
  std::vector<json> rows;
  for (size_t b0 = 0; b0 < prompts.size(); b0 += static_cast<size_t>(a.batch_size)) {
    std::vector<std::string> batch(prompts.begin() + b0,
                                   prompts.begin() + std::min(prompts.size(), b0 + static_cast<size_t>(a.batch_size)));
    std::vector<ds::gen::GenResult> res;
    std::vector<std::vector<int32_t>> ids;
    const bool stream = batch.size() == 1 && !jsonl;
    std::vector<std::vector<int32_t>> encoded = s.encode(batch, static_cast<int64_t>(b0) + 1);
    s.opt.first_prompt = static_cast<int64_t>(b0);
    if (stream && rv.rank == 0) std::fwrite(batch[0].data(), 1, batch[0].size(), stdout);
    auto texts = s.run(std::move(encoded), stream, &res, &ids);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (jsonl) {
        rows.push_back({{"prompt", batch[i]}, {"text", texts[i]}, {"tokens", res[i].tokens}, {"prompt_tokens", ids[i]},
                        {"stop_reason", ds::gen::stop_reason_name(res[i].reason)}});
      } else if (rv.rank == 0) {
        if (!stream) std::printf("%s%s", batch[i].c_str(), texts[i].c_str());  // no NUL: encode() refused it
        std::printf("\n");
        if (b0 + i + 1 < prompts.size()) std::printf("----\n");
      }
    }
    std::fflush(stdout);
  }
  if (jsonl && rv.rank == 0) write_jsonl(a.output_file, rows, "--output-file");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsgen: generate text with a dstrain checkpoint or a Hugging Face GPT-2 / LLaMA model"};
  Args a;
  auto* load = app.add_option("--load", a.src.load, "Checkpoint directory (holds 'latest' and global_stepN/)");
  app.add_option("--tag", a.src.tag, "Step directory to read (default: the one 'latest' names)")->needs(load);
  auto* hf = app.add_option("--init-from", a.src.init_from, "Hugging Face directory (config.json + model.safetensors or pytorch_model.bin)");
  load->excludes(hf);
  app.add_option("--tokenizer-type", a.tokenizer_type, "GPT2BPETokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
                 "SentencePieceTokenizer, HFTokenizer (default: the checkpoint's)");
  app.add_option("--tokenizer-model", a.tokenizer_model, "tokenizer.model, tokenizer.json or a directory holding one");
  app.add_option("--vocab-file", a.vocab_file, "GPT-2 vocab.json");
  app.add_option("--merge-file", a.merge_file, "GPT-2 merges.txt");
  app.add_option("--prompt", a.prompts, "A prompt (repeat for a batch)")->expected(1)->take_all();
  app.add_option("--prompt-file", a.prompt_file, "JSONL file, one {\"prompt\": ...} per line; writes JSONL results");
  app.add_option("--output-file", a.output_file, "Where --prompt-file results go (default: stdout)");
  app.add_option("--max-new-tokens,--out-seq-length", a.max_new_tokens, "Tokens to generate per prompt (default 64; "
                 "with --num-samples see docs/dsgen.md)");
  app.add_option("--batch-size,--micro-batch-size", a.batch_size, "Prompts generated together (default 8)");
  app.add_flag("--greedy", a.greedy, "Argmax decoding (the default unless a sampling flag is given)");
  auto* temp = app.add_option("--temperature", a.temperature, "Sampling temperature (> 0)");
  auto* topk = app.add_option("--top-k,--top_k", a.sampling.top_k, "Sample from the k most likely tokens (0: all)");
  auto* topp = app.add_option("--top-p,--top_p", a.top_p, "Nucleus sampling threshold in (0, 1] (with --num-samples "
                              "0 is no limit, as Megatron's)");
  app.add_option("--repetition-penalty", a.repetition_penalty, "Penalty > 1 discourages repeats (1: none)");
  app.add_option("--seed", a.sampling.seed, "Sampling seed (default 1234)");
  app.add_option("--stop", a.stops, "Stop a sample when its text contains this string (repeatable)")
      ->expected(1)->take_all();
  app.add_flag("--ignore-eos", a.ignore_eos, "Do not stop at the end-of-document token");
  app.add_option("--device", a.device, "cpu or cuda (default: the checkpoint's device, else cpu)");
  app.add_flag("--bf16", a.bf16, "Run in bf16");
  app.add_flag("--fp16", a.fp16, "Run in fp16");
  app.add_option("--tensor-model-parallel-size", a.tp, "Tensor-parallel ranks (launch that many with dsrun)");
  app.add_flag("--no-kv-cache,--recompute", a.no_kv_cache, "Recompute the whole prefix every step (slow; a reference)");
  app.add_flag("--timing", a.timing, "Print prefill and decode tokens/s to stderr");
  // Megatron-DeepSpeed's tools/generate_samples_gpt.py (megatron_samples.cpp).
  MegatronFlags& m = a.meg;
  app.add_option("--num-samples", m.num_samples, "generate_samples_gpt.py's modes: N > 0 unconditional samples to "
                 "--genfile; 0 the prompts of --sample-input-file, or stdin's");
  app.add_option("--genfile", m.genfile, "Where --num-samples N > 0 writes its JSON lines");
  app.add_option("--sample-input-file", m.sample_input_file, "With --num-samples 0: one prompt per line");
  app.add_option("--sample-output-file", m.sample_output_file, "Its results (default: the input file + .out)");
  app.add_option("--seq-length", m.seq_length, "With --num-samples: the sequence a sample must fit (default: the "
                 "model's positions)");
  app.add_option("--num-layers", m.num_layers, "Checked against the model read");
  app.add_option("--hidden-size", m.hidden_size, "Checked against the model read");
  app.add_option("--num-attention-heads", m.num_attention_heads, "Checked against the model read");
  app.add_option("--max-position-embeddings", m.max_position_embeddings, "Checked against the model read");
  app.add_option("--num-experts", m.num_experts, "Checked against the model read (1: a dense model)")
      ->expected(1, 1 << 20);
  app.add_option("--mlp-type", m.mlp_type, "standard or residual (PR-MoE), checked against the model read");
  app.add_flag("--use-tutel", m.use_tutel, "Accepted: a kernel choice upstream");
  app.add_flag("--ds-inference", m.ds_inference, "Accepted: DeepSpeed's inference kernels upstream");
  app.add_option_function<int>("--log-interval", [](const int&) {}, "Accepted: generation logs nothing per interval "
                               "(upstream reads it nowhere there)");
  app.add_option_function<int>("--local_rank", [](const int&) {},
                               "set by launchers (dsrun); dsgen reads LOCAL_RANK from the environment");
  try {
    app.parse(argc, argv);
    if (a.src.load.empty() && a.src.init_from.empty()) throw CLI::ValidationError("give --load CKPT_DIR or --init-from HF_DIR");
    a.sampling_given = temp->count() + topk->count() + topp->count() > 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "dsgen: error: %s (see dsgen --help)\n", e.what());
    return 1;
  }
  return ds::run_main("dsgen", [&] { return run(a); });
}
