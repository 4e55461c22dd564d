// Blended datasets: the replayed BlendIndex against a transcription of
// Megatron's build_blending_indices (every index, random access included),
// --data-path forms, and training on blends and on separate
// --train-data-path / --valid-data-path datasets.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "lib/core/error.h"
#include "lib/data/blended_dataset.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
using Catch::Matchers::Contains;

namespace {

// Megatron's helpers.cpp build_blending_indices, materialised for `size` samples.
std::vector<data::BlendIndex::Pick> megatron_blend(std::vector<double> w, int64_t size) {
  double sum = 0;
  for (double x : w) sum += x;
  for (double& x : w) x /= sum;
  std::vector<int64_t> current(w.size(), 0);
  std::vector<data::BlendIndex::Pick> out;
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int64_t best = 0;
    double best_err = w[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < w.size(); ++d) {
      const double err = w[d] * x - static_cast<double>(current[d]);
      if (err > best_err) {
        best_err = err;
        best = static_cast<int64_t>(d);
      }
    }
    out.push_back({static_cast<int>(best), current[best]});
    current[best] += 1;
  }
  return out;
}

}  // namespace

TEST_CASE("BlendIndex gives Megatron's blending indices, in any access order") {
  for (const std::vector<double>& w : {std::vector<double>{0.3, 0.7}, {1, 2, 3}, {0.5, 0, 0.25, 0.25}, {7}}) {
    const int64_t n = 3 * data::BlendIndex::kStride + 123;
    const std::vector<data::BlendIndex::Pick> want = megatron_blend(w, n);
    data::BlendIndex sequential(w), random(w);
    for (int64_t i = 0; i < n; ++i) REQUIRE(sequential.at(i) == want[static_cast<size_t>(i)]);
    std::mt19937_64 rng(5);
    for (int k = 0; k < 2000; ++k) {
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      REQUIRE(random.at(i) == want[static_cast<size_t>(i)]);
    }
  }
}

TEST_CASE("--data-path forms: PREFIX, or WEIGHT PREFIX pairs") {
  CHECK(data::parse_blend({"p"}, "x").prefixes == std::vector<std::string>{"p"});
  data::BlendSpec b = data::parse_blend({"0.3", "a", "0.7", "b"}, "x");
  CHECK(b.weights == std::vector<double>{0.3, 0.7});
  CHECK(b.prefixes == std::vector<std::string>{"a", "b"});
  CHECK_THROWS_WITH(data::parse_blend({"a", "b"}, "--data-path"), Contains("'a' is not a weight"));
  CHECK_THROWS_WITH(data::parse_blend({"0.5", "a", "0.5"}, "--data-path"), Contains("needs pairs"));
  CHECK_THROWS_WITH(data::parse_blend({"-1", "a", "2", "b"}, "--data-path"), Contains("'-1' is not a weight"));
  CHECK_THROWS_WITH(data::parse_blend({"0", "a", "0", "b"}, "--data-path"), Contains("all 0"));
  CHECK_THROWS_WITH(data::parse_blend({"nan", "a"}, "--data-path"), Contains("'nan' is not a weight"));
  // Decimal only: strtod would take hex, inf and leading spaces.
  for (const char* w : {"0x10", "inf", " 1", "1e400", "+1"})
    CHECK_THROWS_WITH(data::parse_blend({w, "a", "1", "b"}, "--data-path"),
                      Contains(fmt::format("'{}' is not a weight", w)));
}

TEST_CASE("training on blends and on separate train/valid datasets") {
  const std::string prefix = (fixture().dir / "data/c").string();
  // One dataset with weight 1 is exactly that dataset.
  const std::vector<float> plain = train({"--train-iters", "5"});
  CHECK(train({"--train-iters", "5", "--data-path", "1", prefix}) == plain);
  // A blend of the same data twice (another weight scale) trains, and differs
  // from one dataset (samples come from two independently shuffled copies).
  const std::vector<float> two = train({"--train-iters", "5", "--data-path", "2", prefix, "6", prefix});
  REQUIRE(two.size() == 5);
  CHECK(two != plain);
  CHECK(train({"--train-iters", "5", "--data-path", "0.25", prefix, "0.75", prefix}) == two);
  // Separate datasets: the whole train dataset, a valid dataset, a checked test dataset.
  auto separate = [&](const std::string& test_prefix) {
    TrainConfig c = make_config({"--train-iters", "5"});
    c.data.data_path.clear();
    c.data.train_data_path = {prefix};
    c.data.valid_data_path = {"1", prefix};
    c.data.test_data_path = {test_prefix};
    Trainer t(c, single_process());
    return t.run();
  };
  REQUIRE(separate(prefix).size() == 5);
  CHECK_THROWS_WITH(separate(prefix + "_missing"), Contains(prefix + "_missing"));
  CHECK_THROWS_WITH(train({"--train-iters", "5", "--valid-data-path", prefix}), Contains("exclude each other"));
}
