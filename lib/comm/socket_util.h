// Small POSIX socket helpers and the length-prefixed message codec used by the
// TCP store (lib/comm/tcp_store.*). Kept apart so the store's client and server
// read as protocol logic, not as socket plumbing. Internal to lib/comm.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ds::net {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline` (0 when it has passed).
int64_t ms_left(Clock::time_point deadline);

// Builds one message payload: integers little-endian, strings length-prefixed.
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(const std::string& s);  // u32 length + bytes
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

// Parses one message payload; throws ds::Error on a truncated message.
class Reader {
 public:
  explicit Reader(const std::string& buf) : buf_(buf) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  bool done() const { return pos_ == buf_.size(); }

 private:
  void need(size_t n) const;
  const std::string& buf_;
  size_t pos_ = 0;
};

// "[host]:port" for IPv6 literals, "host:port" otherwise.
std::string host_port(const std::string& host, int port);

// One attempt to open a TCP connection to host:port within the deadline
// (non-blocking connect + poll). Returns the fd, or -1 with `err` set.
int try_connect(const std::string& host, int port, Clock::time_point deadline,
                std::string& err);

// Binds a listening socket on all interfaces (IPv6 dual-stack, else IPv4).
// port 0 picks a free port. Returns the fd, or -1 with errno_out set.
int listen_any(int port, int& errno_out);
// True for "localhost", "::1" and 127.0.0.0/8 address literals.
bool is_loopback_literal(const std::string& host);
// The store's listening socket for a job whose MASTER_ADDR is master_addr:
// an IP literal ("localhost": 127.0.0.1) is bound exactly, so a single local
// node's store is reachable from this host only and a multi-node job's only
// at the address the ranks use; a literal that is not an address of this
// host (NAT) and a host name (it may resolve to a loopback alias here and to
// the real address elsewhere) bind every interface.
int listen_for(const std::string& master_addr, int port, int& errno_out);
int bound_port(int fd);  // the local port of a bound socket
// Where a process on this host reaches a listening socket: its address when
// it is bound to one (numeric), "localhost" when it listens on every interface.
std::string connect_address(int fd);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);

// Blocking send of one frame (u32 length + payload); false on a broken socket.
bool send_frame(int fd, const std::string& payload);
// Receives one frame within the deadline. Returns 1 on success, 0 on timeout,
// -1 when the peer closed or the socket broke (err says which).
int recv_frame(int fd, std::string& payload, Clock::time_point deadline,
               uint32_t max_len, std::string& err);

// Local IP address a socket uses to reach host (UDP connect + getsockname);
// empty when host cannot be resolved or routed.
std::string local_address_towards(const std::string& host, int port);

// Frame sizes the store accepts: small until a client has shown the token.
constexpr uint32_t kMaxHelloFrame = 4096;
constexpr uint32_t kMaxFrame = 1u << 30;

}  // namespace ds::net
