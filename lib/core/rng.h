// Deterministic, counter-based random numbers (splitmix64 + Box-Muller).
// Same seed -> same stream on every machine and thread count. Parameter init
// draws element i of a named tensor from (seed, tensor_id, i), so a tensor's
// values do not depend on how the model is split across ranks.
#pragma once
#include <cmath>
#include <cstdint>

namespace ds {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from a 64-bit key.
inline double uniform_from_key(uint64_t key) {
  return (static_cast<double>(splitmix64(key) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Uniform in (0, 1) for element `index` of stream (seed, stream).
inline double uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return uniform_from_key(splitmix64(seed ^ splitmix64(stream + 0x9e3779b97f4a7c15ull)) + index);
}

// Standard normal for element `index` of stream (seed, stream).
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t base = splitmix64(seed ^ splitmix64(stream + 0x632be59bd9b4e019ull)) + 2 * index;
  double u1 = uniform_from_key(base), u2 = uniform_from_key(base + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Sequential generator with a saveable state (for data order, dropout).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next_u64() { return splitmix64(state_++); }
  double uniform() { return uniform_from_key(state_++); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next_u64() % n; }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace ds
