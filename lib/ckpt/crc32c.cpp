// CRC-32C: the SSE4.2 CRC32 instruction where the CPU has it, else table
// lookup, eight bytes per step.
#include "lib/ckpt/crc32c.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include <array>
#include <cstring>

#include <fmt/format.h>

namespace ds {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {  // the hosts we run on are little endian
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

namespace {

// CRC-32C of `len` zero bytes appended to a stream whose CRC register is c:
// the register advanced by len bytes (a matrix power of the byte shift,
// applied by squaring), so three streams computed independently combine.
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec; ++i, vec >>= 1)
    if (vec & 1) sum ^= mat[i];
  return sum;
}
void gf2_square(uint32_t* sq, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) sq[n] = gf2_times(mat, mat[n]);
}
// The register after `len` more zero bytes (len > 0).
uint32_t shift_zeros(uint32_t c, size_t len) {
  uint32_t odd[32], even[32];
  odd[0] = kPoly;  // the operator for one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  gf2_square(even, odd);  // two zero bits
  gf2_square(odd, even);  // four
  do {
    gf2_square(even, odd);  // first pass: one byte
    if (len & 1) c = gf2_times(even, c);
    len >>= 1;
    if (!len) break;
    gf2_square(odd, even);
    if (len & 1) c = gf2_times(odd, c);
    len >>= 1;
  } while (len);
  return c;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
  // The register conditioning (~ before and after) cancels out: shifting
  // crc1 by len2 zero bytes and adding crc2 gives the CRC of both.
  return len2 == 0 ? crc1 : shift_zeros(crc1, len2) ^ crc2;
}

#if defined(__x86_64__)
namespace {

constexpr size_t kBlock = 8192;  // bytes per stream per round (three streams)

struct ShiftOp {  // the register shift by kBlock zero bytes, as a 32x32 bit matrix
  uint32_t m[32];
  ShiftOp() {
    for (int i = 0; i < 32; ++i) m[i] = shift_zeros(1u << i, kBlock);
  }
};

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const void* data, size_t n, uint32_t crc) {
  static const ShiftOp shift;
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c0 = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
    --n;
  }
  // Three independent streams hide the instruction's 3-cycle latency.
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    const unsigned char* q = p;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t a, b, d;
      std::memcpy(&a, q + i, 8);
      std::memcpy(&b, q + kBlock + i, 8);
      std::memcpy(&d, q + 2 * kBlock + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
    }
    // c0 over block 0, then as if block 1 followed: shift c0 by kBlock zero bytes and add c1; likewise c2.
    c0 = gf2_times(shift.m, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = gf2_times(shift.m, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  while (n >= 8) {
    uint64_t a;
    std::memcpy(&a, p, 8);
    c0 = _mm_crc32_u64(c0, a);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
  return ~static_cast<uint32_t>(c0);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  return have_sse42() ? crc32c_hw(data, n, crc) : crc32c_portable(data, n, crc);
}
const char* crc32c_method() { return have_sse42() ? "sse4.2" : "table"; }
#else
uint32_t crc32c(const void* data, size_t n, uint32_t crc) { return crc32c_portable(data, n, crc); }
const char* crc32c_method() { return "table"; }
#endif

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string crc32c_text(uint32_t crc) { return fmt::format("crc32c:{:08x}", crc); }

bool parse_crc32c_text(const std::string& s, uint32_t& crc) {
  constexpr size_t kPrefix = 7;  // "crc32c:"
  if (s.size() != kPrefix + 8 || s.compare(0, kPrefix, "crc32c:") != 0) return false;
  uint32_t v = 0;
  for (size_t i = kPrefix; i < s.size(); ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  crc = v;
  return true;
}

}  // namespace ds
