// Python's `random` module as DeepSpeed-Chat's step 3 uses it:
// set_random_seed(seed) seeds it with random.seed(seed), and every PPO epoch
// reorders the experience mini-batches with random.shuffle. Reproducing it
// keeps the order of the updates, and so the trained weights, those of the
// same run under DeepSpeed-Chat: MT19937 seeded by init_by_array over the
// seed's 32-bit words (CPython's random_seed), shuffle's Fisher-Yates from
// the end with _randbelow's rejection sampling of getrandbits(bit_length).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ds::chat {

class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  uint32_t getrandbits(int k);  // 1 <= k <= 32
  int64_t randbelow(int64_t n);  // n >= 1, n < 2^32
  // The generator's whole state as text (std::mt19937's stream form), and
  // back: a resumed run continues the same draws.
  std::string state() const;
  void set_state(const std::string& s);
  template <class T>
  void shuffle(std::vector<T>& x) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 1; --i)
      std::swap(x[static_cast<size_t>(i)], x[static_cast<size_t>(randbelow(i + 1))]);
  }

 private:
  std::mt19937 mt_;
};

}  // namespace ds::chat
