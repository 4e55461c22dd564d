// End-to-end tests of the dsprep binary: generate the demo corpus, train a
// tokenizer on it, tokenize it (plain text and JSON lines) into .bin/.idx, read
// the result back; and bad input exits 1 with one line and no output files;
// a tokenizer trained onto a full disk keeps the old pair (a small tmpfs,
// test/small_disk.h; skipped where none can be mounted).
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "lib/data/bpe.h"
#include "lib/data/indexed_dataset.h"
#include "lib/data/tokenizer.h"
#include "test/data/test_util.h"
#include "test/skip.h"
#include "test/small_disk.h"

using namespace ds;
using namespace ds::data;
namespace fs = std::filesystem;

namespace {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

std::string dsprep_path() {
  const char* bin = std::getenv("DS_BINARY_DIR");
  return std::string(bin ? bin : ".") + "/apps/dsprep/dsprep";
}

RunResult run(const std::string& args) {
  RunResult r;
  const std::string cmd = dsprep_path() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 2;
  }
  return out;
}

std::vector<int32_t> tokens_of(const IndexedDataset& ds, int64_t i) {
  std::vector<int32_t> t(ds.sequence_length(i));
  ds.read_tokens(i, 0, t.size(), t.data());
  return t;
}

// No file named PREFIX* (PREFIX.bin, PREFIX_text_document.idx, temporaries).
bool no_outputs(const std::string& prefix) {
  const fs::path p(prefix);
  if (!fs::is_directory(p.parent_path())) return true;
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(p.filename().string(), 0) == 0) return false;
  return true;
}

}  // namespace

TEST_CASE("dsprep generates, trains a tokenizer and tokenizes the demo corpus") {
  REQUIRE(fs::exists(dsprep_path()));
  test::TempDir dir;
  const std::string corpus = dir / "corpus.txt";
  RunResult r = run("--generate-corpus " + corpus + " --size-mb 0.3 --seed 5");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string text = test::slurp(corpus);
  REQUIRE(text.size() >= 300000);
  REQUIRE(text.size() < 301000);
  REQUIRE(run("--generate-corpus " + (dir / "same.txt") + " --size-mb 0.3 --seed 5").code == 0);
  REQUIRE(test::slurp(dir / "same.txt") == text);
  REQUIRE(run("--generate-corpus " + (dir / "other.txt") + " --size-mb 0.3 --seed 6").code == 0);
  REQUIRE(test::slurp(dir / "other.txt") != text);

  r = run("--train-tokenizer --input " + corpus + " --vocab-size 512 --output-dir " +
          (dir / "tok"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string vocab = dir / "tok/vocab.json", merges = dir / "tok/merges.txt";
  BpeTokenizer tok = BpeTokenizer::load(vocab, merges);
  REQUIRE(tok.vocab_size() == 512);

  r = run("--input " + corpus + " --output-prefix " + (dir / "out/demo") + " --vocab-file " +
          vocab + " --merge-file " + merges);
  INFO(r.output);
  REQUIRE(r.code == 0);
  IndexedDataset ds = IndexedDataset::open(dir / "out/demo");
  REQUIRE(ds.dtype() == TokenDType::U16);
  const std::vector<std::string> docs = paragraphs(text);
  REQUIRE(ds.num_sequences() == static_cast<int64_t>(docs.size()));
  REQUIRE(ds.num_documents() == static_cast<int64_t>(docs.size()));
  for (int64_t i : {int64_t(0), int64_t(1), ds.num_sequences() - 1}) {
    std::vector<int32_t> t = tokens_of(ds, i);
    REQUIRE(t.back() == tok.eod_id());
    t.pop_back();
    REQUIRE(tok.decode(t) == docs[i]);
  }
  REQUIRE(max_token_id(ds) == tok.eod_id());

  r = run("--input " + corpus + " --output-prefix " + (dir / "noeod") + " --vocab-file " + vocab +
          " --merge-file " + merges + " --no-append-eod --dtype i32");
  REQUIRE(r.code == 0);
  IndexedDataset noeod = IndexedDataset::open(dir / "noeod");
  REQUIRE(noeod.dtype() == TokenDType::I32);
  REQUIRE(tokens_of(noeod, 0) == tok.encode(docs[0]));
}

TEST_CASE("dsprep reads JSON lines and one-document-per-file text") {
  test::TempDir dir;
  REQUIRE(run("--generate-corpus " + (dir / "c.txt") + " --size-mb 0.05 --seed 1").code == 0);
  REQUIRE(run("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 300 --output-dir " +
              dir.path()).code == 0);
  const std::string tok_args =
      " --vocab-file " + (dir / "vocab.json") + " --merge-file " + (dir / "merges.txt");
  test::spit(dir / "in.jsonl",
             "{\"text\": \"First doc.\\nTwo lines.\", \"id\": 1}\n\n{\"text\": \"Second \\u00e9\"}\n");
  // JSON lines: Megatron's preprocess_data.py naming (PREFIX_KEY_document) and
  // no end-of-document token unless --append-eod.
  RunResult r = run("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "j") + tok_args);
  INFO(r.output);
  REQUIRE(r.code == 0);
  REQUIRE(r.output.find(dir / "j_text_document") != std::string::npos);
  REQUIRE_FALSE(fs::exists(dir / "j.bin"));
  BpeTokenizer tok = BpeTokenizer::load(dir / "vocab.json", dir / "merges.txt");
  IndexedDataset j = IndexedDataset::open(dir / "j_text_document");
  REQUIRE(j.num_sequences() == 2);
  REQUIRE(tokens_of(j, 1) == tok.encode("Second \xc3\xa9"));
  REQUIRE(tokens_of(j, 0) == tok.encode("First doc.\nTwo lines."));
  test::spit(dir / "keyed.jsonl", "{\"content\": \"Second \\u00e9\"}\n");
  r = run("--input " + (dir / "keyed.jsonl") + " --json-keys content --append-eod --output-prefix " +
          (dir / "k") + tok_args);
  REQUIRE(r.code == 0);
  IndexedDataset k = IndexedDataset::open(dir / "k_content_document");
  std::vector<int32_t> t = tokens_of(k, 0);
  REQUIRE(t.back() == tok.eod_id());
  t.pop_back();
  REQUIRE(tok.decode(t) == "Second \xc3\xa9");
  r = run("--input " + (dir / "keyed.jsonl") + " --json-keys content --append-eod --no-append-eod "
          "--output-prefix " + (dir / "both") + tok_args);
  REQUIRE(r.code == 1);
  REQUIRE(r.output.find("--no-append-eod") != std::string::npos);
  REQUIRE(no_outputs(dir / "both"));

  test::spit(dir / "a.txt", "one\n\ntwo\n");
  test::spit(dir / "b.txt", "three\n");
  r = run("--input " + (dir / "a.txt") + " " + (dir / "b.txt") +
          " --text-split file --output-prefix " + (dir / "f") + tok_args);
  REQUIRE(r.code == 0);
  IndexedDataset f = IndexedDataset::open(dir / "f");
  REQUIRE(f.num_sequences() == 2);
  t = tokens_of(f, 0);
  t.pop_back();
  REQUIRE(tok.decode(t) == "one\n\ntwo\n");
}

TEST_CASE("dsprep errors: one line naming the input, exit 1, no output") {
  test::TempDir dir;
  REQUIRE(run("--generate-corpus " + (dir / "c.txt") + " --size-mb 0.02 --seed 1").code == 0);
  REQUIRE(run("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 300 --output-dir " +
              dir.path()).code == 0);
  const std::string tok_args =
      " --vocab-file " + (dir / "vocab.json") + " --merge-file " + (dir / "merges.txt");
  auto expect_fail = [&](const std::string& args, const std::string& needle,
                         const std::string& prefix) {
    RunResult r = run(args);
    INFO(args << "\n" << r.output);
    REQUIRE(r.code == 1);
    REQUIRE(r.output.find(needle) != std::string::npos);
    REQUIRE(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    REQUIRE(no_outputs(prefix));
  };
  const std::string out = dir / "out";
  expect_fail("--input " + (dir / "missing.txt") + " --output-prefix " + out + tok_args,
              dir / "missing.txt", out);
  // A bad line after good ones: the partial dataset must not survive.
  test::spit(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"also fine\"}\n{oops\n");
  expect_fail("--input " + (dir / "bad.jsonl") + " --output-prefix " + out + tok_args,
              dir / "bad.jsonl" + " line 3", out);
  // 70,000 nested brackets on a line, and as the vocab file: one line, no stack overflow.
  test::spit(dir / "deep.jsonl", "{\"text\": \"fine\"}\n" + std::string(70000, '[') + "\n");
  expect_fail("--input " + (dir / "deep.jsonl") + " --output-prefix " + out + tok_args,
              dir / "deep.jsonl" + " line 2 nests JSON", out);
  test::spit(dir / "deep.json", std::string(70000, '{'));
  expect_fail("--input " + (dir / "c.txt") + " --output-prefix " + out + " --vocab-file " + (dir / "deep.json") +
                  " --merge-file " + (dir / "merges.txt"),
              dir / "deep.json", out);
  test::spit(dir / "nokey.jsonl", "{\"body\": \"x\"}\n");
  expect_fail("--input " + (dir / "nokey.jsonl") + " --output-prefix " + out + tok_args,
              "\"text\"", out);
  expect_fail("--input " + (dir / "c.txt") + " --output-prefix " + out +
                  " --vocab-file " + (dir / "nope.json") + " --merge-file " + (dir / "merges.txt"),
              dir / "nope.json", out);
  expect_fail("--input " + (dir / "c.txt") + " --output-prefix " + out + tok_args + " --dtype u8",
              "u8", out);
  expect_fail("--input " + (dir / "c.txt") + " --output-prefix " + out + " --bogus-flag",
              "--bogus-flag", out);
  expect_fail("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 10 --output-dir " +
                  (dir / "t2"),
              "--vocab-size", out);
  REQUIRE_FALSE(fs::exists(dir / "t2/vocab.json"));
  expect_fail("--input " + dir.path() + " --output-prefix " + out + tok_args,
              "input file " + dir.path() + " is not a regular file", out);
  // A prefix that is a directory would write the hidden files DIR/.bin and DIR/.idx.
  expect_fail("--input " + (dir / "c.txt") + " --output-prefix " + dir.path() + "/" + tok_args,
              "--output-prefix '" + dir.path() + "/' ends in '/'", dir / ".bin");
  // The output replaces PREFIX.bin by rename: an input of that name would be lost.
  test::spit(dir / "text.bin", "some text\n");
  expect_fail("--input " + (dir / "text.bin") + " --input-format text --output-prefix " + (dir / "text") + tok_args,
              "would overwrite the input file " + (dir / "text.bin"), dir / "text.idx");
  REQUIRE(test::slurp(dir / "text.bin") == "some text\n");
  test::spit(dir / "empty.txt", "");
  expect_fail("--train-tokenizer --input " + (dir / "empty.txt") + " --vocab-size 300 --output-dir " + (dir / "t3"),
              "no text found in the input (--input " + (dir / "empty.txt") + ")", out);
  REQUIRE_FALSE(fs::exists(dir / "t3/vocab.json"));
  expect_fail("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 300 --min-frequency -1 --output-dir " +
                  (dir / "t3"),
              "--min-frequency must be >= 0, got -1", out);
  // 1e30 MB once wrapped to a negative byte count and wrote an empty file with exit 0.
  expect_fail("--generate-corpus " + (dir / "huge.txt") + " --size-mb 1e30", "--size-mb must be a number in (0, ",
              dir / "huge.txt");
}

// A SentencePiece document too long to encode at once (no space to cut it at
// within 4 MiB) is one error naming its file and line; nothing is written.
TEST_CASE("dsprep names the SentencePiece document it cannot encode in bounded pieces", "[sentencepiece]") {
  if (!have_sentencepiece()) DS_SKIP("this build has no SentencePiece library");
  test::TempDir dir;
  REQUIRE(run("--generate-corpus " + (dir / "c.txt") + " --size-mb 0.05 --seed 2").code == 0);
  if (std::system(("spm_train --input=" + (dir / "c.txt") + " --model_prefix=" + (dir / "sp") +
                   " --vocab_size=300 --model_type=bpe --minloglevel=2 >/dev/null 2>&1").c_str()) != 0)
    DS_SKIP("spm_train not found (Debian package sentencepiece)");
  const std::string solid(kSpMaxPieceBytes + 1, 'z');
  test::spit(dir / "docs.jsonl", "{\"text\": \"a short one\"}\n\n{\"text\": \"" + solid + "\"}\n");
  const std::string out = dir / "out";
  RunResult r = run("--input " + (dir / "docs.jsonl") + " --output-prefix " + out +
                    " --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model " + (dir / "sp.model"));
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("input file " + (dir / "docs.jsonl") + " line 3: SentencePiece: " +
                      std::to_string(solid.size()) + " bytes from byte 0 hold no single space") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(no_outputs(out));
}

// A file size limit (ulimit -f) stops the .bin write with EFBIG (SIGXFSZ is
// caught): one error line, exit 1, and no .bin.tmp left behind.
TEST_CASE("dsprep under a file size limit leaves no temporaries") {
  test::TempDir dir;
  REQUIRE(run("--generate-corpus " + (dir / "c.txt") + " --size-mb 0.2 --seed 4").code == 0);
  REQUIRE(run("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 300 --output-dir " + dir.path()).code ==
          0);
  const std::string out = dir / "out";
  // /bin/sh counts ulimit -f in blocks of 512 (dash) or 1024 bytes: 16 KiB at most, the .bin is ~100 KB.
  const std::string cmd = "sh -c 'ulimit -f 16 && exec " + dsprep_path() + " --input " + (dir / "c.txt") +
                          " --output-prefix " + out + " --vocab-file " + (dir / "vocab.json") + " --merge-file " +
                          (dir / "merges.txt") + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string output;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) output.append(buf, n);
  const int status = pclose(p);
  INFO(output);
  REQUIRE(WIFEXITED(status));  // not killed by SIGXFSZ
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(output.find("File too large") != std::string::npos);
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
  CHECK(no_outputs(out));
}

TEST_CASE("dsprep --workers N writes the same bytes as one worker, with progress lines") {
  test::TempDir dir;
  REQUIRE(run("--generate-corpus " + (dir / "c.txt") + " --size-mb 0.3 --seed 3").code == 0);
  REQUIRE(run("--train-tokenizer --input " + (dir / "c.txt") + " --vocab-size 400 --output-dir " + dir.path()).code == 0);
  // A tokenizer.json with the same vocabulary and merges, and an added token.
  nlohmann::json vocab = nlohmann::json::parse(test::slurp(dir / "vocab.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(test::slurp(dir / "merges.txt"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  const int eot = vocab["<|endoftext|>"].get<int>();
  nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                       {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                       {"added_tokens", {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}}}}};
  fs::create_directories(dir / "hf");
  test::spit(dir / "hf/tokenizer.json", tj.dump());
  std::vector<std::string> types = {"--tokenizer-type HFTokenizer --tokenizer-model " + (dir / "hf")};
  if (!have_sentencepiece())
    WARN("this build has no SentencePiece library: the SentencePiece case is left out");
  else if (std::system(("spm_train --input=" + (dir / "c.txt") + " --model_prefix=" + (dir / "sp") +
                   " --vocab_size=700 --model_type=bpe --byte_fallback=true --minloglevel=2 >/dev/null 2>&1").c_str()) == 0)
    types.push_back("--tokenizer-type Llama2Tokenizer --tokenizer-model " + (dir / "sp.model"));
  else
    WARN("spm_train not found (Debian package sentencepiece): the SentencePiece case is left out");
  for (const std::string& type : types) {
    INFO(type);
    RunResult one = run("--input " + (dir / "c.txt") + " --output-prefix " + (dir / "w1") + " " + type);
    REQUIRE(one.code == 0);
    RunResult three = run("--input " + (dir / "c.txt") + " --output-prefix " + (dir / "w3") + " " + type +
                          " --workers 3 --log-interval 100 --append-eod");
    INFO(three.output);
    REQUIRE(three.code == 0);
    // The progress line (lib/core/progress.h): documents, bytes of the input, rate, elapsed, ETA.
    const std::regex line(R"(dsprep: tokenizing \| 100 documents \(\d+/s\) \| [\d.]+ [KM]?B of [\d.]+ [KM]?B )"
                          R"(\(\d+\.\d%\) \| [\d.]+ [KM]?B/s \| elapsed \d+:\d\d:\d\d \| ETA \d+:\d\d:\d\d\n)");
    CHECK(std::regex_search(three.output, line));
    CHECK(test::slurp(dir / "w1.bin") == test::slurp(dir / "w3.bin"));
    CHECK(test::slurp(dir / "w1.idx") == test::slurp(dir / "w3.idx"));
    IndexedDataset ds = IndexedDataset::open(dir / "w3");
    REQUIRE(ds.num_sequences() > 100);
    const std::vector<int32_t> first = tokens_of(ds, 0);
    if (type.find("Llama2") != std::string::npos) {
      CHECK(first.front() == 1);  // the model's bos
      CHECK(first.back() == 2);   // eod = the model's eos
    } else {
      CHECK(first.back() == eot);
    }
  }
}

TEST_CASE("dsprep refuses Megatron flags it cannot honour, naming them") {
  test::TempDir dir;
  test::spit(dir / "c.jsonl", "{\"text\": \"hello\"}\n");
  const std::string base = "--input " + (dir / "c.jsonl") + " --output-prefix " + (dir / "o");
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" --tokenizer-type HFTokenizer", "--tokenizer-model"},
           {" --tokenizer-type Llama2Tokenizer --tokenizer-model " + (dir / "none.model"), "none.model"},
           {" --tokenizer-type NullTokenizer --tokenizer-model x", "NullTokenizer"},
           {" --split-sentences --tokenizer-type HFTokenizer --tokenizer-model x", "--split-sentences"},
           {" --partitions 2 --tokenizer-type HFTokenizer --tokenizer-model x", "--partitions"},
           {" --json-keys text title --tokenizer-type HFTokenizer --tokenizer-model x", "--json-keys"},
           {" --workers 0 --tokenizer-type HFTokenizer --tokenizer-model " + (dir / "c.jsonl"), "--workers"}}) {
    RunResult r = run(base + args);
    INFO(args << "\n" << r.output);
    CHECK(r.code == 1);
    CHECK(r.output.find(needle) != std::string::npos);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    CHECK(no_outputs(dir / "o"));
  }
}

namespace {

// Child, with `disk` a `kib` KiB tmpfs: puts the old tokenizer pair there and
// trains a larger one over it. 0: replaced by a new pair that loads; 1: the
// expected clean failure (one line saying "No space left on device", the old
// pair byte for byte, no other file); 2: anything else (printed).
int train_over_old_pair(const fs::path& disk, int kib, const std::string& corpus, const std::string& old_vocab,
                        const std::string& old_merges) {
  const std::string vocab = (disk / "vocab.json").string(), merges = (disk / "merges.txt").string();
  test::spit(vocab, old_vocab);
  test::spit(merges, old_merges);
  if (test::slurp(vocab) != old_vocab || test::slurp(merges) != old_merges) return 3;  // the old pair does not fit
  const RunResult r = run("--train-tokenizer --input " + corpus + " --vocab-size 1000 --output-dir " + disk.string());
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(disk)) entries += e.path() == vocab || e.path() == merges ? 1 : 100;
  if (r.code == 0 && entries == 2 && BpeTokenizer::load(vocab, merges).vocab_size() == 1000) return 0;
  const bool one_line = r.output.find('\n') == r.output.size() - 1;
  if (r.code != 0 && one_line && r.output.find("No space left on device") != std::string::npos &&
      r.output.find(disk.string()) != std::string::npos && entries == 2 && test::slurp(vocab) == old_vocab &&
      test::slurp(merges) == old_merges)
    return 1;
  std::fprintf(stderr, "tmpfs of %d KiB: exit %d, output '%s', %zu entries:\n", kib, r.code, r.output.c_str(),
               entries);
  for (const auto& e : fs::directory_iterator(disk))
    std::fprintf(stderr, "  %s (%ju bytes)\n", e.path().c_str(), static_cast<uintmax_t>(e.file_size()));
  return 2;
}

}  // namespace

TEST_CASE("dsprep --train-tokenizer on a full disk keeps the old pair and leaves no temporaries",
          "[small_disk]") {
  REQUIRE(fs::exists(dsprep_path()));
  test::TempDir dir;
  const std::string corpus = dir / "corpus.txt";
  REQUIRE(run("--generate-corpus " + corpus + " --size-mb 0.3 --seed 5").code == 0);
  REQUIRE(run("--train-tokenizer --input " + corpus + " --vocab-size 300 --output-dir " + (dir / "old")).code == 0);
  const std::string old_vocab = test::slurp(dir / "old/vocab.json"), old_merges = test::slurp(dir / "old/merges.txt");
  const fs::path disk = dir / "disk";
  fs::create_directories(disk);
  int failed_cleanly = 0, replaced = 0;
  for (int kib : {16, 24, 32, 40, 48, 56, 64, 4096}) {
    INFO("tmpfs of " << kib << " KiB");
    const int code =
        test::run_on_small_disk(disk, kib, [&] { return train_over_old_pair(disk, kib, corpus, old_vocab, old_merges); });
    if (code == test::kNoSmallDisk) DS_SKIP("cannot mount a small tmpfs here (not root, no user namespaces)");
    CHECK((code <= 1 || code == 3));
    failed_cleanly += code == 1;
    replaced += code == 0;
  }
  CHECK(failed_cleanly >= 2);
  CHECK(replaced >= 1);  // the 4 MiB disk holds it: the test trains a real pair
}
