// Shared checks of the equivalence tests: a loss curve equals the reference
// (single-process) curve to a relative 1e-5 from a given iteration on, and a
// file's bytes for exact comparisons (HF exports).
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ds::test {

// got[i] is iteration offset + i + 1 of the reference curve.
inline void require_same_curve(const std::vector<double>& ref, const std::vector<double>& got, size_t offset = 0) {
  REQUIRE(!got.empty());
  REQUIRE(got.size() + offset <= ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("iteration " << i + offset + 1 << ": reference " << ref[i + offset] << " got " << got[i]);
    REQUIRE(std::abs(got[i] - ref[i + offset]) <= 1e-5 * std::abs(ref[i + offset]));
  }
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace ds::test
