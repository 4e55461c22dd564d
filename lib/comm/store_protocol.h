// Message codes of the TCP store protocol, shared by its client (tcp_store.cpp)
// and server (tcp_store_server.cpp). Every message is a frame: u32 little-endian
// length, then the payload; a payload starts with one of these codes. See
// docs/distributed.md for the full request/reply table and the handshake.
// Internal to lib/comm.
#pragma once
#include <cstdint>

namespace ds::store_proto {

enum class Op : uint8_t {
  // Handshake (store_auth.h): the server speaks first with a Challenge; the
  // client answers with a Hello that proves it knows the token; the server's
  // reply proves the same to the client. The token never travels.
  Hello = 1,  // str client_nonce, i64 rank, str client_proof
              //   -> Ok(str server_proof) | Refused(str reason, str server_proof or "")
  Set = 2,    // str key, str value                -> Ok
  Wait = 3,   // u8 want_value, u32 n, n x str key, i64 timeout_ms
              //   -> Ok [str value of key 0] | Timeout/PeerLost(failure body)
  Add = 4,    // str key, i64 delta                -> Ok i64 new_value
  Check = 5,  // u32 n, n x str key                -> Ok u8 all_present
  Bye = 6,    // (no body, no reply): a clean goodbye before closing
  Challenge = 7,  // server -> client, first frame on every connection: str server_nonce
};

enum class Status : uint8_t {
  Ok = 0,
  Timeout = 1,   // failure body: u32 n_lost, n_lost x i64 rank, u32 n, n x str key
  Refused = 2,   // str reason, str server_proof; then the server closes the connection
  PeerLost = 3,  // failure body as for Timeout
  Bad = 4,       // str reason (malformed request; never carries file:line)
};

}  // namespace ds::store_proto
