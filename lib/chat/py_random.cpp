// Python's random.seed / random.shuffle (py_random.h).
#include "lib/chat/py_random.h"

#include <sstream>

#include <array>
#include <bit>

#include "lib/core/error.h"

namespace ds::chat {
namespace {

constexpr int kN = 624;

// CPython's init_by_array (the reference MT19937's): the state it leaves,
// handed to std::mt19937 as a seed sequence that writes it verbatim (the
// engine then twists before its first draw, as CPython does).
struct StateSeq {
  using result_type = uint32_t;
  std::array<uint32_t, kN> mt{};
  template <class It>
  void generate(It begin, It end) {
    for (size_t i = 0; begin != end && i < mt.size(); ++begin, ++i) *begin = mt[i];
  }
};

StateSeq init_by_array(const std::vector<uint32_t>& key) {
  StateSeq s;
  auto& mt = s.mt;
  mt[0] = 19650218u;  // init_genrand(19650218)
  for (int i = 1; i < kN; ++i) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + static_cast<uint32_t>(i);
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000u;
  return s;
}

}  // namespace

PythonRandom::PythonRandom(uint64_t seed) {
  std::vector<uint32_t> key;  // the seed's 32-bit words, least significant first; [0] for 0
  for (uint64_t v = seed; v != 0; v >>= 32) key.push_back(static_cast<uint32_t>(v));
  if (key.empty()) key.push_back(0);
  StateSeq s = init_by_array(key);
  mt_.seed(s);
}

uint32_t PythonRandom::getrandbits(int k) {
  DS_CHECK(k >= 1 && k <= 32, "getrandbits({})", k);
  return static_cast<uint32_t>(mt_()) >> (32 - k);
}

int64_t PythonRandom::randbelow(int64_t n) {
  DS_CHECK(n >= 1 && n <= 0xffffffffLL, "randbelow({})", n);
  const int k = std::bit_width(static_cast<uint64_t>(n));
  uint32_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::string PythonRandom::state() const {
  std::ostringstream o;
  o << mt_;
  return o.str();
}

void PythonRandom::set_state(const std::string& s) {
  std::istringstream in(s);
  std::mt19937 mt;
  in >> mt;
  DS_USER_CHECK(!in.fail(), "a saved random state is not a Mersenne Twister state");
  mt_ = mt;
}

}  // namespace ds::chat
