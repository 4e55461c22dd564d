// DeepSpeed-Chat's phase split and numpy's legacy shuffle (data_split.h).
#include "lib/chat/data_split.h"

#include <algorithm>
#include <cerrno>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <random>

#include "lib/core/error.h"

namespace ds::chat {

std::vector<double> parse_data_split(const std::string& text, const std::string& what) {
  std::vector<double> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(part.c_str(), &end);
    const bool number = !part.empty() && end != part.c_str() && *end == '\0' && errno == 0;
    DS_USER_CHECK(number && std::isfinite(v) && v >= 0, "{} '{}': '{}' is not a number >= 0 (expected weights such "
                  "as 2,4,4)", what, text, part);
    out.push_back(v);
    DS_USER_CHECK(out.size() <= 16, "{} '{}': more than 16 parts", what, text);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  double sum = 0;
  for (double v : out) sum += v;
  DS_USER_CHECK(sum > 0, "{} '{}': the weights add up to 0", what, text);
  return out;
}

std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t n) {
  double sum = 0;
  for (double w : weights) sum += w;  // Python's sum(): left to right
  std::vector<int64_t> b{0};
  const int mode = std::fegetround();
  std::fesetround(FE_TONEAREST);  // Python's round(): half to even
  for (double w : weights) b.push_back(b.back() + static_cast<int64_t>(std::nearbyint(w / sum * static_cast<double>(n))));
  std::fesetround(mode);
  const int64_t diff = b.back() - n;
  for (size_t k = 1; k < b.size(); ++k) b[k] -= diff;
  return b;
}

std::vector<int64_t> numpy_shuffled_range(uint32_t seed, int64_t n) {
  std::vector<int64_t> x(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = i;
  std::mt19937 mt(seed);  // numpy's legacy seeding of an integer: init_genrand(seed)
  // numpy's random_interval(max): the smallest all-ones mask covering max,
  // draws masked until one is <= max; 32-bit draws while max fits 32 bits,
  // else 64-bit ones (two 32-bit draws, the first the high word).
  auto interval = [&](uint64_t max) -> uint64_t {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
    uint64_t v;
    if (max <= 0xffffffffull) {
      do v = mt() & mask; while (v > max);
    } else {
      do {
        const uint64_t hi = mt();
        v = ((hi << 32) | mt()) & mask;
      } while (v > max);
    }
    return v;
  };
  for (int64_t i = n - 1; i >= 1; --i)
    std::swap(x[static_cast<size_t>(i)], x[static_cast<size_t>(interval(static_cast<uint64_t>(i)))]);
  return x;
}

std::vector<int64_t> phase_indices(const std::vector<double>& weights, int phase, uint32_t seed, int64_t n) {
  const std::vector<int64_t> b = split_boundaries(weights, n);
  DS_USER_CHECK(phase >= 0 && phase + 1 < static_cast<int>(b.size()), "data split: phase {} of {} parts", phase + 1,
                b.size() - 1);
  const std::vector<int64_t> all = numpy_shuffled_range(seed, n);
  auto py_index = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };  // Python's slice bounds
  const int64_t lo = py_index(b[static_cast<size_t>(phase)]), hi = std::max(lo, py_index(b[static_cast<size_t>(phase) + 1]));
  return std::vector<int64_t>(all.begin() + lo, all.begin() + hi);
}

}  // namespace ds::chat
