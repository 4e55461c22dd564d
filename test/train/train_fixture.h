// Shared by the trainer tests: a generated corpus, tokenizer and dataset made
// once per test binary, a small model's flags, and single-process training.
#pragma once
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/config/config.h"
#include "lib/parallel/comms.h"
#include "lib/train/trainer.h"

namespace ds::test {
namespace fs = std::filesystem;


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

inline Fixture& fixture() {
  static Fixture f;
  return f;
}

inline TrainConfig make_config(std::vector<std::string> extra) {
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
inline Comms& single_process() {
  static std::unique_ptr<Communicator> world = make_world_communicator(Backend::Gloo, RendezvousInfo{});
  static Comms comms = build_comms(*world, make_rank_grid(1, 1, 1, 0));
  return comms;
}

inline std::vector<float> train(std::vector<std::string> extra) {
  Trainer t(make_config(std::move(extra)), single_process());
  return t.run();
}

// `args` for 8 iterations whole, and again saved into checkpoint directory
// `ck` (removed first) at iteration 3 and resumed from it: the two
// curves are the same bit for bit, and so are the consumed tokens. Returns
// the whole run's losses and its consumed tokens.
inline std::pair<std::vector<float>, int64_t> require_resume_equal(const std::vector<std::string>& args,
                                                                   const std::string& ck) {
  std::filesystem::remove_all(ck);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Trainer whole(make_config(with({"--train-iters", "8"})), single_process());
  const std::vector<float> full = whole.run();
  std::vector<float> first = train(with({"--train-iters", "8", "--exit-interval", "3", "--save", ck, "--save-interval", "3"}));
  REQUIRE(first.size() == 3);
  Trainer rest(make_config(with({"--train-iters", "8", "--load", ck})), single_process());
  const std::vector<float> second = rest.run();
  first.insert(first.end(), second.begin(), second.end());
  REQUIRE(first == full);
  CHECK(rest.state().consumed_tokens == whole.state().consumed_tokens);
  return {full, whole.state().consumed_tokens};
}


// The LLaMA-family flags (RMSNorm, SwiGLU, RoPE, untied, no biases).
inline std::vector<std::string> llama_flags() {
  return {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
          "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
}

}  // namespace ds::test
