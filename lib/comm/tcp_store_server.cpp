// TCP store server: a poll loop over the listening socket, a wake pipe and the
// client connections. Every connection starts with the challenge-response
// handshake (store_auth.h); requests are then answered in arrival order per
// connection; blocking waits are parked as Waiters until their keys exist,
// they expire, or a rank is lost (its connection closed without a Bye).
#include "lib/comm/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "lib/comm/store_auth.h"
#include "lib/comm/store_protocol.h"
#include "lib/core/crypto.h"
#include "lib/core/error.h"

namespace ds {

using namespace store_proto;
using net::Clock;

namespace {
// The one answer to a client that has not proven it knows the token, whatever
// went wrong: it tells such a client nothing about the job or this code.
constexpr const char* kAuthFailed = "authentication failed";

// A request an authenticated client got wrong; its text goes back in a Bad
// reply. Other exceptions (ds::Error carries file:line and host) never do.
class BadRequest : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int64_t parse_counter(const std::string& key, const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw BadRequest(fmt::format("the value of '{}' is not an integer", key));
  return v;
}
}  // namespace

TcpStoreServer::TcpStoreServer(int port, std::string token, const std::string& master_addr)
    : token_(std::move(token)) {
  int err = 0;
  listen_fd_ = master_addr.empty() ? net::listen_any(port, err) : net::listen_for(master_addr, port, err);
  if (listen_fd_ < 0) {
    if (err == EADDRINUSE)
      DS_USER_ERROR("rendezvous store: MASTER_PORT {} is already in use on this host (another job "
                    "or a leftover process?); pick another port with --master_port", port);
    DS_USER_ERROR("rendezvous store: cannot listen on port {}: {}", port, std::strerror(err));
  }
  port_ = net::bound_port(listen_fd_);
  connect_host_ = net::connect_address(listen_fd_);
  net::set_nonblocking(listen_fd_, true);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd_);
    DS_THROW("rendezvous store: pipe2 failed: {}", std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() { stop(std::chrono::milliseconds(0)); }

void TcpStoreServer::stop(std::chrono::milliseconds grace, std::chrono::milliseconds linger) {
  if (!thread_.joinable()) return;
  drain_deadline_ = Clock::now() + grace;
  linger_until_ = Clock::now() + std::min(linger, grace);
  draining_.store(true, std::memory_order_release);
  char b = 1;
  (void)!write(wake_[1], &b, 1);
  thread_.join();
  for (auto& [id, c] : conns_) close(c.fd);
  conns_.clear();
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

int TcpStoreServer::poll_timeout_ms() const {
  int64_t t = deadlines_.empty() ? -1 : net::ms_left(deadlines_.begin()->first);
  if (draining_.load(std::memory_order_acquire)) {
    int64_t left = net::ms_left(conns_.empty() ? linger_until_ : drain_deadline_);
    if (t < 0 || left < t) t = left;
  }
  if ((t < 0 || t > 100) && !pending_.empty()) t = 100;  // pending hellos are checked at least this often
  return t < 0 ? 1000 : static_cast<int>(std::min<int64_t>(t + 1, 1000));
}

void TcpStoreServer::run() {
  while (true) {
    if (draining_.load(std::memory_order_acquire)) {
      auto now = Clock::now();
      if (now >= drain_deadline_ || (conns_.empty() && now >= linger_until_)) return;
    }
    // The listening socket only while a connection can be admitted (else
    // they wait in the kernel's queue; pending hellos wake the loop every 100 ms).
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, static_cast<short>(can_accept() ? POLLIN : 0), 0}};
    std::vector<int> ids;
    for (auto& [id, c] : conns_) {
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
    }
    int rc = poll(fds.data(), fds.size(), poll_timeout_ms());
    if (rc < 0 && errno != EINTR) return;
    if (fds[0].revents) {
      char buf[16];
      while (read(wake_[0], buf, sizeof(buf)) > 0) {}
    }
    if (fds[1].revents & POLLIN) accept_new();
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = conns_.find(ids[i]);
      if (it == conns_.end()) continue;
      short ev = fds[i + 2].revents;
      bool keep = true;
      if (ev & (POLLIN | POLLHUP | POLLERR)) keep = read_conn(ids[i], it->second);
      if (keep && (ev & POLLOUT)) keep = flush_conn(it->second);
      if (keep && it->second.close_after_flush && it->second.out.empty()) keep = false;
      if (!keep) drop(ids[i]);
    }
    answer_expired_waiters();
    drop_stale_pending();
  }
}

void TcpStoreServer::set_admission(int world_size, std::chrono::milliseconds hello_timeout) {
  world_size_.store(world_size);
  hello_timeout_ms_.store(hello_timeout.count());
}

// At most kMaxPending connections wait for their hello. Beyond that, the
// oldest is closed to admit a new one only once it has waited kEvictAfter
// (an idle connection, not a rank whose hello is on its way); until then new
// connections stay in the kernel's listen queue. A burst of thousands of ranks
// is so admitted in turn, none turned away, and idle connections delay
// admission by at most kEvictAfter.
bool TcpStoreServer::can_accept() const {
  if (pending_.size() < kMaxPending) return true;
  const auto evict_after =
      std::min<std::chrono::milliseconds>(kEvictAfter, std::chrono::milliseconds(hello_timeout_ms_.load()));
  return net::Clock::now() - pending_.begin()->second >= evict_after;
}

void TcpStoreServer::accept_new() {
  while (can_accept()) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    net::set_nodelay(fd);
    if (pending_.size() >= kMaxPending) drop(pending_.begin()->first);  // ids grow with time: the oldest
    Conn c;
    c.fd = fd;
    c.accepted = net::Clock::now();
    try {
      c.nonce = crypto::random_bytes(store_auth::kNonceBytes);
    } catch (const std::exception&) {
      close(fd);  // no random source: admit nobody rather than a guessable challenge
      continue;
    }
    reply(c, net::Writer().u8(uint8_t(Op::Challenge)).str(c.nonce).bytes());
    flush_conn(c);  // the rest goes out when poll says the socket is writable
    pending_[next_id_] = c.accepted;
    conns_[next_id_++] = std::move(c);
  }
}

void TcpStoreServer::drop_stale_pending() {
  const auto limit = std::chrono::milliseconds(hello_timeout_ms_.load());
  const auto now = net::Clock::now();
  std::vector<int> stale;
  for (const auto& [id, accepted] : pending_) {  // oldest first
    if (now - accepted <= limit) break;
    if (!conns_.at(id).close_after_flush) stale.push_back(id);
  }
  for (int id : stale) drop(id);
}

std::string TcpStoreServer::refuse_rank(int64_t rank) const {
  const int world = world_size_.load();
  if (world <= 0 || rank == -1) return "";
  if (rank < 0 || rank >= world) return fmt::format("rank {} is not one of this job's {} ranks", rank, world);
  if (connected_ranks_.count(rank)) return fmt::format("rank {} is already connected", rank);
  return "";
}

bool TcpStoreServer::read_conn(int id, Conn& c) {
  char buf[65536];
  while (true) {
    ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      // Before its hello a client may send one hello frame and nothing else: a
      // flood is cut off here instead of growing c.in while it keeps coming.
      if (!c.authed && c.in.size() > 4 + net::kMaxHelloFrame) return false;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    return false;  // closed or broken
  }
  while (c.in.size() >= 4 && !c.close_after_flush) {
    std::string hdr = c.in.substr(0, 4);
    uint32_t len = net::Reader(hdr).u32();
    if (len > (c.authed ? net::kMaxFrame : net::kMaxHelloFrame)) return false;
    if (c.in.size() < 4 + static_cast<size_t>(len)) break;
    std::string msg = c.in.substr(4, len);
    c.in.erase(0, 4 + static_cast<size_t>(len));
    try {
      handle(id, c, msg);
    } catch (const BadRequest& e) {  // framing is intact: answer and go on
      reply(c, net::Writer().u8(uint8_t(Status::Bad)).str(e.what()).bytes());
    } catch (const std::exception&) {  // a truncated message: never echo its text
      if (!c.authed)
        refuse(c, kAuthFailed, "");
      else
        reply(c, net::Writer().u8(uint8_t(Status::Bad)).str("malformed request").bytes());
    }
    if (c.bye) return false;
  }
  return flush_conn(c);
}

bool TcpStoreServer::flush_conn(Conn& c) {
  while (!c.out.empty()) {
    ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
  return true;
}

void TcpStoreServer::reply(Conn& c, const std::string& payload) {
  net::Writer w;
  w.u32(static_cast<uint32_t>(payload.size()));
  c.out += w.bytes();
  c.out += payload;
}

void TcpStoreServer::drop(int id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  bool lost = c.authed && !c.bye && c.rank >= 0;
  if (c.authed && c.rank >= 0) connected_ranks_.erase(c.rank);
  pending_.erase(id);
  if (c.waiter) erase_waiter(c.waiter);
  close(c.fd);
  conns_.erase(it);
  if (lost) {
    lost_ranks_.insert(c.rank);
    fail_all_waiters();
  }
}

void TcpStoreServer::refuse(Conn& c, const std::string& reason, const std::string& proof) {
  reply(c, net::Writer().u8(uint8_t(Status::Refused)).str(reason).str(proof).bytes());
  c.close_after_flush = true;
}

// The client's answer to the challenge: str client_nonce, i64 rank, str proof.
// Only a valid proof earns a reason (and the server's own proof); anything
// else gets kAuthFailed and the connection is closed.
void TcpStoreServer::handle_hello(int id, Conn& c, uint8_t op, net::Reader& r) {
  if (op != uint8_t(Op::Hello)) return refuse(c, kAuthFailed, "");
  const std::string client_nonce = r.str();
  const int64_t rank = r.i64();
  const std::string proof = r.str();
  if (!r.done() || client_nonce.size() != store_auth::kNonceBytes ||
      !crypto::constant_time_equal(proof, store_auth::client_proof(token_, c.nonce, client_nonce, rank)))
    return refuse(c, kAuthFailed, "");
  if (const std::string why = refuse_rank(rank); !why.empty())
    return refuse(c, why, store_auth::server_proof(token_, c.nonce, client_nonce, rank, uint8_t(Status::Refused)));
  c.rank = rank;
  c.authed = true;
  pending_.erase(id);
  if (rank >= 0) connected_ranks_.insert(rank);
  reply(c, net::Writer().u8(uint8_t(Status::Ok))
               .str(store_auth::server_proof(token_, c.nonce, client_nonce, rank, uint8_t(Status::Ok)))
               .bytes());
}

void TcpStoreServer::handle(int id, Conn& c, const std::string& msg) {
  net::Reader r(msg);
  const uint8_t code = r.u8();
  if (!c.authed) return handle_hello(id, c, code, r);
  const Op op = static_cast<Op>(code);
  switch (op) {
    case Op::Set: {
      std::string key = r.str();
      const bool is_new = !data_.count(key);
      data_[key] = r.str();
      reply(c, net::Writer().u8(uint8_t(Status::Ok)).bytes());
      if (is_new) key_set(key);
      return;
    }
    case Op::Add: {
      std::string key = r.str();
      int64_t delta = r.i64();
      auto it = data_.find(key);
      const bool is_new = it == data_.end();
      int64_t v = (is_new ? 0 : parse_counter(key, it->second)) + delta;
      data_[key] = std::to_string(v);
      reply(c, net::Writer().u8(uint8_t(Status::Ok)).i64(v).bytes());
      if (is_new) key_set(key);
      return;
    }
    case Op::Check: {
      uint32_t n = r.u32();
      bool all = true;
      for (uint32_t i = 0; i < n; ++i) all = data_.count(r.str()) && all;
      reply(c, net::Writer().u8(uint8_t(Status::Ok)).u8(all ? 1 : 0).bytes());
      return;
    }
    case Op::Wait:
      handle_wait(id, c, r);
      return;
    case Op::Bye:
      c.bye = true;
      return;
    default:
      throw BadRequest(fmt::format("unknown request code {}", int(code)));
  }
}

void TcpStoreServer::handle_wait(int id, Conn& c, net::Reader& r) {
  Waiter w;
  w.conn = id;
  w.want_value = r.u8() != 0;
  uint32_t n = r.u32();
  for (uint32_t i = 0; i < n; ++i) w.keys.push_back(r.str());
  w.deadline = Clock::now() + std::chrono::milliseconds(r.i64());
  std::vector<std::string> missing = missing_keys(w.keys);
  if (missing.empty()) {
    net::Writer out;
    out.u8(uint8_t(Status::Ok));
    if (w.want_value && !w.keys.empty()) out.str(data_[w.keys[0]]);
    reply(c, out.bytes());
  } else if (!lost_ranks_.empty()) {
    reply(c, failure(uint8_t(Status::PeerLost), missing));
  } else {
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    const int wid = next_waiter_++;
    w.missing = missing.size();
    for (const std::string& k : missing) waiting_on_[k].push_back(wid);
    w.by_deadline = deadlines_.emplace(w.deadline, wid);
    c.waiter = wid;
    waiters_.emplace(wid, std::move(w));
  }
}

std::vector<std::string> TcpStoreServer::missing_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!data_.count(k)) out.push_back(k);
  return out;
}

std::string TcpStoreServer::failure(uint8_t status, const std::vector<std::string>& missing) const {
  net::Writer w;
  w.u8(status).u32(static_cast<uint32_t>(lost_ranks_.size()));
  for (int64_t r : lost_ranks_) w.i64(r);
  w.u32(static_cast<uint32_t>(missing.size()));
  for (const auto& k : missing) w.str(k);
  return w.bytes();
}

void TcpStoreServer::key_set(const std::string& key) {
  auto it = waiting_on_.find(key);
  if (it == waiting_on_.end()) return;
  const std::vector<int> ids = std::move(it->second);
  waiting_on_.erase(it);
  for (int wid : ids) {
    auto w = waiters_.find(wid);
    if (w == waiters_.end() || --w->second.missing > 0) continue;
    auto c = conns_.find(w->second.conn);
    if (c == conns_.end()) {
      erase_waiter(wid);
      continue;
    }
    answer_waiter(wid, c->second);
  }
}

void TcpStoreServer::answer_waiter(int wid, Conn& c) {
  const Waiter& w = waiters_.at(wid);
  net::Writer out;
  out.u8(uint8_t(Status::Ok));
  if (w.want_value && !w.keys.empty()) out.str(data_[w.keys[0]]);
  reply(c, out.bytes());
  flush_conn(c);
  erase_waiter(wid);
}

void TcpStoreServer::erase_waiter(int wid) {
  auto it = waiters_.find(wid);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  deadlines_.erase(w.by_deadline);
  // Its entries in waiting_on_ are skipped when their key arrives (the wait is
  // gone by then) or dropped with the key's list: nothing to search here.
  auto c = conns_.find(w.conn);
  if (c != conns_.end() && c->second.waiter == wid) c->second.waiter = 0;
  waiters_.erase(it);
}

void TcpStoreServer::answer_expired_waiters() {
  const auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const int wid = deadlines_.begin()->second;
    const Waiter& w = waiters_.at(wid);
    auto c = conns_.find(w.conn);
    if (c != conns_.end()) {
      reply(c->second, failure(uint8_t(Status::Timeout), missing_keys(w.keys)));
      flush_conn(c->second);
    }
    erase_waiter(wid);
  }
}

void TcpStoreServer::fail_all_waiters() {
  for (auto& [wid, w] : waiters_) {
    auto it = conns_.find(w.conn);
    if (it == conns_.end()) continue;
    reply(it->second, failure(uint8_t(Status::PeerLost), missing_keys(w.keys)));
    flush_conn(it->second);
    it->second.waiter = 0;
  }
  waiters_.clear();
  deadlines_.clear();
  waiting_on_.clear();
}

}  // namespace ds
