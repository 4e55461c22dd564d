// Training lengths and schedule resumption on the real trainer: sample- and
// token-based lengths, a run of 0 iterations refused, Megatron's resume rules
// for the learning-rate schedule, and --exit-signal-handler.
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "lib/core/error.h"
#include "lib/train/exit_signal.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

std::string latest(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string s;
  in >> s;
  return s;
}

}  // namespace

TEST_CASE("--train-samples trains samples / global batch iterations, the same as --train-iters") {
  // 48 samples at a global batch of 8: 6 iterations; the warmup of 2 iterations is 16 samples.
  std::vector<float> by_iters = train({"--train-iters", "6"});
  std::vector<float> by_samples = train({"--train-samples", "48", "--lr-warmup-iters", "0",
                                         "--lr-warmup-samples", "16"});
  REQUIRE(by_samples.size() == 6);
  CHECK(by_samples == by_iters);
}

TEST_CASE("--train-tokens stops once that many tokens were consumed") {
  // 8 samples x 32 tokens = 256 tokens per iteration: 1000 tokens take 4 iterations.
  std::vector<float> l = train({"--train-iters", "10", "--train-tokens", "1000"});
  CHECK(l.size() == 4);
}

TEST_CASE("a run that would train 0 iterations is an error") {
  CHECK_THROWS_WITH(train({"--train-iters", "0"}), Contains("0 iterations"));
  CHECK_THROWS_WITH(train({"--train-samples", "4", "--lr-warmup-iters", "0"}), Contains("0 iterations"));
}

TEST_CASE("resuming with a different learning-rate schedule: an error unless a side is picked") {
  fs::path ck = fixture().dir / "ckpt_sched";
  fs::remove_all(ck);
  const std::vector<std::string> first = {"--train-iters", "8", "--exit-interval", "4", "--save", ck.string()};
  REQUIRE(train(first).size() == 4);
  std::vector<std::string> resume = {"--train-iters", "8", "--load", ck.string(), "--lr", "2e-3"};
  CHECK_THROWS_WITH(train(resume), Contains("learning rate (--lr) 0.002 (flags) vs 0.003") &&
                                       Contains("--override-opt_param-scheduler"));
  // A different length changes the decay samples: also named.
  CHECK_THROWS_WITH(train({"--train-iters", "9", "--load", ck.string()}), Contains("decay samples 72 (flags) vs 64"));
  // The checkpoint's side gives exactly the run resumed with its own flags.
  std::vector<float> same = train({"--train-iters", "8", "--load", ck.string()});
  resume.push_back("--use-checkpoint-opt_param-scheduler");
  CHECK(train(resume) == same);
  // The flags' side: a different (smaller) learning rate, a different run.
  resume.back() = "--override-opt_param-scheduler";
  std::vector<float> overridden = train(resume);
  REQUIRE(overridden.size() == 4);
  CHECK(overridden != same);
}

TEST_CASE("--exit-signal-handler: SIGTERM saves a checkpoint and stops") {
  fs::path ck = fixture().dir / "ckpt_sigterm";
  fs::remove_all(ck);
  install_exit_signal_handler();
  REQUIRE(std::raise(SIGTERM) == 0);  // handled: sets the flag, the test process lives on
  REQUIRE(exit_signal_received());
  // Without the flag the signal is not looked at.
  CHECK(train({"--train-iters", "3"}).size() == 3);
  std::vector<float> l = train({"--train-iters", "8", "--exit-signal-handler", "--save", ck.string()});
  CHECK(l.size() == 1);
  CHECK(latest(ck) == "global_step1");
}
