// The few cryptographic pieces the job's secrets need, from OpenSSL's
// libcrypto: HMAC-SHA256 (the rendezvous handshake's proofs, dsrun's
// per-attempt job tokens), random bytes from the system's CSPRNG (nonces,
// tokens) and a constant-time comparison. Used by lib/comm and launcher/.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace ds::crypto {

constexpr size_t kHmacBytes = 32;  // HMAC-SHA256 output

// HMAC-SHA256 (RFC 2104) of msg under key: kHmacBytes raw bytes.
std::string hmac_sha256(std::string_view key, std::string_view msg);

// n bytes from the system's cryptographic random source; ds::Error when it fails.
std::string random_bytes(size_t n);

// Lower-case hexadecimal of raw bytes ("\x01\xab" -> "01ab").
std::string to_hex(std::string_view bytes);

// a == b in a time that depends only on the lengths, not on where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace ds::crypto
