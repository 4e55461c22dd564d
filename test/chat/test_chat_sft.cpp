// DeepSpeed-Chat's step-1 samples (lib/chat/chat_tokenizer.h) against
// transformers itself: test/chat/sft_ref.py writes tokenizer directories
// (GPT-2's vocabulary as vocab.json + merges.txt and as tokenizer.json, an
// OPT-style one with "</s>" as bos/eos and a bos added first, each also with
// --add_eot_token) and prints the ids and attention mask transformers gives
// each text as DeepSpeed-Chat tokenizes it; ours must be the same, and the
// targets must be the next ids where the mask is 1. Skips without
// transformers (/usr/bin/python3 with .deps/python) or ../shared/data.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/chat/chat_tokenizer.h"
#include "lib/core/error.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string shared_data() {
  const char* src = std::getenv("DS_SOURCE_DIR");
  return (fs::path(src ? src : ".") / ".." / "shared" / "data").string();
}

int reference(const std::string& out_dir, std::vector<std::string>& lines) {
  const char* src = std::getenv("DS_SOURCE_DIR");
  return test::popen_lines("/usr/bin/python3 " + std::string(src ? src : ".") + "/test/chat/sft_ref.py " + out_dir +
                               " " + shared_data() + " 2>/dev/null",
                           lines);
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ds_chat_sft_XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("step-1 samples: the ids, padding and labels transformers gives DeepSpeed-Chat") {
  if (!fs::exists(fs::path(shared_data()) / "gpt2-vocab.json")) DS_SKIP("no ../shared/data/gpt2-vocab.json");
  TempDir tmp;
  std::vector<std::string> lines;
  const int rc = reference(tmp.path.string(), lines);
  if (rc == 77) DS_SKIP("transformers is not importable by /usr/bin/python3 (PYTHONPATH .deps/python)");
  REQUIRE(rc == 0);
  REQUIRE(lines.size() == 60);  // 6 tokenizers x 5 texts x 2 lengths
  std::map<std::string, std::unique_ptr<chat::ChatTokenizer>> loaded;
  int truncated = 0, padded = 0, bos_first = 0;
  for (const std::string& line : lines) {
    const json r = json::parse(line);
    const std::string dir = r["dir"], name = r["name"];
    const std::optional<std::string> eot =
        r["eot"].is_null() ? std::nullopt : std::optional<std::string>(r["eot"].get<std::string>());
    const std::string key = name;
    if (!loaded.count(key))
      loaded[key] = std::make_unique<chat::ChatTokenizer>(chat::ChatTokenizer::load(dir, name, eot));
    const chat::ChatTokenizer& tok = *loaded[key];
    const auto ids = r["ids"].get<std::vector<int32_t>>();
    const auto mask = r["mask"].get<std::vector<int>>();
    const int64_t L = r["max_len"];
    INFO(name << " max_len " << L << " text '" << r["text"].get<std::string>() << "'");
    CHECK(tok.size() == r["size"].get<int64_t>());
    CHECK(tok.eos_id() == r["eos"].get<int32_t>());
    CHECK(tok.pad_id() == r["pad"].get<int32_t>());
    const chat::SftSample s = chat::sft_sample(tok, r["text"].get<std::string>(), L);
    CHECK(s.tokens == ids);
    REQUIRE(s.targets.size() == static_cast<size_t>(L));
    int64_t ones = 0;
    for (int64_t t = 0; t < L; ++t) {
      ones += mask[static_cast<size_t>(t)];
      const int32_t want = t + 1 < L && mask[static_cast<size_t>(t + 1)] ? ids[static_cast<size_t>(t + 1)] : -1;
      CHECK(s.targets[static_cast<size_t>(t)] == want);
    }
    CHECK(s.length == ones);
    truncated += ones == L;
    padded += ones < L;
    bos_first += tok.adds_bos() && ids[0] == tok.bos_id();
  }
  CHECK(truncated >= 6);  // the cases cover both sides of max_seq_len
  CHECK(padded >= 6);
  CHECK(bos_first == 30);  // every OPT-style sample (3 tokenizers) starts with the bos
}

TEST_CASE("the LLaMA rule, unknown special tokens, and missing tokenizers") {
  if (!fs::exists(fs::path(shared_data()) / "gpt2-vocab.json")) DS_SKIP("no ../shared/data/gpt2-vocab.json");
  TempDir tmp;
  const fs::path d = tmp.path / "m";
  fs::create_directories(d);
  fs::copy_file(fs::path(shared_data()) / "gpt2-vocab.json", d / "vocab.json");
  fs::copy_file(fs::path(shared_data()) / "gpt2-merges.txt", d / "merges.txt");
  // A model named like LLaMA gets a new "[PAD]" token; its eos stays eos.
  const chat::ChatTokenizer llama = chat::ChatTokenizer::load(d.string(), "meta-llama/Llama-2-7b-hf");
  CHECK(llama.pad_id() == 50257);
  CHECK(llama.size() == 50258);
  CHECK(llama.encode("a[PAD]b") == std::vector<int32_t>{64, 50257, 65});
  const chat::ChatTokenizer plain = chat::ChatTokenizer::load(d.string(), "gpt2");
  CHECK(plain.pad_id() == plain.eos_id());
  CHECK(plain.size() == 50257);
  CHECK(plain.decode(plain.encode(" hello<|endoftext|> world")) == " hello<|endoftext|> world");
  // Errors: one line naming the directory.
  CHECK_THROWS_WITH(chat::ChatTokenizer::load((tmp.path / "none").string(), "x"), Contains("is not a directory"));
  const fs::path empty = tmp.path / "empty";
  fs::create_directories(empty);
  CHECK_THROWS_WITH(chat::ChatTokenizer::load(empty.string(), "x"), Contains("no tokenizer found"));
  std::ofstream(empty / "tokenizer.model") << "x";
  CHECK_THROWS_WITH(chat::ChatTokenizer::load(empty.string(), "x"), Contains("SentencePiece"));
  std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": "yes"})";
  CHECK_THROWS_WITH(chat::ChatTokenizer::load(d.string(), "x"), Contains("add_bos_token must be true or false"));
  std::ofstream(d / "tokenizer_config.json") << R"({"eos_token": 5})";
  CHECK_THROWS_WITH(chat::ChatTokenizer::load(d.string(), "x"), Contains("a special token must be a string"));
}

// LlamaTokenizer (a model named "llama" with tokenizer.model only): a tiny
// SentencePiece BPE model with byte fallback, legacy and not, against
// transformers' LlamaTokenizer with DeepSpeed-Chat's "[PAD]"
// (test/chat/llama_tok_ref.py).
TEST_CASE("LLaMA's SentencePiece tokenizer: the ids transformers' LlamaTokenizer gives, legacy or not") {
  TempDir tmp;
  std::vector<std::string> lines;
  const char* src = std::getenv("DS_SOURCE_DIR");
  const int rc = test::popen_lines("/usr/bin/python3 " + std::string(src ? src : ".") +
                                       "/test/chat/llama_tok_ref.py " + tmp.path.string() + " 2>/dev/null",
                                   lines);
  if (rc == 77) DS_SKIP("transformers, sentencepiece or protobuf is not importable (PYTHONPATH .deps/python, .deps/llamaref)");
  REQUIRE(rc == 0);
  REQUIRE(lines.size() == 24);  // 2 directories x 6 texts x 2 lengths
  std::map<std::string, std::unique_ptr<chat::ChatTokenizer>> loaded;
  int padded = 0, truncated = 0;
  for (const std::string& line : lines) {
    const json r = json::parse(line);
    const std::string dir = r["dir"];
    if (!loaded.count(dir))
      loaded[dir] = std::make_unique<chat::ChatTokenizer>(chat::ChatTokenizer::load(dir, "meta-llama/Llama-2-7b-hf"));
    const chat::ChatTokenizer& tok = *loaded[dir];
    const int64_t L = r["max_len"];
    INFO(dir << " max_len " << L << " text '" << r["text"].get<std::string>() << "'");
    CHECK(tok.size() == r["size"].get<int64_t>());
    CHECK(tok.eos_id() == r["eos"].get<int32_t>());
    CHECK(tok.pad_id() == r["pad"].get<int32_t>());
    const chat::SftSample s = chat::sft_sample(tok, r["text"].get<std::string>(), L);
    CHECK(s.tokens == r["ids"].get<std::vector<int32_t>>());
    int64_t ones = 0;
    for (int m : r["mask"].get<std::vector<int>>()) ones += m;
    CHECK(s.length == ones);
    padded += ones < L;
    truncated += ones == L;
  }
  CHECK(padded >= 6);
  CHECK(truncated >= 2);
}
