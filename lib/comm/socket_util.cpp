// POSIX socket helpers and the message codec for the TCP store.
#include "lib/comm/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lib/core/error.h"

namespace ds::net {

int64_t ms_left(Clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return d.count() > 0 ? d.count() : 0;
}

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(static_cast<char>(v));
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}
Writer& Writer::i64(int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}
Writer& Writer::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  buf_ += s;
  return *this;
}

void Reader::need(size_t n) const {
  if (buf_.size() - pos_ < n) DS_THROW("store: truncated message ({} bytes)", buf_.size());
}
uint8_t Reader::u8() {
  need(1);
  return static_cast<uint8_t>(buf_[pos_++]);
}
uint32_t Reader::u32() {
  need(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(buf_[pos_++])) << (8 * i);
  return v;
}
int64_t Reader::i64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(buf_[pos_++])) << (8 * i);
  return static_cast<int64_t>(v);
}
std::string Reader::str() {
  uint32_t n = u32();
  need(n);
  std::string s = buf_.substr(pos_, n);
  pos_ += n;
  return s;
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

void set_nonblocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Non-blocking connect to one resolved address, bounded by the deadline.
static int connect_one(const addrinfo* ai, Clock::time_point deadline, std::string& err) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    err = std::strerror(errno);
    return -1;
  }
  set_nonblocking(fd, true);
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(ms_left(deadline)));
    if (rc == 0) {
      err = "connect timed out";
      close(fd);
      return -1;
    }
    int so = 0;
    socklen_t len = sizeof(so);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
    rc = so == 0 ? 0 : -1;
    errno = so;
  }
  if (rc != 0) {
    err = std::strerror(errno);
    close(fd);
    return -1;
  }
  set_nonblocking(fd, false);
  set_nodelay(fd);
  return fd;
}

int try_connect(const std::string& host, int port, Clock::time_point deadline,
                std::string& err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) {
    err = fmt::format("cannot resolve '{}': {}", host, gai_strerror(gai));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) fd = connect_one(ai, deadline, err);
  freeaddrinfo(res);
  return fd;
}

// Binds and listens on `ss` (family and address set; the port is filled in).
static int listen_at(sockaddr_storage ss, int port, int& errno_out) {
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    errno_out = errno;
    return -1;
  }
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len;
  if (ss.ss_family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(fd, 1024) != 0) {
    errno_out = errno;
    close(fd);
    return -1;
  }
  return fd;
}

// The address of an IPv4/IPv6 literal ("localhost" counts as 127.0.0.1).
static bool parse_ip_literal(const std::string& host, sockaddr_storage* ss) {
  *ss = {};
  auto* a4 = reinterpret_cast<sockaddr_in*>(ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(ss);
  if (host == "localhost") {
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return true;
  }
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    return true;
  }
  return false;
}

int listen_any(int port, int& errno_out) {
  sockaddr_storage ss{};
  ss.ss_family = AF_INET6;  // in6addr_any (zero), dual-stack
  int fd = listen_at(ss, port, errno_out);
  if (fd >= 0 || errno_out == EADDRINUSE || errno_out == EACCES) return fd;
  ss = {};
  ss.ss_family = AF_INET;  // no IPv6 on this host: INADDR_ANY (zero)
  return listen_at(ss, port, errno_out);
}

bool is_loopback_literal(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

int listen_for(const std::string& master_addr, int port, int& errno_out) {
  sockaddr_storage ss{};
  if (!parse_ip_literal(master_addr, &ss)) return listen_any(port, errno_out);
  const int fd = listen_at(ss, port, errno_out);
  // Not an address of this host (e.g. behind NAT): every interface, unless
  // it is a loopback address, which must never widen.
  if (fd < 0 && errno_out == EADDRNOTAVAIL && !is_loopback_literal(master_addr)) return listen_any(port, errno_out);
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

std::string connect_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "localhost";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const in_addr a = reinterpret_cast<sockaddr_in*>(&ss)->sin_addr;
    if (a.s_addr == htonl(INADDR_ANY) || !inet_ntop(AF_INET, &a, buf, sizeof(buf))) return "localhost";
    return buf;
  }
  const in6_addr a = reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr;
  if (IN6_IS_ADDR_UNSPECIFIED(&a) || !inet_ntop(AF_INET6, &a, buf, sizeof(buf))) return "localhost";
  return buf;
}

bool send_frame(int fd, const std::string& payload) {
  Writer w;
  w.u32(static_cast<uint32_t>(payload.size()));
  std::string data = w.bytes() + payload;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly n bytes within the deadline: 1 ok, 0 timeout, -1 closed/broken.
static int recv_exact(int fd, char* dst, size_t n, Clock::time_point deadline, std::string& err) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(ms_left(deadline)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return 0;
    ssize_t r = ::recv(fd, dst + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r == 0 ? "connection closed by peer" : std::strerror(errno);
      return -1;
    }
    got += static_cast<size_t>(r);
  }
  return 1;
}

int recv_frame(int fd, std::string& payload, Clock::time_point deadline, uint32_t max_len,
               std::string& err) {
  char hdr[4];
  int rc = recv_exact(fd, hdr, 4, deadline, err);
  if (rc != 1) return rc;
  std::string h(hdr, 4);
  uint32_t len = Reader(h).u32();
  if (len > max_len) {
    err = fmt::format("message of {} bytes exceeds the limit {}", len, max_len);
    return -1;
  }
  payload.assign(len, '\0');
  return len == 0 ? 1 : recv_exact(fd, payload.data(), len, deadline, err);
}

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string out;
  for (addrinfo* ai = res; ai && out.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* a = ss.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof(buf))) out = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace ds::net
