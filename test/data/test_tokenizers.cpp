// Tokenizer interface tests without Python: the hand-written Split patterns on
// hand-checked cases, a tokenizer.json made from GPT-2's files (merges in both
// spellings) against our GPT-2 BPE on tinyshakespeare, and the one-line errors
// for missing, corrupt and unsupported tokenizer files. The reference-library
// comparison is test_tokenizers_ref (tok_check.py).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/data/bpe.h"
#include "lib/data/hf_tokenizer.h"
#include "lib/data/synthetic_corpus.h"
#include "lib/data/tokenizer.h"
#include "test/data/test_util.h"
#include "test/skip.h"

using namespace ds;
using namespace ds::data;
using Catch::Matchers::Contains;

namespace {

std::vector<std::string> split(SplitPattern p, std::string_view s) {
  std::vector<std::string_view> v;
  split_by_pattern(p, s, v);
  return {v.begin(), v.end()};
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE("cl100k and Qwen2 split patterns match the regex on hand-checked cases") {
  CHECK(split(SplitPattern::Cl100k, "Hello world's") == V{"Hello", " world", "'s"});
  CHECK(split(SplitPattern::Cl100k, "I'M YOU'RE") == V{"I", "'M", " YOU", "'RE"});
  CHECK(split(SplitPattern::Cl100k, "1234567 x") == V{"123", "456", "7", " x"});
  CHECK(split(SplitPattern::Qwen2, "123 x") == V{"1", "2", "3", " x"});
  CHECK(split(SplitPattern::Cl100k, "a  b") == V{"a", " ", " b"});
  CHECK(split(SplitPattern::Cl100k, "a\n\n  b") == V{"a", "\n\n", " ", " b"});
  CHECK(split(SplitPattern::Cl100k, "x   ") == V{"x", "   "});
  CHECK(split(SplitPattern::Cl100k, " ...\n\nz") == V{" ...\n\n", "z"});
  CHECK(split(SplitPattern::Cl100k, "(hello)") == V{"(hello", ")"});
  CHECK(split(SplitPattern::Cl100k, "\t9") == V{"\t", "9"});
  CHECK(split(SplitPattern::Cl100k, "caf\xc3\xa9!") == V{"caf\xc3\xa9", "!"});
  CHECK(split(SplitPattern::Gpt2, "it's  ok") == V{"it", "'s", " ", " ok"});
  CHECK(parse_split_pattern(split_pattern_regex(SplitPattern::Cl100k), "f") == SplitPattern::Cl100k);
  CHECK_THROWS_WITH(parse_split_pattern("\\w+", "tok.json"), Contains("tok.json") && Contains("pattern (3 bytes)"));
}

TEST_CASE("a tokenizer.json from GPT-2's files encodes as the GPT-2 BPE", "[shared_data]") {
  const std::string data = test::shared_data_dir();
  if (data.empty()) DS_SKIP("../shared/data not found");
  test::TempDir dir;
  const nlohmann::json vocab = nlohmann::json::parse(test::slurp(data + "/gpt2-vocab.json"));
  std::istringstream merges_in(test::slurp(data + "/gpt2-merges.txt"));
  nlohmann::json merges_str = nlohmann::json::array(), merges_pair = nlohmann::json::array();
  std::string line;
  while (std::getline(merges_in, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges_str.push_back(line);
    merges_pair.push_back({line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1)});
  }
  const Tokenizer* ref_tok = nullptr;
  auto gpt2 = load_tokenizer({TokenizerKind::GPT2BPE, "", data + "/gpt2-vocab.json", data + "/gpt2-merges.txt"});
  ref_tok = gpt2.get();
  const std::string text = test::slurp(data + "/tinyshakespeare.txt") + " <|endoftext|> caf\xc3\xa9 \xf0\x9f\x91\x8d";
  for (const nlohmann::json& merges : {merges_str, merges_pair}) {
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"added_tokens", nlohmann::json::array()}};
    test::spit(dir / "tokenizer.json", j.dump());
    auto hf = load_tokenizer({TokenizerKind::HF, dir.path(), "", ""});
    CHECK(hf->info().vocab_size == 50257);
    CHECK(hf->info().eos_id == 50256);
    const std::vector<int32_t> ids = hf->encode(text);
    CHECK(ids == ref_tok->encode(text));  // "<|endoftext|>" is plain text without an added token
    CHECK(hf->decode(ids) == text);
  }
  CHECK(ref_tok->info().eod_id == 50256);
  CHECK(ref_tok->info().bos_id == 50256);
}

TEST_CASE("tokenizer errors name the file or flag") {
  test::TempDir dir;
  auto fails = [](const TokenizerSpec& s, const std::string& needle) {
    CHECK_THROWS_AS(load_tokenizer(s), UserError);
    CHECK_THROWS_WITH(load_tokenizer(s), Contains(needle));
  };
  fails({TokenizerKind::HF, "", "", ""}, "--tokenizer-model");
  fails({TokenizerKind::Llama2, "", "", ""}, "--tokenizer-model");
  fails({TokenizerKind::HF, dir / "missing.json", "", ""}, "missing.json");
  fails({TokenizerKind::GPT2BPE, "", dir / "v.json", ""}, "--vocab-file");
  test::spit(dir / "bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": [1]}}");
  fails({TokenizerKind::HF, dir / "bad.json", "", ""}, "bad.json");
  test::spit(dir / "trunc.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  fails({TokenizerKind::HF, dir / "trunc.json", "", ""}, "trunc.json");
  test::spit(dir / "wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  fails({TokenizerKind::HF, dir / "wp.json", "", ""}, "WordPiece");
  test::spit(dir / "re.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": false}})");
  fails({TokenizerKind::HF, dir / "re.json", "", ""}, "pattern (6 bytes)");
  test::spit(dir / "merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
  fails({TokenizerKind::HF, dir / "merge.json", "", ""}, "model.merges entry 1: its second token");
  test::spit(dir / "tokenizer.model", "this is not a protobuf");
  fails({TokenizerKind::GPTSentencePiece, dir / "tokenizer.model", "", ""}, "tokenizer.model");
  if (have_sentencepiece()) {  // a model with a zero-length piece made the library throw its own exception
    const char* src = std::getenv("DS_SOURCE_DIR");
    const std::string crash = std::string(src ? src : ".") + "/fuzz/corpus/sp_model/crash-zero-length-piece";
    fails({TokenizerKind::GPTSentencePiece, crash, "", ""}, "crash-zero-length-piece: not a readable SentencePiece");
  }
  CHECK_THROWS_WITH(parse_tokenizer_kind("NullTokenizer"), Contains("--tokenizer-type NullTokenizer"));
  CHECK_THROWS_WITH(parse_tokenizer_kind("Bogus", "--x"), Contains("--x Bogus"));
}

// A tokenizer file that is a directory, a FIFO or a device (/dev/zero would
// be an unbounded read) is refused by name before anything is read from it,
// for every file of every kind: vocab.json, merges.txt, tokenizer.model,
// tokenizer.json.
TEST_CASE("tokenizer files must be regular files of bounded size") {
  test::TempDir dir;
  const TrainedBpe bpe = train_bpe(generate_corpus(1, 20000), 300);
  write_bpe_files(bpe, dir / "vocab.json", dir / "merges.txt");
  const std::string vocab = dir / "vocab.json", merges = dir / "merges.txt";
  const std::string sub = dir / "sub", fifo = dir / "fifo";
  std::filesystem::create_directory(sub);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: reading would wait forever
  auto refused = [](const TokenizerSpec& s, const std::string& file, const std::string& kind) {
    INFO(file);
    CHECK_THROWS_WITH(load_tokenizer(s), Contains("'" + file + "' is not a regular file (it is " + kind + ")"));
  };
  for (const auto& [bad, kind] : {std::pair<std::string, std::string>{sub, "a directory"}, {fifo, "a FIFO"},
                                  {"/dev/zero", "a character device"}}) {
    refused({TokenizerKind::GPT2BPE, "", bad, merges}, bad, kind);
    refused({TokenizerKind::GPT2BPE, "", vocab, bad}, bad, kind);
    if (bad != sub) refused({TokenizerKind::HF, bad, "", ""}, bad, kind);  // a directory: its tokenizer.json
    if (have_sentencepiece()) refused({TokenizerKind::Llama2, bad, "", ""}, bad, kind);
  }
  const std::string hf = dir / "hf";
  std::filesystem::create_directories(hf + "/tokenizer.json");
  refused({TokenizerKind::HF, hf, "", ""}, hf + "/tokenizer.json", "a directory");
  CHECK(kMaxTokenizerFileBytes == size_t(1) << 30);
  CHECK(load_tokenizer({TokenizerKind::GPT2BPE, "", vocab, merges})->info().vocab_size > 256);
}

// A tokenizer path may name a file that is no tokenizer at all (a key, a
// password file): errors name the file and where it went wrong, never its text.
TEST_CASE("tokenizer errors never echo the file's text") {
  test::TempDir dir;
  auto no_echo = [](const TokenizerSpec& s, const std::string& file) {
    try {
      load_tokenizer(s);
      FAIL("expected UserError");
    } catch (const UserError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(file) != std::string::npos);
      CHECK(msg.find("SECRET") == std::string::npos);
      CHECK(msg.find("hunter2") == std::string::npos);
    }
  };
  const TrainedBpe bpe = train_bpe(generate_corpus(1, 20000), 300);
  write_bpe_files(bpe, dir / "vocab.json", dir / "merges.txt");
  const std::string merges = dir / "merges.txt", vocab = dir / "vocab.json";
  test::spit(dir / "passwd", "root:SECRET-hunter2:0:0:root:/root:/bin/bash\n");
  no_echo({TokenizerKind::GPT2BPE, "", dir / "passwd", merges}, dir / "passwd");
  no_echo({TokenizerKind::HF, dir / "passwd", "", ""}, dir / "passwd");
  test::spit(dir / "notes.json", "{\"k\": \"SECRET-hunter2");  // the JSON parser quotes what it last read
  no_echo({TokenizerKind::GPT2BPE, "", dir / "notes.json", merges}, dir / "notes.json");
  no_echo({TokenizerKind::HF, dir / "notes.json", "", ""}, dir / "notes.json");
  test::spit(dir / "key.json", R"({"type": "service_account", "private_key": "SECRET-hunter2"})");
  no_echo({TokenizerKind::GPT2BPE, "", dir / "key.json", merges}, dir / "key.json");
  test::spit(dir / "lines.txt", "SECRET-hunter2\n");
  no_echo({TokenizerKind::GPT2BPE, "", vocab, dir / "lines.txt"}, dir / "lines.txt");
  test::spit(dir / "pair.txt", "SECRET hunter2\n");
  no_echo({TokenizerKind::GPT2BPE, "", vocab, dir / "pair.txt"}, dir / "pair.txt");
  for (const char* doc : {
           R"({"model": {"type": "SECRET-hunter2", "vocab": {}}})",
           R"({"model": {"type": "BPE", "vocab": {"SECRET": "hunter2"}}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["SECRET hunter2"]}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["SECRET", "hunter2"]]}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}, "dropout": "SECRET-hunter2"}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"content": "SECRET-hunter2"}]})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "SECRET-hunter2"}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split",
               "pattern": {"Regex": "SECRET-hunter2"}, "behavior": "Isolated"}})",
           R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel",
               "use_regex": "SECRET-hunter2"}})"}) {
    test::spit(dir / "tokenizer.json", doc);
    no_echo({TokenizerKind::HF, dir / "tokenizer.json", "", ""}, dir / "tokenizer.json");
  }
}

namespace {

// A SentencePiece model trained by spm_train on `corpus`; "" where it cannot be.
std::string train_sp(const test::TempDir& dir, const std::string& corpus, const std::string& name,
                     const std::string& flags) {
  const std::string cmd = "spm_train --input=" + corpus + " --model_prefix=" + (dir / name) +
                          " --vocab_size=400 --minloglevel=2 " + flags + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? dir / (name + ".model") : std::string();
}

// spm_encode's ids for `text` encoded whole (one line, no newline in it).
std::vector<int32_t> spm_encode_whole(const test::TempDir& dir, const std::string& model, const std::string& text) {
  test::spit(dir / "whole.txt", text + "\n");
  const std::string cmd = "spm_encode --model=" + model + " --output_format=id < " + (dir / "whole.txt") + " > " +
                          (dir / "whole.ids");
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::istringstream in(test::slurp(dir / "whole.ids"));
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

}  // namespace

// Long SentencePiece text is encoded in pieces (bounded memory): for a BPE
// model the ids equal encoding the text whole; a unigram model's round-trip;
// a stretch without a cut, or a model whose pieces span spaces, is refused
// above kSpMaxPieceBytes with one line.
TEST_CASE("SentencePiece encodes long text in exact pieces and refuses what it cannot cut", "[sentencepiece]") {
  if (!have_sentencepiece()) DS_SKIP("this build has no SentencePiece library");
  if (std::system("command -v spm_train >/dev/null && command -v spm_encode >/dev/null") != 0)
    DS_SKIP("spm_train / spm_encode not found (Debian package sentencepiece)");
  test::TempDir dir;
  std::string corpus = generate_corpus(5, 300000);
  test::spit(dir / "c.txt", corpus);
  const std::string bpe = train_sp(dir, dir / "c.txt", "bpe", "--model_type=bpe");
  const std::string uni = train_sp(dir, dir / "c.txt", "uni", "--model_type=unigram");
  const std::string span = train_sp(dir, dir / "c.txt", "span", "--model_type=bpe --split_by_whitespace=false");
  REQUIRE(!bpe.empty());
  REQUIRE(!uni.empty());
  REQUIRE(!span.empty());
  std::string line;  // one line of about 2.5 pieces: the corpus' words joined by single spaces
  for (char c : corpus) {
    const bool space = c == ' ' || c == '\n';
    if (!space) line += c;
    else if (!line.empty() && line.back() != ' ') line += ' ';
  }
  std::string doc;
  while (doc.size() < kSpPieceBytes * 5 / 2) doc += line;
  auto tok = [](const std::string& m) { return load_tokenizer({TokenizerKind::GPTSentencePiece, m, "", ""}); };
  const auto b = tok(bpe);
  // (Compared as bools: Catch would print megabytes on a failure.)
  const bool bpe_exact = b->encode(doc) == spm_encode_whole(dir, bpe, doc);
  CHECK(bpe_exact);
  // Unigram: the same text back as from the whole-text ids (the ids themselves may differ
  // at near-ties, where the whole text's float path scores decide; docs/tokenizers.md).
  const auto u = tok(uni);
  const bool uni_text = u->decode(u->encode(doc)) == u->decode(spm_encode_whole(dir, uni, doc));
  CHECK(uni_text);
  // No space to cut at over more than the limit: one line naming the stretch and the limit.
  const std::string solid(kSpMaxPieceBytes + 10, 'x');
  CHECK_THROWS_WITH(b->encode("a b " + solid), Contains(fmt::format("{} bytes from byte 4 hold no single space",
                                                                    solid.size())) && Contains("at most 4 MiB"));
  // Pieces that span spaces: encoded whole up to the limit, refused above it.
  const auto s = tok(span);
  const std::string mid = doc.substr(0, kSpPieceBytes * 3 / 2);
  const bool span_whole = s->encode(mid) == spm_encode_whole(dir, span, mid);
  CHECK(span_whole);
  std::string big = doc;
  while (big.size() <= kSpMaxPieceBytes) big += line;
  CHECK_THROWS_WITH(s->encode(big), Contains("its pieces span spaces") && Contains(std::to_string(big.size())));
}
