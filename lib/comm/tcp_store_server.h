// The server half of the TCP store: one thread polling a listening socket and
// its client connections, holding the key-value map and the pending blocking
// requests (answered when their keys appear, when they time out, or at once
// when a rank's connection dies without a goodbye). Internal to lib/comm.
// Scale: a parked wait is indexed by each key it still misses and by its
// deadline, so a set touches only the waits on that key and the loop only the
// earliest deadline; connected ranks and connections awaiting their hello are
// kept apart too. The work per request is then logarithmic in the number of
// ranks, apart from poll()'s pass over the connections (docs/distributed.md,
// "The store at scale").
#pragma once
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/socket_util.h"

namespace ds {

class TcpStoreServer {
 public:
  // Binds `port` (0 = any free port) and starts serving: at master_addr when
  // it is an IP literal of this host (127.0.0.1 for a single local node), else
  // on all interfaces (net::listen_for). Throws ds::UserError when the port is in use.
  TcpStoreServer(int port, std::string token, const std::string& master_addr = "");
  // Admission rules. Every connection first gets a challenge and must answer
  // with a hello that proves it knows the token (store_auth.h); anything else
  // gets one fixed refusal and is closed. world_size > 0: a hello must name
  // rank -1 (a tool) or a rank in [0, world_size) not already connected, else
  // it is refused (so a stray or forged client with the token cannot abort the
  // rendezvous by leaving). At most kMaxPending connections wait for their
  // hello, each for at most hello_timeout; beyond that a new connection waits
  // in the listen queue, or the oldest pending one is closed to admit it once
  // it has waited kEvictAfter (or hello_timeout, if shorter).
  void set_admission(int world_size, std::chrono::milliseconds hello_timeout);
  static constexpr size_t kMaxPending = 256;
  static constexpr std::chrono::milliseconds kEvictAfter{1000};
  ~TcpStoreServer();  // stop(0)
  int port() const { return port_; }
  // Where the hosting rank connects: MASTER_ADDR when the server listens only
  // there, else loopback.
  const std::string& connect_host() const { return connect_host_; }
  // Keeps serving until no client is connected and `linger` has passed, or
  // until `grace` has passed, then stops the thread.
  void stop(std::chrono::milliseconds grace,
            std::chrono::milliseconds linger = std::chrono::milliseconds(0));

 private:
  struct Conn {
    int fd = -1;
    std::string in, out;
    bool authed = false, bye = false, close_after_flush = false;
    int64_t rank = -1;
    std::string nonce;  // this connection's challenge
    net::Clock::time_point accepted;
    int waiter = 0;  // its parked wait (one request at a time per connection); 0: none
  };
  struct Waiter {
    int conn = 0;
    bool want_value = false;
    std::vector<std::string> keys;
    net::Clock::time_point deadline;
    size_t missing = 0;  // distinct keys not yet set
    std::multimap<net::Clock::time_point, int>::iterator by_deadline;
  };

  void run();
  bool can_accept() const;
  void accept_new();
  bool read_conn(int id, Conn& c);   // false: drop the connection
  bool flush_conn(Conn& c);          // false: drop the connection
  void handle(int id, Conn& c, const std::string& msg);
  void handle_hello(int id, Conn& c, uint8_t op, net::Reader& r);
  void refuse(Conn& c, const std::string& reason, const std::string& proof);
  void handle_wait(int id, Conn& c, net::Reader& r);
  void drop(int id);
  void reply(Conn& c, const std::string& payload);
  void key_set(const std::string& key);  // a new key: the waits on it may be complete
  void answer_waiter(int waiter, Conn& c);  // all its keys exist
  void erase_waiter(int waiter);           // and its index entries
  void answer_expired_waiters();
  void fail_all_waiters();
  std::string failure(uint8_t status, const std::vector<std::string>& missing) const;
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) const;
  int poll_timeout_ms() const;
  void drop_stale_pending();  // hello deadline passed
  std::string refuse_rank(int64_t rank) const;  // "" when the hello's rank is admissible

  std::string token_;
  std::atomic<int> world_size_{0};
  std::atomic<int64_t> hello_timeout_ms_{10000};
  int listen_fd_ = -1;
  int port_ = 0;
  std::string connect_host_ = "localhost";
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> draining_{false};
  net::Clock::time_point drain_deadline_, linger_until_;
  int next_id_ = 1;
  std::map<int, Conn> conns_;
  std::map<int, net::Clock::time_point> pending_;  // connections awaiting their hello: id -> accepted
  std::set<int64_t> connected_ranks_;              // admitted, not yet gone
  int next_waiter_ = 1;
  std::map<int, Waiter> waiters_;
  std::map<std::string, std::vector<int>> waiting_on_;      // key -> parked waits missing it
  std::multimap<net::Clock::time_point, int> deadlines_;  // parked waits by deadline
  std::map<std::string, std::string> data_;
  std::set<int64_t> lost_ranks_;
};

}  // namespace ds
