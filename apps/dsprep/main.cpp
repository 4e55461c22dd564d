// dsprep: prepares training data for dstrain.
//   dsprep --input FILE... --output-prefix P --vocab-file V --merge-file M  -> P.bin, P.idx
//   dsprep --train-tokenizer --input FILE... --vocab-size N --output-dir D  -> D/vocab.json, D/merges.txt
//   dsprep --generate-corpus FILE --size-mb X [--seed S]                   -> synthetic demo text
// User errors print one line naming the input and exit 1; no partial output is left.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/dsprep/documents.h"
#include "lib/core/error.h"
#include "lib/data/bpe.h"
#include "lib/data/indexed_dataset.h"
#include "lib/data/synthetic_corpus.h"

namespace {

using ds::prep::DocumentSource;

struct Args {
  std::vector<std::string> inputs;
  std::string input_format = "auto", text_split = "paragraph", json_key = "text";
  std::string output_prefix, vocab_file, merge_file, dtype = "auto";
  std::string tokenizer_type = "GPT2BPETokenizer";
  bool append_eod = true;
  bool train_tokenizer = false;
  int64_t vocab_size = 0, min_frequency = 2;
  std::string output_dir;
  std::string generate_corpus;
  double size_mb = 0;
  uint64_t seed = 1234;
};

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
    s.json_key = a.json_key;
    if (!std::filesystem::is_regular_file(path))
      DS_USER_ERROR("input file {} not found (--input)", path);
    out.push_back(s);
  }
  return out;
}

int run_tokenize(const Args& a) {
  auto srcs = sources(a);
  DS_USER_CHECK(!a.output_prefix.empty(), "--output-prefix is required to tokenize");
  DS_USER_CHECK(!a.vocab_file.empty() && !a.merge_file.empty(),
                "--vocab-file and --merge-file are required to tokenize (or use "
                "--train-tokenizer to make them)");
  DS_USER_CHECK(a.tokenizer_type == "GPT2BPETokenizer",
                "--tokenizer-type {} is not supported (only GPT2BPETokenizer)", a.tokenizer_type);
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = ds::data::BpeTokenizer::load(a.vocab_file, a.merge_file);
  if (a.append_eod && tok.eod_id() < 0)
    DS_USER_ERROR("vocab file {} has no {} token; pass --no-append-eod or use a vocabulary "
                  "that has one", a.vocab_file, ds::data::kEndOfText);
  const auto dtype = a.dtype == "auto" ? ds::data::token_dtype_for_vocab(tok.vocab_size())
                                       : ds::data::parse_token_dtype(a.dtype);
  ds::data::IndexedDatasetWriter writer(a.output_prefix, dtype);
  std::vector<int32_t> ids;
  int64_t docs = 0, bytes = 0;
  for (const auto& src : srcs) {
    ds::prep::read_documents(src, [&](std::string_view doc) {
      ids.clear();
      tok.encode(doc, ids);
      if (a.append_eod) ids.push_back(tok.eod_id());
      writer.add_document(ids);
      ++docs;
      bytes += static_cast<int64_t>(doc.size());
    });
  }
  DS_USER_CHECK(docs > 0, "no documents found in the input (--input {})", a.inputs.front());
  writer.finalize();
  const double dt = seconds_since(t0);
  std::printf("dsprep: wrote %s.bin/.idx: %lld documents, %lld tokens (%.2f bytes/token), "
              "dtype %s, vocab %lld, %.1f s (%.2f MB/s)\n", a.output_prefix.c_str(),
              static_cast<long long>(docs), static_cast<long long>(writer.num_tokens()),
              writer.num_tokens() ? double(bytes) / double(writer.num_tokens()) : 0.0,
              ds::data::token_dtype_name(dtype), static_cast<long long>(tok.vocab_size()), dt,
              dt > 0 ? bytes / dt / 1e6 : 0.0);
  return 0;
}

int run_train_tokenizer(const Args& a) {
  auto srcs = sources(a);
  DS_USER_CHECK(!a.output_dir.empty(), "--output-dir is required with --train-tokenizer");
  DS_USER_CHECK(a.vocab_size > 0, "--vocab-size is required with --train-tokenizer");
  const auto t0 = std::chrono::steady_clock::now();
  std::string corpus;
  for (const auto& src : srcs) {
    if (ds::prep::resolve_format(src) == ds::prep::InputFormat::Text) {
      corpus += ds::prep::read_whole_file(src.path);
    } else {
      ds::prep::read_documents(src, [&](std::string_view doc) {
        corpus.append(doc);
        corpus += '\n';
      });
    }
  }
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
  DS_USER_CHECK(a.size_mb > 0 && std::isfinite(a.size_mb),
                "--size-mb must be a positive number, got {}", a.size_mb);
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

void add_options(CLI::App& app, Args& a) {
  app.add_option("--input", a.inputs, "Input file(s): .jsonl ({\"text\": ...} per line) or text")
      ->expected(1, -1);
  app.add_option("--input-format", a.input_format, "auto (by extension: .jsonl/.json), text, jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  app.add_option("--text-split", a.text_split,
                 "Plain text documents: paragraph (split at blank lines) or file (one per file)")
      ->check(CLI::IsMember({"paragraph", "file"}));
  app.add_option("--json-keys,--json-key", a.json_key, "JSON field holding the text");
  app.add_option("--output-prefix", a.output_prefix, "Writes PREFIX.bin and PREFIX.idx");
  app.add_option("--vocab-file", a.vocab_file, "GPT-2 style vocab.json");
  app.add_option("--merge-file", a.merge_file, "GPT-2 style merges.txt");
  app.add_option("--tokenizer-type", a.tokenizer_type, "Only GPT2BPETokenizer");
  app.add_flag("--append-eod,!--no-append-eod", a.append_eod,
               "Append <|endoftext|> after each document (default on)");
  app.add_option("--dtype", a.dtype, "Token dtype: auto (u16 if vocab < 65500, else i32), u16, i32")
      ->check(CLI::IsMember({"auto", "u8", "u16", "i16", "i32", "i64"}));
  app.add_flag("--train-tokenizer", a.train_tokenizer, "Learn a byte-level BPE vocabulary");
  app.add_option("--vocab-size", a.vocab_size, "Vocabulary size to learn (>= 257)");
  app.add_option("--min-frequency", a.min_frequency, "Stop merging below this pair count");
  app.add_option("--output-dir", a.output_dir, "Where vocab.json and merges.txt are written");
  app.add_option("--generate-corpus", a.generate_corpus, "Write synthetic demo text to FILE");
  app.add_option("--size-mb", a.size_mb, "Size of the generated corpus in MB (10^6 bytes)");
  app.add_option("--seed", a.seed, "Seed of the generated corpus");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsprep: tokenize corpora into Megatron .bin/.idx datasets, train byte-level "
               "BPE vocabularies, generate the synthetic demo corpus"};
  Args a;
  add_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "dsprep: error: %s (see dsprep --help)\n", e.what());
    return 1;
  }
  try {
    if (!a.generate_corpus.empty()) return run_generate(a);
    if (a.train_tokenizer) return run_train_tokenizer(a);
    return run_tokenize(a);
  } catch (const ds::UserError& e) {
    std::fprintf(stderr, "dsprep: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsprep: internal error: %s\n", e.what());
    return 2;
  }
}
