// HMAC-SHA256, random bytes and constant-time comparison on top of libcrypto.
#include "lib/core/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "lib/core/error.h"

namespace ds::crypto {

std::string hmac_sha256(std::string_view key, std::string_view msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // An empty key is valid HMAC; libcrypto wants a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  const auto* m = msg.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(msg.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()), m, msg.size(), out, &len) || len != kHmacBytes)
    DS_THROW("HMAC-SHA256 failed in libcrypto");
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    DS_THROW("cannot draw {} random bytes (libcrypto RAND_bytes failed)", n);
  return out;
}

std::string to_hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ds::crypto
