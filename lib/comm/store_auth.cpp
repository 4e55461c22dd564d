// The handshake proofs of store_auth.h. Both nonces have a fixed length, so
// the concatenated message is unambiguous.
#include "lib/comm/store_auth.h"

#include "lib/comm/socket_util.h"
#include "lib/core/crypto.h"

namespace ds::store_auth {

std::string client_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& client_nonce, int64_t rank) {
  net::Writer w;
  w.i64(rank);
  return crypto::hmac_sha256(token, "ds-store/1 client" + server_nonce + client_nonce + w.bytes());
}

std::string server_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& client_nonce, int64_t rank, uint8_t status) {
  net::Writer w;
  w.i64(rank).u8(status);
  return crypto::hmac_sha256(token, "ds-store/1 server" + server_nonce + client_nonce + w.bytes());
}

}  // namespace ds::store_auth
