// The rendezvous store's handshake proofs. Each side shows that it knows the
// job token without sending it: the client proves it with an HMAC-SHA256 of
// both nonces and its rank under the token, the server with another HMAC over
// the same values and its answer. See docs/distributed.md ("Admission").
// Internal to lib/comm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ds::store_auth {

constexpr size_t kNonceBytes = 32;

// HMAC-SHA256(token, "ds-store/1 client" || server_nonce || client_nonce || i64 rank)
std::string client_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& client_nonce, int64_t rank);
// HMAC-SHA256(token, "ds-store/1 server" || server_nonce || client_nonce || i64 rank || u8 status)
std::string server_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& client_nonce, int64_t rank, uint8_t status);

}  // namespace ds::store_auth
