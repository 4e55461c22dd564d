// End-to-end trainer tests on a generated corpus: falling loss, bit-identical
// determinism, exact resume (2N steps == N + resume + N), preset configs
// parse, and bad inputs fail with one clear error and write nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/parallel/comms.h"
#include "lib/train/config.h"
#include "lib/train/trainer.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

// A corpus, tokenizer and dataset made once per test binary.
struct Fixture {
  fs::path dir;
  Fixture() {
    dir = fs::temp_directory_path() / ("dstrain_train_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string bin = std::string(std::getenv("DS_BINARY_DIR")) + "/apps/dsprep/dsprep";
    std::string d = dir.string();
    auto sh = [](const std::string& c) { REQUIRE(std::system((c + " > /dev/null").c_str()) == 0); };
    sh(bin + " --generate-corpus " + d + "/corpus.txt --size-mb 0.4 --seed 3");
    sh(bin + " --train-tokenizer --input " + d + "/corpus.txt --vocab-size 320 --output-dir " + d + "/tok");
    sh(bin + " --input " + d + "/corpus.txt --output-prefix " + d + "/data/c --vocab-file " + d +
       "/tok/vocab.json --merge-file " + d + "/tok/merges.txt");
  }
  ~Fixture() { fs::remove_all(dir); }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

TrainConfig make_config(std::vector<std::string> extra) {
  const Fixture& f = fixture();
  std::vector<std::string> args = {"dstrain",      "--num-layers", "2",     "--hidden-size", "32",
                                   "--num-attention-heads", "2",   "--seq-length", "32",
                                   "--max-position-embeddings", "32", "--micro-batch-size", "4",
                                   "--global-batch-size", "8",     "--lr", "3e-3", "--min-lr", "3e-4",
                                   "--lr-warmup-iters", "2",       "--log-interval", "100",
                                   "--eval-interval", "1000",      "--eval-iters", "1",
                                   "--data-path", (f.dir / "data/c").string(),
                                   "--vocab-file", (f.dir / "tok/vocab.json").string(),
                                   "--merge-file", (f.dir / "tok/merges.txt").string()};
  // A flag given in `extra` replaces the default (list flags such as
  // --data-path would otherwise accumulate).
  for (size_t i = 0; i + 1 < extra.size(); ++i) {
    if (extra[i].rfind("--", 0) != 0) continue;
    for (size_t j = 1; j + 1 < args.size(); ++j)
      if (args[j] == extra[i]) args.erase(args.begin() + j, args.begin() + j + 2);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_train_config(static_cast<int>(argv.size()), argv.data(), 1);
}

// The communicators of a single process (a world of 1 opens no socket).
Comms& single_process() {
  static std::unique_ptr<Communicator> world = make_world_communicator(Backend::Gloo, RendezvousInfo{});
  static Comms comms = build_comms(*world, make_rank_grid(1, 1, 1, 0));
  return comms;
}

std::vector<float> train(std::vector<std::string> extra) {
  Trainer t(make_config(std::move(extra)), single_process());
  return t.run();
}

}  // namespace

TEST_CASE("loss falls on the generated corpus (gpt2 and llama)") {
  for (const char* family : {"gpt2", "llama"}) {
    std::vector<std::string> extra = {"--train-iters", "80"};
    if (std::string(family) == "llama")
      extra.insert(extra.end(), {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                 "--untie-embeddings-and-output-weights", "--disable-bias-linear"});
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
