// dsprep: prepares training data for dstrain.
//   dsprep --input FILE... --output-prefix P --vocab-file V --merge-file M  -> P.bin, P.idx
//       (JSON lines input, as Megatron's preprocess_data.py: P_text_document.bin/.idx)
//   dsprep --input FILE... --output-prefix P --tokenizer-type T --tokenizer-model M [--workers N]
//   dsprep --train-tokenizer --input FILE... --vocab-size N --output-dir D  -> D/vocab.json, D/merges.txt
//   dsprep --generate-corpus FILE --size-mb X [--seed S]                   -> synthetic demo text
//   dsprep --analyzing-task map|reduce --analyzing-metric M --data-path P --save D ...
//       (DeepSpeed Data Efficiency's data analysis with analyze_data.py's flags: apps/dsprep/analyze.h)
// User errors print one line naming the input and exit 1; no partial output is left.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/dsprep/analyze.h"
#include "apps/dsprep/documents.h"
#include "apps/dsprep/tokenize.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"
#include "lib/data/bpe.h"
#include "lib/data/indexed_dataset.h"
#include "lib/data/synthetic_corpus.h"

namespace {

using ds::prep::DocumentSource;

struct Args {
  std::vector<std::string> inputs;
  std::string input_format = "auto", text_split = "paragraph";
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix, vocab_file, merge_file, dtype = "auto";
  std::string tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  // Neither: on for plain text input, off for JSON lines (Megatron's default).
  bool eod_on = false, eod_off = false;
  int workers = 1;
  int64_t log_interval = 1000;
  // Megatron preprocess_data.py flags: checked, or accepted as the no-ops they are here.
  bool split_sentences = false, keep_newlines = false, trust_remote_code = false;
  int64_t partitions = 1, seq_length = 0;
  std::string dataset_impl = "mmap", lang = "english";
  bool train_tokenizer = false;
  int64_t vocab_size = 0, min_frequency = 2;
  std::string output_dir;
  std::string generate_corpus;
  double size_mb = 0;
  uint64_t seed = 1234;
};

// The largest --generate-corpus size: 10 TB (a size past int64 bytes would wrap).
constexpr double kMaxCorpusMb = 1e7;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<DocumentSource> sources(const Args& a) {
  DS_USER_CHECK(!a.inputs.empty(), "--input is required");
  std::vector<DocumentSource> out;
  for (const std::string& path : a.inputs) {
    DocumentSource s;
    s.path = path;
    s.format = a.input_format == "text"    ? ds::prep::InputFormat::Text
               : a.input_format == "jsonl" ? ds::prep::InputFormat::Jsonl
                                           : ds::prep::InputFormat::Auto;
    s.text_split = a.text_split == "file" ? ds::prep::TextSplit::File
                                          : ds::prep::TextSplit::Paragraph;
    s.json_key = a.json_keys.empty() ? std::string() : a.json_keys.front();
    std::error_code ec;
    DS_USER_CHECK(std::filesystem::exists(path, ec), "input file {} not found (--input)", path);
    DS_USER_CHECK(std::filesystem::is_regular_file(path, ec), "input file {} is not a regular file (--input)", path);
    out.push_back(s);
  }
  return out;
}

// Megatron preprocess_data.py flags that dsprep accepts only in their
// "off" form, or rejects by name.
void check_megatron_flags(const Args& a) {
  DS_USER_CHECK(!a.split_sentences, "--split-sentences is not supported: dsprep writes one sequence per document "
                "(split sentences beforehand, one per line, with --text-split paragraph)");
  DS_USER_CHECK(a.partitions == 1, "--partitions {} is not supported (partitions reorder the documents); use "
                "--workers for parallel tokenization", a.partitions);
  DS_USER_CHECK(a.dataset_impl == "mmap", "--dataset-impl {} is not supported: dsprep writes the mmap format",
                a.dataset_impl);
  DS_USER_CHECK(a.json_keys.size() == 1, "--json-keys: give one key (dsprep writes one dataset per run), got {}",
                a.json_keys.size());
}

// The tokenizer flags as they are (the data analysis checks them its own way).
ds::data::TokenizerSpec tokenizer_files(const Args& a) {
  ds::data::TokenizerSpec spec;
  spec.kind = ds::data::parse_tokenizer_kind(a.tokenizer_type);
  spec.model_path = a.tokenizer_model;
  spec.vocab_file = a.vocab_file;
  spec.merge_file = a.merge_file;
  return spec;
}

ds::data::TokenizerSpec tokenizer_spec(const Args& a) {
  const ds::data::TokenizerSpec spec = tokenizer_files(a);
  if (spec.kind == ds::data::TokenizerKind::GPT2BPE)
    DS_USER_CHECK(!a.vocab_file.empty() && !a.merge_file.empty(),
                  "--vocab-file and --merge-file are required to tokenize with GPT2BPETokenizer (or use "
                  "--train-tokenizer to make them, or --tokenizer-type with --tokenizer-model)");
  else
    DS_USER_CHECK(!a.tokenizer_model.empty(), "--tokenizer-type {} needs --tokenizer-model", a.tokenizer_type);
  return spec;
}

// JSON lines is Megatron's input format, and with it dsprep behaves as
// tools/preprocess_data.py does: the dataset is named PREFIX_{key}_document and
// the end-of-document token is appended only with --append-eod. Plain text is
// dsprep's own mode: PREFIX itself, end-of-document appended unless
// --no-append-eod.
bool megatron_mode(const std::vector<DocumentSource>& srcs) {
  for (const DocumentSource& s : srcs)
    if (ds::prep::resolve_format(s) == ds::prep::InputFormat::Jsonl) return true;
  return false;
}

int run_tokenize(const Args& a) {
  check_megatron_flags(a);
  auto srcs = sources(a);
  DS_USER_CHECK(!a.output_prefix.empty(), "--output-prefix is required to tokenize");
  DS_USER_CHECK(a.output_prefix.back() != '/', "--output-prefix '{}' ends in '/': give a file name prefix such as "
                "{}corpus (writes corpus.bin and corpus.idx there)", a.output_prefix, a.output_prefix);
  const bool megatron = megatron_mode(srcs);
  ds::prep::TokenizeOptions opt;
  opt.tokenizer = tokenizer_spec(a);
  opt.output_prefix = megatron ? a.output_prefix + "_" + a.json_keys.front() + "_document" : a.output_prefix;
  for (const DocumentSource& src : srcs)  // the output replaces its files by rename: an input there would be lost
    for (const char* ext : {".bin", ".idx"}) {
      std::error_code ec;
      DS_USER_CHECK(!std::filesystem::equivalent(src.path, opt.output_prefix + ext, ec),
                    "--output-prefix {} would overwrite the input file {} (--input); choose another prefix",
                    opt.output_prefix, src.path);
    }
  opt.dtype = a.dtype;
  DS_USER_CHECK(!(a.eod_on && a.eod_off), "--append-eod and --no-append-eod contradict each other; give one");
  opt.append_eod = a.eod_on || (!a.eod_off && !megatron);
  opt.workers = a.workers;
  opt.log_interval = a.log_interval;
  const ds::prep::TokenizeStats st = ds::prep::tokenize_to_dataset(srcs, opt);
  std::printf("dsprep: wrote %s.bin/.idx: %lld documents, %lld tokens (%.2f bytes/token), "
              "dtype %s, vocab %lld, %.1f s (%.2f MB/s)%s\n", opt.output_prefix.c_str(),
              static_cast<long long>(st.documents), static_cast<long long>(st.tokens),
              st.tokens ? double(st.bytes) / double(st.tokens) : 0.0, st.dtype.c_str(),
              static_cast<long long>(st.vocab_size), st.seconds, st.seconds > 0 ? st.bytes / st.seconds / 1e6 : 0.0,
              st.empty_documents ? fmt::format(", {} documents without tokens left out",
                                               st.empty_documents).c_str() : "");
  return 0;
}

int run_train_tokenizer(const Args& a) {
  auto srcs = sources(a);
  DS_USER_CHECK(!a.output_dir.empty(), "--output-dir is required with --train-tokenizer");
  DS_USER_CHECK(a.vocab_size > 0, "--vocab-size is required with --train-tokenizer");
  DS_USER_CHECK(a.min_frequency >= 0, "--min-frequency must be >= 0, got {}", a.min_frequency);
  const auto t0 = std::chrono::steady_clock::now();
  std::string corpus;
  for (const auto& src : srcs) {
    if (ds::prep::resolve_format(src) == ds::prep::InputFormat::Text) {
      corpus += ds::prep::read_whole_file(src.path);
    } else {
      ds::prep::read_documents(src, [&](std::string_view doc, int64_t) {
        corpus.append(doc);
        corpus += '\n';
      });
    }
  }
  std::string inputs;
  for (const auto& src : srcs) inputs += (inputs.empty() ? "" : " ") + src.path;
  DS_USER_CHECK(!corpus.empty(), "no text found in the input (--input {}): nothing to learn a vocabulary from",
                inputs);
  ds::data::BpeTrainOptions opt;
  opt.min_frequency = a.min_frequency;
  auto bpe = ds::data::train_bpe(corpus, a.vocab_size, opt);
  const std::filesystem::path dir(a.output_dir);
  ds::data::write_bpe_files(bpe, (dir / "vocab.json").string(), (dir / "merges.txt").string());
  std::printf("dsprep: wrote %s/vocab.json and merges.txt: %zu tokens (%zu merges) from %zu "
              "bytes in %.1f s\n", a.output_dir.c_str(), bpe.tokens.size(), bpe.merges.size(),
              corpus.size(), seconds_since(t0));
  if (static_cast<int64_t>(bpe.tokens.size()) < a.vocab_size)
    std::printf("dsprep: note: the corpus supports only %zu tokens (no pair occurs %lld times "
                "any more), fewer than --vocab-size %lld\n", bpe.tokens.size(),
                static_cast<long long>(a.min_frequency), static_cast<long long>(a.vocab_size));
  return 0;
}

int run_generate(const Args& a) {
  DS_USER_CHECK(a.size_mb > 0 && a.size_mb <= kMaxCorpusMb, "--size-mb must be a number in (0, {}], got {}",
                kMaxCorpusMb, a.size_mb);
  const std::string tmp = a.generate_corpus + ".tmp";
  const std::filesystem::path parent = std::filesystem::path(a.generate_corpus).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) DS_USER_ERROR("cannot write {} (--generate-corpus)", a.generate_corpus);
  const auto bytes = static_cast<int64_t>(std::llround(a.size_mb * 1e6));
  ds::data::generate_corpus(a.seed, bytes, [&](std::string_view p) { out.write(p.data(), p.size()); });
  out.close();
  if (!out || std::rename(tmp.c_str(), a.generate_corpus.c_str()) != 0) {
    std::remove(tmp.c_str());
    DS_USER_ERROR("cannot write {} (--generate-corpus)", a.generate_corpus);
  }
  std::printf("dsprep: wrote %s: synthetic corpus, %.2f MB, seed %llu\n",
              a.generate_corpus.c_str(), bytes / 1e6, static_cast<unsigned long long>(a.seed));
  return 0;
}

// The data analysis and the other modes take different flags: one given in
// the wrong mode is an error naming it.
void check_mode(const CLI::App& app, const ds::prep::AnalyzeArgs& an) {
  if (an.task.empty()) {
    for (const std::string& flag : ds::prep::analysis_flag_names())
      DS_USER_CHECK(app.count(flag) == 0, "{} belongs to the data analysis: give --analyzing-task map|reduce", flag);
    return;
  }
  for (const char* flag : {"--input", "--output-prefix", "--train-tokenizer", "--generate-corpus", "--output-dir"})
    DS_USER_CHECK(app.count(flag) == 0, "{} does not go with --analyzing-task (the data analysis reads --data-path "
                  "and writes under --save)", flag);
}

void add_options(CLI::App& app, Args& a) {
  app.add_option("--input", a.inputs, "Input file(s): .jsonl ({\"text\": ...} per line) or text")
      ->expected(1, -1);
  app.add_option("--input-format", a.input_format, "auto (by extension: .jsonl/.json), text, jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  app.add_option("--text-split", a.text_split,
                 "Plain text documents: paragraph (split at blank lines) or file (one per file)")
      ->check(CLI::IsMember({"paragraph", "file"}));
  app.add_option("--json-keys,--json-key", a.json_keys, "JSON field holding the text (one key)")->expected(1, -1);
  app.add_option("--output-prefix", a.output_prefix,
                 "Writes PREFIX.bin/.idx (text input) or PREFIX_KEY_document.bin/.idx (JSON lines, as Megatron)");
  app.add_option("--vocab-file", a.vocab_file, "GPT-2 style vocab.json");
  app.add_option("--merge-file", a.merge_file, "GPT-2 style merges.txt");
  app.add_option("--tokenizer-type", a.tokenizer_type,
                 "GPT2BPETokenizer (default), GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer, "
                 "HFTokenizer");
  app.add_option("--tokenizer-model", a.tokenizer_model,
                 "tokenizer.model (SentencePiece types) or tokenizer.json / its directory (HFTokenizer)");
  app.add_flag("--append-eod", a.eod_on,
               "Append the end-of-document token after each document (default: on for text input, "
               "off for JSON lines, as Megatron)");
  app.add_flag("--no-append-eod", a.eod_off, "Do not append the end-of-document token");
  app.add_option("--workers", a.workers, "Tokenizer threads (output identical for any number)");
  app.add_option("--log-interval", a.log_interval, "Documents between progress lines (0: none)");
  app.add_flag("--split-sentences", a.split_sentences, "Megatron's sentence splitting: not supported");
  app.add_flag("--keep-newlines", a.keep_newlines, "Only with --split-sentences: no effect");
  app.add_option("--lang", a.lang, "Only with --split-sentences: no effect");
  app.add_option("--partitions", a.partitions, "Megatron's file partitions: only 1");
  app.add_option("--dataset-impl", a.dataset_impl, "Only mmap (the .bin/.idx format)");
  app.add_option("--seq-length", a.seq_length,
                 "Data analysis: tokens per sample minus one (Megatron's); tokenizing: accepted, no effect");
  app.add_flag("--trust-remote-code", a.trust_remote_code, "Accepted, no effect (no code is run)");
  app.add_option("--dtype", a.dtype, "Token dtype: auto (u16 if vocab < 65500, else i32), u16, i32")
      ->check(CLI::IsMember({"auto", "u8", "u16", "i16", "i32", "i64"}));
  app.add_flag("--train-tokenizer", a.train_tokenizer, "Learn a byte-level BPE vocabulary");
  app.add_option("--vocab-size", a.vocab_size, "Vocabulary size to learn (>= 257)");
  app.add_option("--min-frequency", a.min_frequency, "Stop merging below this pair count");
  app.add_option("--output-dir", a.output_dir, "Where vocab.json and merges.txt are written");
  app.add_option("--generate-corpus", a.generate_corpus, "Write synthetic demo text to FILE");
  app.add_option("--size-mb", a.size_mb, "Size of the generated corpus in MB (10^6 bytes)");
  app.add_option("--seed", a.seed,
                 "Seed of the generated corpus; data analysis: the dataset's shuffle (Megatron's, default 1234)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsprep: tokenize corpora into Megatron .bin/.idx datasets, train byte-level "
               "BPE vocabularies, generate the synthetic demo corpus, run DeepSpeed's data analysis"};
  Args a;
  ds::prep::AnalyzeArgs an;
  add_options(app, a);
  ds::prep::add_analysis_options(app, an);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "dsprep: error: %s (see dsprep --help)\n", e.what());
    return 1;
  }
  return ds::run_main("dsprep", [&] {
    check_mode(app, an);
    if (!an.task.empty()) return ds::prep::run_analysis(an, tokenizer_files(a), a.seq_length, a.seed);
    if (!a.generate_corpus.empty()) return run_generate(a);
    if (a.train_tokenizer) return run_train_tokenizer(a);
    return run_tokenize(a);
  });
}
