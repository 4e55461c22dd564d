// numpy's default_rng reproduced (lib/data/numpy_random.h) against numpy
// itself (test/data/numpy_random_ref.py): raw PCG64 outputs, random(),
// shuffle() of several lengths and choice(p), drawn in one sequence per seed.
#include <catch2/catch.hpp>
#include <cstring>
#include <sstream>

#include "lib/data/numpy_random.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using ds::data::NumpyGenerator;

namespace {

std::string double_bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return std::to_string(b);
}

}  // namespace

TEST_CASE("numpy's default_rng: raw draws, random, shuffle and choice bit for bit") {
  std::vector<std::string> ref;
  const int rc = ds::test::popen_lines("/usr/bin/python3 " + std::string(std::getenv("DS_SOURCE_DIR")) +
                                           "/test/data/numpy_random_ref.py 2>&1",
                                       ref);
  if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
  REQUIRE(rc == 0);
  std::vector<std::string> ours;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1234}, (uint64_t{1} << 32) + 5, (uint64_t{1} << 63) - 1}) {
    NumpyGenerator g(seed);
    std::ostringstream raw;
    raw << "raw " << seed;
    for (int i = 0; i < 5; ++i) raw << " " << g.next_u64();
    ours.push_back(raw.str());
    auto randoms = [&](int n) {
      std::ostringstream line;
      line << "random " << seed;
      for (int i = 0; i < n; ++i) line << " " << double_bits(g.random());
      ours.push_back(line.str());
    };
    randoms(4);
    for (int64_t n : {1, 2, 10, 997}) {
      std::vector<int64_t> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = i;
      g.shuffle(x);
      std::ostringstream line;
      line << "shuffle " << seed << " " << n;
      for (int64_t v : x) line << " " << v;
      ours.push_back(line.str());
    }
    std::ostringstream line;
    line << "choice " << seed;
    for (int64_t v : g.choice({3.0 / 10, 5.0 / 10, 2.0 / 10}, 40)) line << " " << v;
    ours.push_back(line.str());
    randoms(2);
  }
  REQUIRE(ref.size() == ours.size());
  for (size_t i = 0; i < ours.size(); ++i) CHECK(ours[i] == ref[i]);
}
