// dstrain's tokenizer flags: --tokenizer-type / --tokenizer-model map onto the
// data section, are checked together, and resolve_vocab takes the vocabulary
// size and the special ids (TrainConfig::data.tokenizer) from the files.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "test/config/temp_dir.h"

using namespace ds;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

using test::TempDir;

TrainConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), {"dstrain", "--micro-batch-size", "2", "--train-iters", "10"});
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  return parse_train_config(static_cast<int>(args.size()), argv.data(), 1);
}

// A small byte-level tokenizer.json: 256 bytes, one merge, two special tokens.
void write_tokenizer_json(const std::string& dir) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab["<b" + std::to_string(b) + ">"] = b;  // names do not matter here
  vocab["ab"] = 256;
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
            {"added_tokens",
             {{{"id", 257}, {"content", "<|begin_of_text|>"}, {"special", true}},
              {{"id", 258}, {"content", "<|end_of_text|>"}, {"special", true}}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump();
}

}  // namespace

TEST_CASE("--tokenizer-type and --tokenizer-model give the vocabulary and special ids") {
  TempDir d;
  write_tokenizer_json(d.path);
  TrainConfig c = parse({"--tokenizer-type", "HFTokenizer", "--tokenizer-model", d.path,
                         "--make-vocab-size-divisible-by", "128"});
  CHECK(c.data.tokenizer_type == data::TokenizerKind::HF);
  CHECK(c.data.tokenizer_model == d.path);
  resolve_vocab(c);
  CHECK(c.model.vocab_size == 259);
  CHECK(c.model.padded_vocab_size == 384);
  CHECK(c.data.tokenizer.bos_id == 257);
  CHECK(c.data.tokenizer.eos_id == 258);
  CHECK(c.data.tokenizer.eod_id == 258);
  CHECK(c.resolved["data"]["tokenizer_type"] == "HFTokenizer");
  // The type is read once into its kind, whatever its case; the resolved
  // config (saved in checkpoints) writes the canonical name.
  TrainConfig lower = parse({"--tokenizer-type", "hftokenizer", "--tokenizer-model", d.path});
  CHECK(lower.data.tokenizer_type == data::TokenizerKind::HF);
  CHECK(lower.resolved["data"]["tokenizer_type"] == "HFTokenizer");
  CHECK(parse({}).resolved["data"]["tokenizer_type"] == "");

  TrainConfig wrong = parse({"--tokenizer-type", "HFTokenizer", "--tokenizer-model", d.path});
  wrong.model.vocab_size = 1000;
  CHECK_THROWS_WITH(resolve_vocab(wrong), Contains("model.vocab_size 1000") && Contains("--tokenizer-model"));
}

TEST_CASE("tokenizer flag errors name the flags") {
  CHECK_THROWS_WITH(parse({"--tokenizer-type", "Llama2Tokenizer"}), Contains("--tokenizer-model"));
  CHECK_THROWS_WITH(parse({"--tokenizer-model", "t.model"}), Contains("--tokenizer-type"));
  CHECK_THROWS_WITH(parse({"--tokenizer-type", "GPT2BPETokenizer", "--tokenizer-model", "t.model"}),
                    Contains("--vocab-file"));
  CHECK_THROWS_AS(parse({"--tokenizer-type", "NullTokenizer"}), std::exception);
  TrainConfig c = parse({"--tokenizer-type", "HFTokenizer", "--tokenizer-model", "/nonexistent/tok"});
  CHECK_THROWS_WITH(resolve_vocab(c), Contains("/nonexistent/tok"));
}
