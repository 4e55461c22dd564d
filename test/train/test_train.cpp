// End-to-end trainer tests on a generated corpus: falling loss, bit-identical
// determinism, exact resume (2N steps == N + resume + N), preset configs
// parse, and bad inputs fail with one clear error and write nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lib/core/error.h"
#include "test/train/train_fixture.h"

using namespace ds;
namespace fs = std::filesystem;

using namespace ds::test;

TEST_CASE("loss falls on the generated corpus (gpt2 and llama)") {
  for (const char* family : {"gpt2", "llama"}) {
    std::vector<std::string> extra = {"--train-iters", "80"};
    if (std::string(family) == "llama")
      for (const std::string& f : llama_flags()) extra.push_back(f);
    std::vector<float> l = train(extra);
    REQUIRE(l.size() == 80);
    INFO(family << ": first " << l.front() << " last " << l.back());
    REQUIRE(l.front() > 5.0f);           // ~ln(320) at init
    REQUIRE(l.back() < l.front() - 1.2f);
  }
}

TEST_CASE("same seed and config give bit-identical losses") {
  std::vector<float> a = train({"--train-iters", "6"});
  std::vector<float> b = train({"--train-iters", "6"});
  REQUIRE(a == b);
  std::vector<float> c = train({"--train-iters", "6", "--seed", "99"});
  REQUIRE(a != c);
}

TEST_CASE("2N steps equal N steps + resume + N steps, bit for bit") {
  fs::path ck = fixture().dir / "ckpt_resume";
  fs::remove_all(ck);
  std::vector<float> full = train({"--train-iters", "8"});
  std::vector<float> first = train({"--train-iters", "8", "--exit-interval", "4", "--save", ck.string(),
                                    "--save-interval", "4"});
  REQUIRE(first.size() == 4);
  REQUIRE(fs::exists(ck / "latest"));
  std::vector<float> second = train({"--train-iters", "8", "--load", ck.string()});
  REQUIRE(second.size() == 4);
  first.insert(first.end(), second.begin(), second.end());
  REQUIRE(first == full);
}

TEST_CASE("preset configs parse") {
  std::string src = std::getenv("DS_SOURCE_DIR");
  for (const char* f : {"demo", "gpt2-124m", "gpt2-350m", "gpt2-1.3b", "llama-1b"}) {
    std::string path = src + "/configs/" + f + ".json";
    std::vector<std::string> args = {"dstrain", "--config", path};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    INFO(path);
    TrainConfig c = parse_train_config(static_cast<int>(argv.size()), argv.data(), 1);
    REQUIRE(c.train_iters > 0);
  }
}

TEST_CASE("bad inputs give one clear error and write nothing") {
  fs::path save = fixture().dir / "must_not_exist";
  auto expect_error = [&](std::vector<std::string> extra, const std::string& needle) {
    extra.insert(extra.end(), {"--train-iters", "4", "--save", save.string()});
    try {
      Trainer t(make_config(extra), single_process());
      t.run();
      FAIL("expected an error mentioning " << needle);
    } catch (const UserError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(needle) != std::string::npos);
    }
    REQUIRE_FALSE(fs::exists(save));
  };
  expect_error({"--data-path", (fixture().dir / "nope").string()}, "nope");
  expect_error({"--global-batch-size", "6"}, "6");
  expect_error({"--seq-length", "64"}, "max");
  // A vocabulary smaller than the dataset's token ids.
  fs::path small = fixture().dir / "small_vocab.json";
  {
    std::ofstream f(small);
    f << R"({"a": 0, "b": 1, "c": 2})";
  }
  expect_error({"--vocab-file", small.string()}, "vocab");
}
