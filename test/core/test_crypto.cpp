// lib/core/crypto.h: HMAC-SHA256 against RFC 4231's test vectors, hex,
// constant-time comparison and random bytes.
#include <catch2/catch.hpp>

#include <string>

#include "lib/core/crypto.h"

using namespace ds::crypto;

TEST_CASE("crypto: HMAC-SHA256 matches RFC 4231", "[crypto]") {
  // Test case 1: 20-byte key of 0x0b.
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than SHA-256's block (hashed first).
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Empty key and message (a job started without a token still runs the handshake).
  CHECK(to_hex(hmac_sha256("", "")) == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  CHECK(hmac_sha256("k", "m").size() == kHmacBytes);
}

TEST_CASE("crypto: hex, comparison, random bytes", "[crypto]") {
  CHECK(to_hex(std::string("\x00\x01\xab\xff", 4)) == "0001abff");
  CHECK(to_hex("") == "");
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "ab"));
  CHECK(constant_time_equal("", ""));
  const std::string a = random_bytes(32), b = random_bytes(32);
  CHECK(a.size() == 32);
  CHECK(a != b);
  CHECK(random_bytes(0).empty());
}
