// TCP store client (and start-up of the server on the hosting rank): connect
// with retries, the challenge-response handshake (the client trusts no store
// that cannot prove it knows the token), one blocking request at a time, and
// error messages that say which rank, which address and what is missing.
#include "lib/comm/tcp_store.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "lib/comm/socket_util.h"
#include "lib/comm/store_auth.h"
#include "lib/comm/store_protocol.h"
#include "lib/comm/tcp_store_server.h"
#include "lib/core/crypto.h"
#include "lib/core/error.h"

namespace ds {

using namespace store_proto;
using net::Clock;
using std::chrono::milliseconds;

namespace {
// Extra time a client gives the server to answer beyond the request's own bound.
constexpr milliseconds kReplySlack{30000};

std::string seconds_str(milliseconds ms) { return fmt::format("{:.1f} s", ms.count() / 1000.0); }

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}
}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& opt)
    : host_(opt.host), port_(opt.port), rank_(opt.rank), timeout_(opt.timeout) {
  if (opt.is_server) {
    server_ = std::make_unique<TcpStoreServer>(opt.port, opt.token, opt.host);
    server_->set_admission(opt.world_size, opt.hello_timeout);
    port_ = server_->port();
  }
  connect_and_hello(opt);
}

TcpStore::~TcpStore() {
  bool unwinding = std::uncaught_exceptions() > 0;
  if (fd_ >= 0) {
    if (!unwinding) net::send_frame(fd_, net::Writer().u8(uint8_t(Op::Bye)).bytes());
    close(fd_);
  }
  // Normal exit: everybody passed the rendezvous, wait (bounded) for them to
  // leave. On an error: keep answering a little longer, so the other ranks hear
  // "rank 0 dropped out, ranks X never arrived" instead of a bare lost store.
  if (server_) {
    if (unwinding)
      server_->stop(std::min(timeout_, milliseconds(5000)), milliseconds(1000));
    else
      server_->stop(std::min(timeout_, milliseconds(30000)));
  }
}

void TcpStore::connect_and_hello(const TcpStoreOptions& opt) {
  // The hosting rank reaches its own server where it listens: at MASTER_ADDR
  // when it is bound to that address only, else over loopback.
  std::string host = server_ ? server_->connect_host() : host_;
  auto deadline = Clock::now() + timeout_;
  std::string err;
  milliseconds backoff{20};
  while (true) {
    fd_ = net::try_connect(host, port_, deadline, err);
    if (fd_ >= 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<milliseconds>(backoff, milliseconds(net::ms_left(deadline))));
    backoff = std::min<milliseconds>(backoff * 2, milliseconds(1000));
  }
  if (fd_ < 0)
    DS_USER_ERROR("rank {}: cannot reach the rendezvous store at {} within {} ({}); is rank 0 "
                  "running, and are MASTER_ADDR/MASTER_PORT right and reachable from this host?",
                  rank_, net::host_port(host_, port_), seconds_str(timeout_), err);
  handshake(opt.token, deadline);
}

// Challenge-response (store_auth.h): the server's challenge, our hello with
// our nonce and proof, the server's reply with its proof. The token is never
// sent, and nothing the peer says (not even a refusal's reason) is believed
// before its proof checks out.
void TcpStore::handshake(const std::string& token, Clock::time_point deadline) {
  const std::string where = net::host_port(host_, port_);
  auto fail = [&](const std::string& msg) {
    close(fd_);
    fd_ = -1;
    throw UserError(msg);
  };
  const std::string unproven = fmt::format(
      "rank {}: rendezvous: the store at {} failed to prove it knows the job token (another process may hold "
      "MASTER_PORT)", rank_, where);
  std::string frame, err;
  auto receive = [&] {
    const int rc = net::recv_frame(fd_, frame, deadline, net::kMaxHelloFrame, err);
    if (rc == 0)
      fail(fmt::format("rank {}: no answer from the rendezvous store at {} (timed out); is another program "
                       "listening on MASTER_PORT?", rank_, where));
    if (rc < 0) fail(unproven + fmt::format(" ({})", err));
  };
  receive();
  uint8_t code = 0;
  std::string server_nonce;
  try {
    net::Reader r(frame);
    code = r.u8();
    server_nonce = r.str();
  } catch (const Error&) {  // truncated: not our server
  }
  if (code != uint8_t(Op::Challenge) || server_nonce.size() != store_auth::kNonceBytes) fail(unproven);
  const std::string client_nonce = crypto::random_bytes(store_auth::kNonceBytes);
  net::send_frame(fd_, net::Writer()
                           .u8(uint8_t(Op::Hello))
                           .str(client_nonce)
                           .i64(rank_)
                           .str(store_auth::client_proof(token, server_nonce, client_nonce, rank_))
                           .bytes());
  receive();
  uint8_t status = 0xff;
  std::string reason, proof;
  try {
    net::Reader r(frame);
    status = r.u8();
    if (status == uint8_t(Status::Refused)) reason = r.str();
    proof = r.str();
  } catch (const Error&) {  // truncated: unproven
  }
  const bool proven = (status == uint8_t(Status::Ok) || status == uint8_t(Status::Refused)) &&
                      crypto::constant_time_equal(
                          proof, store_auth::server_proof(token, server_nonce, client_nonce, rank_, status));
  if (status == uint8_t(Status::Ok) && proven) return;
  if (status == uint8_t(Status::Refused) && proven)
    fail(fmt::format("rank {}: the rendezvous store at {} refused the connection: {}", rank_, where, reason));
  if (status == uint8_t(Status::Refused))
    fail(fmt::format("rank {}: the rendezvous store at {} refused this rank's proof of the job token: all ranks "
                     "of a job must share DS_JOB_TOKEN (dsrun sets it, a fresh one for every restart attempt), "
                     "or another process holds MASTER_PORT", rank_, where));
  fail(unproven);
}

std::string TcpStore::request(const std::string& payload, milliseconds reply_within) {
  std::string err, reply;
  if (fd_ < 0 || !net::send_frame(fd_, payload))
    DS_THROW("rank {}: lost the connection to the rendezvous store at {} (did rank 0 exit?)", rank_,
             net::host_port(host_, port_));
  int rc = net::recv_frame(fd_, reply, Clock::now() + reply_within, net::kMaxFrame, err);
  if (rc != 1) {
    close(fd_);
    fd_ = -1;
    DS_THROW("rank {}: lost the connection to the rendezvous store at {} ({}; did rank 0 exit?)",
             rank_, net::host_port(host_, port_), rc == 0 ? "no reply in time" : err);
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lk(mu_);
  std::string rep = request(net::Writer().u8(uint8_t(Op::Set)).str(key).str(value).bytes(), timeout_);
  DS_CHECK(net::Reader(rep).u8() == uint8_t(Status::Ok), "store set '{}' rejected", key);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lk(mu_);
  std::string rep = request(net::Writer().u8(uint8_t(Op::Add)).str(key).i64(delta).bytes(), timeout_);
  net::Reader r(rep);
  if (r.u8() != uint8_t(Status::Ok))
    DS_THROW("store add '{}' rejected: {}", key, r.done() ? std::string() : r.str());
  return r.i64();
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lk(mu_);
  net::Writer w;
  w.u8(uint8_t(Op::Check)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::string rep = request(w.bytes(), timeout_);
  net::Reader r(rep);
  DS_CHECK(r.u8() == uint8_t(Status::Ok), "store check rejected");
  return r.u8() != 0;
}

TcpStore::WaitResult TcpStore::try_wait(const std::vector<std::string>& keys, milliseconds timeout,
                                        bool want_value) {
  std::lock_guard<std::mutex> lk(mu_);
  net::Writer w;
  w.u8(uint8_t(Op::Wait)).u8(want_value ? 1 : 0).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(timeout.count());
  std::string rep = request(w.bytes(), timeout + kReplySlack);
  net::Reader r(rep);
  WaitResult res;
  auto st = static_cast<Status>(r.u8());
  if (st == Status::Ok) {
    res.ok = true;
    if (want_value) res.value = r.str();
    return res;
  }
  if (st != Status::Timeout && st != Status::PeerLost)
    DS_THROW("store wait rejected: {}", r.done() ? std::string() : r.str());
  uint32_t nl = r.u32();
  for (uint32_t i = 0; i < nl; ++i) res.lost_ranks.push_back(static_cast<int>(r.i64()));
  uint32_t nm = r.u32();
  for (uint32_t i = 0; i < nm; ++i) res.missing.push_back(r.str());
  return res;
}

void TcpStore::throw_wait_failure(const std::string& what, const WaitResult& r,
                                  milliseconds timeout) const {
  std::string keys;
  for (size_t i = 0; i < r.missing.size() && i < 16; ++i) keys += (i ? ", '" : "'") + r.missing[i] + "'";
  if (r.missing.size() > 16) keys += fmt::format(" and {} more", r.missing.size() - 16);
  if (!r.lost_ranks.empty())
    DS_THROW("{} failed: rank(s) {} dropped their connection to the store without a goodbye (died, "
             "or gave up on an error); still missing keys: {}", what, join_ints(r.lost_ranks), keys);
  DS_THROW("{} timed out after {}; missing keys: {}", what, seconds_str(timeout), keys);
}

std::string TcpStore::get(const std::string& key) { return get(key, timeout_); }

std::string TcpStore::get(const std::string& key, milliseconds timeout) {
  WaitResult r = try_wait({key}, timeout, true);
  if (!r.ok) throw_wait_failure(fmt::format("rank {}: store get '{}'", rank_, key), r, timeout);
  return r.value;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  WaitResult r = try_wait(keys, timeout, false);
  if (!r.ok) throw_wait_failure(fmt::format("rank {}: store wait", rank_), r, timeout);
}

void TcpStore::barrier(const std::string& name, int rank, int world_size) {
  barrier(name, rank, world_size, timeout_);
}

// Each rank marks its arrival (for the error message), counts itself in, and
// the last to arrive sets the done key every rank waits for: O(1) keys per
// rank, so a barrier of N ranks costs the store O(N) work and bytes (waiting on
// all N arrival keys costs O(N^2) bytes). Only on a failure does a rank ask
// which arrival keys are missing.
void TcpStore::barrier(const std::string& name, int rank, int world_size, milliseconds timeout) {
  std::string prefix = "barrier/" + name + "/";
  set(prefix + std::to_string(rank), "1");
  if (add(prefix + "count", 1) == world_size) set(prefix + "done", "1");
  if (try_wait({prefix + "done"}, timeout, false).ok) return;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  WaitResult res = try_wait(keys, milliseconds(0), false);
  if (res.ok) return;  // everybody arrived just now
  std::vector<int> missing;
  for (const auto& k : res.missing) missing.push_back(std::stoi(k.substr(prefix.size())));
  std::sort(missing.begin(), missing.end());
  if (!res.lost_ranks.empty())
    DS_THROW("rank {}: rendezvous '{}' failed: ranks never arrived: {} (world size {}); rank(s) "
             "{} dropped their connection to the store without a goodbye (died, or gave up on an "
             "error); check those ranks' logs", rank_, name, join_ints(missing), world_size,
             join_ints(res.lost_ranks));
  DS_THROW("rank {}: rendezvous '{}' timed out after {}: ranks never arrived: {} (world size {}); "
           "check those ranks' logs", rank_, name, seconds_str(timeout), join_ints(missing),
           world_size);
}

}  // namespace ds
