// dstrain with --tokenizer-type HFTokenizer: the vocabulary size and special
// ids come from tokenizer.json, training runs, and a checkpoint saved with one
// vocabulary does not resume with another (one error naming both sizes).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/core/error.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
namespace fs = std::filesystem;

namespace {

// The fixture's GPT-2 files as a tokenizer.json, plus one more special token.
fs::path write_tokenizer_json() {
  const fs::path dir = fixture().dir / "hf_tok";
  fs::create_directories(dir);
  std::ifstream vf(fixture().dir / "tok/vocab.json"), mf(fixture().dir / "tok/merges.txt");
  const nlohmann::json vocab = nlohmann::json::parse(vf);
  nlohmann::json merges = nlohmann::json::array();
  for (std::string line; std::getline(mf, line);)
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  const int n = static_cast<int>(vocab.size());
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                      {"added_tokens",
                       {{{"id", vocab["<|endoftext|>"]}, {"content", "<|endoftext|>"}, {"special", true}},
                        {{"id", n}, {"content", "<|pad|>"}, {"special", true}}}}};
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return dir;
}

}  // namespace

TEST_CASE("dstrain trains with an HFTokenizer and refuses a checkpoint of another vocabulary") {
  const fs::path tok = write_tokenizer_json();
  const fs::path save = fixture().dir / "ckpt_tok";
  fs::remove_all(save);
  const std::vector<std::string> hf = {"--vocab-file", "", "--merge-file", "", "--tokenizer-type", "HFTokenizer",
                                       "--tokenizer-model", tok.string()};
  std::vector<std::string> extra = hf;
  extra.insert(extra.end(), {"--train-iters", "3"});
  TrainConfig cfg = make_config(extra);
  Trainer t(cfg, single_process());
  const std::vector<float> losses = t.run();
  REQUIRE(losses.size() == 3);
  CHECK(std::isfinite(losses.back()));

  train({"--train-iters", "3", "--save", save.string()});  // GPT-2 files: one id fewer
  extra = hf;
  extra.insert(extra.end(), {"--train-iters", "3", "--load", save.string()});
  try {
    Trainer resumed(make_config(extra), single_process());
    resumed.run();
    FAIL("expected a vocabulary mismatch error");
  } catch (const UserError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("vocabulary of 320 tokens") != std::string::npos);
    CHECK(msg.find("has 321") != std::string::npos);
    CHECK(msg.find("--tokenizer-model") != std::string::npos);
  }
}
