// numpy's Generator, bit for bit (numpy_random.h).
#include "lib/data/numpy_random.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds::data {
namespace {

using u128 = unsigned __int128;

// SeedSequence's constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixL = 0xca01f9dd, kMixR = 0x4973f715;
constexpr int kPool = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> 16);
}

uint32_t mix(uint32_t x, uint32_t y) {
  const uint32_t r = kMixL * x - kMixR * y;
  return r ^ (r >> 16);
}

// SeedSequence(seed).generate_state(n, np.uint32).
std::vector<uint32_t> seed_sequence_state(uint64_t seed, int n) {
  std::vector<uint32_t> entropy;  // the integer as little-endian 32-bit words (0 -> [0])
  do {
    entropy.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed != 0);
  uint32_t pool[kPool];
  uint32_t hc = kInitA;
  for (int i = 0; i < kPool; ++i)
    pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[static_cast<size_t>(i)] : 0u, hc);
  for (int s = 0; s < kPool; ++s)
    for (int d = 0; d < kPool; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
  for (size_t s = kPool; s < entropy.size(); ++s)
    for (int d = 0; d < kPool; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], hc));
  std::vector<uint32_t> out(static_cast<size_t>(n));
  uint32_t hb = kInitB;
  for (int i = 0; i < n; ++i) {
    uint32_t v = pool[i % kPool] ^ hb;
    hb *= kMultB;
    v *= hb;
    out[static_cast<size_t>(i)] = v ^ (v >> 16);
  }
  return out;
}

const u128 kMult = (static_cast<u128>(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // generate_state(4, np.uint64): pairs of 32-bit words, low word first.
  const std::vector<uint32_t> w = seed_sequence_state(seed, 8);
  auto word64 = [&](int i) { return static_cast<uint64_t>(w[2 * i]) | (static_cast<uint64_t>(w[2 * i + 1]) << 32); };
  const u128 initstate = (static_cast<u128>(word64(0)) << 64) | word64(1);
  const u128 initseq = (static_cast<u128>(word64(2)) << 64) | word64(3);
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kMult + inc_;
  state_ += initstate;
  state_ = state_ * kMult + inc_;
}

uint64_t NumpyGenerator::next_u64() {
  state_ = state_ * kMult + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyGenerator::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t v = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v & 0xffffffffu);
}

double NumpyGenerator::random() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

uint64_t NumpyGenerator::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int s = 1; s < 64; s <<= 1) mask |= mask >> s;
  uint64_t v;
  if (max <= 0xffffffffull) {
    while ((v = (next_u32() & mask)) > max) {
    }
  } else {
    while ((v = (next_u64() & mask)) > max) {
    }
  }
  return v;
}

std::vector<int64_t> NumpyGenerator::choice(const std::vector<double>& p, int64_t size) {
  DS_CHECK(!p.empty() && size >= 0, "numpy choice: {} probabilities, size {}", p.size(), size);
  std::vector<double> cdf(p.size());
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) cdf[i] = s += p[i];  // np.cumsum, left to right
  const double last = cdf.back();
  for (double& c : cdf) c /= last;
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (int64_t k = 0; k < size; ++k) {  // searchsorted(side='right')
    const double u = random();
    out[static_cast<size_t>(k)] = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
  }
  return out;
}

}  // namespace ds::data
