// Tests of the GPT-2 byte-level BPE: byte map, pre-tokenizer, exact ids with the
// GPT-2 files (skipped when ../shared/data is absent), tinyshakespeare round trip
// and speed, and the trainer's files round trip through the loader.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/data/bpe.h"
#include "lib/data/synthetic_corpus.h"
#include "lib/data/unicode_class.h"
#include "test/data/test_util.h"
#include "test/skip.h"

using namespace ds;
using namespace ds::data;
using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

namespace {

Pieces pieces(std::string_view s) {
  Pieces out;
  for (std::string_view p : pretokenize(s)) out.emplace_back(p);
  return out;
}

std::string cp_utf8(uint32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

// Loads the GPT-2 files, or returns false after printing why the test skips.
bool gpt2_files(std::string* vocab, std::string* merges) {
  const std::string dir = test::shared_data_dir();
  *vocab = dir + "/gpt2-vocab.json";
  *merges = dir + "/gpt2-merges.txt";
  if (dir.empty() || !std::filesystem::exists(*vocab) || !std::filesystem::exists(*merges)) {
    test::note_skip("GPT-2 vocab/merges not found under $DS_SOURCE_DIR/../shared/data");
    return false;
  }
  return true;
}

// Reference encoder for the trainer round trip: applies every merge in rank
// order to the whole word, exactly as training did.
Ids naive_encode(const TrainedBpe& bpe, std::string_view word) {
  std::array<int32_t, 256> id_of_byte{};
  for (int i = 0; i < 256; ++i) id_of_byte[gpt2_byte_order()[i]] = i;
  Ids sym;
  for (unsigned char c : word) sym.push_back(id_of_byte[c]);
  for (size_t r = 0; r < bpe.merges.size() && sym.size() > 1; ++r) {
    auto [a, b] = bpe.merges[r];
    Ids next;
    for (size_t k = 0; k < sym.size();) {
      if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
        next.push_back(static_cast<int32_t>(256 + r));
        k += 2;
      } else {
        next.push_back(sym[k++]);
      }
    }
    sym.swap(next);
  }
  return sym;
}

}  // namespace

TEST_CASE("byte to unicode map matches GPT-2") {
  const auto& m = byte_to_unicode();
  REQUIRE(m['A'] == 'A');
  REQUIRE(m[' '] == 0x120);   // "Ġ"
  REQUIRE(m['\n'] == 0x10a);  // "Ċ"
  REQUIRE(m[0] == 0x100);
  REQUIRE(m[0xad] == 0x143);
  REQUIRE(gpt2_byte_order()[0] == '!');
  REQUIRE(gpt2_byte_order()[188] == 0);
  std::string bytes;
  REQUIRE(token_name_to_bytes(bytes_to_token_name(" hello\n\xff"), &bytes));
  REQUIRE(bytes == " hello\n\xff");
  REQUIRE_FALSE(token_name_to_bytes("\xe6\x9d\xb1", &bytes));  // a CJK character
}

TEST_CASE("unicode classes and utf-8 decoding") {
  REQUIRE(char_class(0xe9) == CharClass::Letter);    // é
  REQUIRE(char_class(0x6771) == CharClass::Letter);  // CJK
  REQUIRE(char_class(0x301) == CharClass::Other);    // combining acute: a mark
  REQUIRE(char_class(0xbd) == CharClass::Number);    // ½
  REQUIRE(char_class(0x663) == CharClass::Number);   // Arabic-Indic three
  REQUIRE(char_class(0xa0) == CharClass::Space);
  REQUIRE(char_class(0x3000) == CharClass::Space);
  REQUIRE(char_class(0x1f600) == CharClass::Other);  // emoji
  uint32_t cp;
  REQUIRE(utf8_decode("\xe6\x9d\xb1", 0, &cp) == 3);
  REQUIRE(cp == 0x6771);
  REQUIRE(utf8_decode("\xc0\xaf", 0, &cp) == 1);  // overlong
  REQUIRE(cp == 0xfffd);
  REQUIRE(utf8_decode("\xe6\x9d", 0, &cp) == 1);  // truncated
}

TEST_CASE("pre-tokenizer reproduces GPT-2's regex") {
  REQUIRE(pieces("Hello world") == Pieces{"Hello", " world"});
  REQUIRE(pieces("I'm here, aren't you?  Yes!\n\nOK") ==
          Pieces{"I", "'m", " here", ",", " aren", "'t", " you", "?", " ", " Yes", "!", "\n",
                 "\n", "OK"});
  REQUIRE(pieces("   x  ") == Pieces{"  ", " x", "  "});
  REQUIRE(pieces("a\t\tb \n") == Pieces{"a", "\t", "\t", "b", " \n"});
  REQUIRE(pieces("it's 'sup ''s") == Pieces{"it", "'s", " '", "sup", " ''", "s"});
  REQUIRE(pieces("na\xc3\xafve caf\xc3\xa9 42nd \xc2\xbd x\xc2\xb2") ==
          Pieces{"na\xc3\xafve", " caf\xc3\xa9", " 42", "nd", " \xc2\xbd", " x", "\xc2\xb2"});
  REQUIRE(pieces("hi!!! ...?") == Pieces{"hi", "!!!", " ...?"});
  REQUIRE(pieces("a \xc2\xa0" "b") == Pieces{"a", " ", "\xc2\xa0", "b"});
  const std::string acute = cp_utf8(0x301);  // a combining mark is not a letter
  std::string decomposed = "e";
  decomposed += acute;
  decomposed += "t\xc3\xa9";
  REQUIRE(pieces(decomposed) == Pieces{"e", acute, "t\xc3\xa9"});
  REQUIRE(pieces("").empty());
}

TEST_CASE("GPT-2 vocabulary gives GPT-2's ids", "[shared_data]") {
  std::string vocab, merges;
  if (!gpt2_files(&vocab, &merges)) return;
  BpeTokenizer tok = BpeTokenizer::load(vocab, merges);
  REQUIRE(tok.vocab_size() == 50257);
  REQUIRE(tok.eod_id() == 50256);
  REQUIRE(tok.num_merges() == 50000);
  REQUIRE(tok.encode("Hello world") == Ids{15496, 995});
  REQUIRE(tok.encode("I'm here, aren't you?  Yes!\n\nOK") ==
          Ids{40, 1101, 994, 11, 3588, 470, 345, 30, 220, 3363, 0, 198, 198, 11380});
  REQUIRE(tok.encode("The year 2024 had 365 days.") == Ids{464, 614, 48609, 550, 21268, 1528, 13});
  REQUIRE(tok.encode("   leading spaces and trailing   ") ==
          Ids{220, 220, 3756, 9029, 290, 25462, 220, 220, 220});
  REQUIRE(tok.encode("GPT-2's tokenizer: \"quotes\", tabs\tand\r\nCRLF") ==
          Ids{38, 11571, 12, 17, 338, 11241, 7509, 25, 366, 421, 6421, 1600, 22524, 197, 392,
              201, 198, 34, 7836, 37});
  const std::string intl = "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac "
                           "\xc3\xbcn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9";
  const Ids intl_ids{2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 6184, 120, 77,
                     26884, 66, 9101, 67, 2634};
  REQUIRE(tok.encode(intl) == intl_ids);
  REQUIRE(tok.decode(intl_ids) == intl);
  // The end-of-text string in raw text is ordinary text, not the special id.
  REQUIRE(tok.encode(kEndOfText) == Ids{27, 91, 437, 1659, 5239, 91, 29});
  REQUIRE(tok.token_id("\xc4\xa0the") == 262);  // "Ġthe"
  REQUIRE(tok.decode(Ids{15496, 995, 50256}) == std::string("Hello world") + kEndOfText);
}

TEST_CASE("tinyshakespeare round trips quickly with GPT-2's token count", "[shared_data]") {
  std::string vocab, merges;
  if (!gpt2_files(&vocab, &merges)) return;
  const std::string path = test::shared_data_dir() + "/tinyshakespeare.txt";
  if (!std::filesystem::exists(path)) DS_SKIP("tinyshakespeare.txt not found");
  BpeTokenizer tok = BpeTokenizer::load(vocab, merges);
  const std::string text = test::slurp(path);
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("tokenized " << text.size() << " bytes into " << ids.size() << " tokens in " << secs
                    << " s");
  // Reference values from GPT-2's own encoder on the same file.
  REQUIRE(ids.size() == 338025);
  int64_t sum = 0, weighted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    sum += ids[i];
    weighted = (weighted + static_cast<int64_t>(i + 1) * ids[i]) % 1000000007;
  }
  REQUIRE(sum == 1405356689);
  REQUIRE(weighted == 864505947);
  REQUIRE(tok.decode(ids) == text);
  REQUIRE(secs < 5.0);
}

TEST_CASE("trained vocabulary round trips through vocab.json and merges.txt") {
  test::TempDir dir;
  const std::string corpus = generate_corpus(7, 200000);
  const TrainedBpe bpe = train_bpe(corpus, 700);
  REQUIRE(bpe.tokens.size() == 700);
  REQUIRE(bpe.merges.size() == 700 - 257);
  REQUIRE(bpe.tokens.back() == kEndOfText);
  // Deterministic.
  const TrainedBpe again = train_bpe(corpus, 700);
  REQUIRE(again.merges == bpe.merges);

  write_bpe_files(bpe, dir / "tok/vocab.json", dir / "tok/merges.txt");
  REQUIRE(test::slurp(dir / "tok/merges.txt").rfind("#version: 0.2\n", 0) == 0);
  BpeTokenizer tok = BpeTokenizer::load(dir / "tok/vocab.json", dir / "tok/merges.txt");
  REQUIRE(tok.vocab_size() == 700);
  REQUIRE(tok.eod_id() == 699);
  for (int32_t id = 0; id < 699; ++id) REQUIRE(tok.token_bytes(id) == bpe.tokens[id]);

  const std::string sample = corpus.substr(0, 20000) + " unseen w\xc3\xb6rds & \xf0\x9f\x98\x80\n";
  const Ids ids = tok.encode(sample);
  REQUIRE(tok.decode(ids) == sample);
  REQUIRE(static_cast<double>(sample.size()) / ids.size() > 2.5);  // it compresses
  Ids naive;
  for (std::string_view w : pretokenize(sample)) {
    Ids part = naive_encode(bpe, w);
    naive.insert(naive.end(), part.begin(), part.end());
  }
  REQUIRE(ids == naive);
  REQUIRE(tok.encode(" the").size() == 1);  // a frequent word is one token
}

// vocab.json text with one more token that reuses id 0.
std::string slurp_vocab_with_duplicate(std::string text) {
  return "{\"dupe-token\": 0, " + text.substr(text.find('{') + 1);
}

TEST_CASE("bad tokenizer files give one-line errors naming the file") {
  test::TempDir dir;
  auto expect = [](auto f, const std::string& needle) {
    try {
      f();
      FAIL("expected UserError");
    } catch (const UserError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  const TrainedBpe bpe = train_bpe(generate_corpus(1, 20000), 300);
  write_bpe_files(bpe, dir / "vocab.json", dir / "merges.txt");
  expect([&] { BpeTokenizer::load(dir / "nope.json", dir / "merges.txt"); }, dir / "nope.json");
  test::spit(dir / "broken.json", "{\"a\": 1,");
  expect([&] { BpeTokenizer::load(dir / "broken.json", dir / "merges.txt"); },
         dir / "broken.json");
  test::spit(dir / "small.json", "{\"a\": 0}");
  expect([&] { BpeTokenizer::load(dir / "small.json", dir / "merges.txt"); }, "byte 0x");
  test::spit(dir / "bad_merges.txt", "#version: 0.2\nzzzz qqqq\n");
  expect([&] { BpeTokenizer::load(dir / "vocab.json", dir / "bad_merges.txt"); },
         dir / "bad_merges.txt line 2");
  REQUIRE_THROWS_AS(train_bpe("abc", 100), UserError);

  // Ids outside int32 are errors naming the entry, never a wrapped size.
  for (const char* id : {"4294967296", "2147483647", "18446744073709551615", "-1", "1.5"}) {
    INFO(id);
    test::spit(dir / "big.json", std::string("{\"a\": 0, \"b\": ") + id + "}");
    expect([&] { BpeTokenizer::load(dir / "big.json", dir / "merges.txt"); }, "entry 2 (in key order) has");
    expect([&] { vocab_file_size(dir / "big.json"); }, "entry 2 (in key order) has");
  }
  // A sparse id would make the tokenizer allocate for every id below it.
  test::spit(dir / "sparse.json", "{\"a\": 0, \"b\": 2000000000}");
  expect([&] { vocab_file_size(dir / "sparse.json"); }, "unused ids");
  test::spit(dir / "dup.json", std::string(slurp_vocab_with_duplicate(test::slurp(dir / "vocab.json"))));
  expect([&] { BpeTokenizer::load(dir / "dup.json", dir / "merges.txt"); }, "is given to two tokens");
  REQUIRE(vocab_file_size(dir / "vocab.json") == static_cast<int64_t>(bpe.tokens.size()));
  // 70,000 nested brackets: one line naming the file, no stack overflow.
  test::spit(dir / "deep.json", std::string(70000, '[') + std::string(70000, ']'));
  expect([&] { BpeTokenizer::load(dir / "deep.json", dir / "merges.txt"); }, dir / "deep.json");
  expect([&] { vocab_file_size(dir / "deep.json"); }, "deeper than 64 levels");
}
