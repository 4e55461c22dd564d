// TcpStore: the job's rendezvous key-value store. Rank 0 hosts the server (a
// thread) at MASTER_ADDR:MASTER_PORT; every rank, rank 0 included, talks to it
// as a client. Communicators use it to exchange transport addresses (Gloo) and
// NCCL unique ids; the trainer may use it for small agreements. The wire
// protocol is described in docs/distributed.md ("The rendezvous store").
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ds {

class TcpStoreServer;  // lib/comm/tcp_store_server.cpp

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where the server is (MASTER_ADDR)
  int port = 29500;                // MASTER_PORT; 0 with is_server: pick a free port
  bool is_server = false;          // true on rank 0: bind the port and serve
  std::string token;               // DS_JOB_TOKEN; must match the server's
  int rank = -1;                   // reported to the server (for "rank N died")
  // Server only: the job's ranks are 0..world_size-1 (0: not checked), and a
  // connection must say hello within hello_timeout (TcpStoreServer admission).
  int world_size = 0;
  std::chrono::milliseconds hello_timeout{std::chrono::seconds(10)};
  // Bound on connecting (with retries) and the default bound on get/wait.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class TcpStore {
 public:
  // Starts the server (is_server), connects and runs the handshake (each side
  // proves it knows the token; the token never travels). Throws ds::UserError
  // when the port is in use, the server cannot be reached within the timeout,
  // refuses our proof, or fails to prove itself (another process on the port).
  explicit TcpStore(const TcpStoreOptions& opt);
  // Says goodbye to the server (unless an exception is unwinding, which the
  // server then reports to waiters as a lost rank). The hosting rank waits,
  // bounded, for the other clients to leave before stopping the server.
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // Blocks until the key exists; ds::Error on timeout or a lost rank.
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // Atomically adds delta to the integer at key (missing = 0); returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // True when every key exists (never blocks).
  bool check(const std::vector<std::string>& keys);
  // Blocks until all keys exist; ds::Error naming the missing keys on timeout.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Rendezvous of ranks 0..world_size-1 under `name` (each rank calls it once
  // per name). On timeout the error lists the ranks that never arrived.
  void barrier(const std::string& name, int rank, int world_size);
  void barrier(const std::string& name, int rank, int world_size,
               std::chrono::milliseconds timeout);

  int port() const { return port_; }  // the real port (useful with port 0)
  const std::string& host() const { return host_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Outcome of a blocking request, for callers that format their own errors.
  struct WaitResult {
    bool ok = false;
    std::string value;                 // for get
    std::vector<std::string> missing;  // keys still absent
    std::vector<int> lost_ranks;       // ranks whose connection died
  };
  WaitResult try_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                      bool want_value);

 private:
  std::string request(const std::string& payload, std::chrono::milliseconds reply_within);
  void connect_and_hello(const TcpStoreOptions& opt);
  void handshake(const std::string& token, std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void throw_wait_failure(const std::string& what, const WaitResult& r,
                                       std::chrono::milliseconds timeout) const;

  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  int port_ = 0;
  int rank_ = -1;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // one request in flight per client
};

}  // namespace ds
