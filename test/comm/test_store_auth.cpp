// The rendezvous handshake against hostile peers, over real loopback sockets:
// a squatter that holds MASTER_PORT and records what a rank sends never sees
// the token; a fake store that does not know the token is refused by the
// client with one clear line; a client with a wrong token, or that sends
// garbage, gets a bare refusal with no source path, host name or key data.
#include <catch2/catch.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "lib/comm/socket_util.h"
#include "lib/comm/store_auth.h"
#include "lib/comm/store_protocol.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/crypto.h"
#include "lib/core/error.h"
#include "test/comm/store_test_util.h"

using namespace ds;
using namespace std::chrono_literals;
using ds::test::client_opts;
using store_proto::Op;
using store_proto::Status;

namespace {

std::string frame(const std::string& payload) {
  return net::Writer().u32(static_cast<uint32_t>(payload.size())).bytes() + payload;
}

// Everything the peer sends until it closes or `quiet` passes without a byte.
std::string read_until_quiet(int fd, std::chrono::milliseconds quiet) {
  std::string got;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(quiet.count())) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

bool peer_closed(int fd) {
  char b;
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 3000) == 1 && recv(fd, &b, 1, 0) == 0;
}

std::string recv_one(int fd) {
  std::string payload, err;
  REQUIRE(net::recv_frame(fd, payload, net::Clock::now() + 3s, net::kMaxFrame, err) == 1);
  return payload;
}

// A process that took MASTER_PORT first: accepts one connection, runs
// `script` on it and records every byte the client sent.
class Squatter {
 public:
  using Script = std::function<void(int fd, std::string& captured)>;
  explicit Squatter(Script script) {
    int err = 0;
    listen_fd_ = net::listen_for("127.0.0.1", 0, err);
    REQUIRE(listen_fd_ >= 0);
    port_ = net::bound_port(listen_fd_);
    thread_ = std::thread([this, script] {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 10000) != 1) return;
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      script(fd, captured_);
      captured_ += read_until_quiet(fd, 500ms);
      close(fd);
    });
  }
  ~Squatter() {
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  // What the client sent (waits for the squatter to finish).
  const std::string& captured() {
    if (thread_.joinable()) thread_.join();
    return captured_;
  }

 private:
  int listen_fd_ = -1, port_ = 0;
  std::string captured_;
  std::thread thread_;
};

// A squatter that plays the server's part as far as it can without the token:
// a challenge, then the client's hello is recorded and answered with `reply`.
Squatter::Script fake_store(std::function<std::string(const std::string& hello)> reply) {
  return [reply](int fd, std::string& captured) {
    const std::string nonce = crypto::random_bytes(store_auth::kNonceBytes);
    const std::string challenge = frame(net::Writer().u8(uint8_t(Op::Challenge)).str(nonce).bytes());
    (void)!send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    std::string hello, err;
    if (net::recv_frame(fd, hello, net::Clock::now() + 5s, net::kMaxFrame, err) != 1) return;
    captured += frame(hello);
    const std::string out = frame(reply(hello));
    (void)!send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  };
}

std::string user_error_of(const TcpStoreOptions& o) {
  try {
    TcpStore c(o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no user error)";
}

// Nothing an unauthenticated client may learn: source paths, file:line, host.
void check_nothing_internal(const std::string& bytes) {
  CHECK(bytes.find(".cpp") == std::string::npos);
  CHECK(bytes.find(".h:") == std::string::npos);
  CHECK(bytes.find('/') == std::string::npos);
  CHECK(bytes.find("host=") == std::string::npos);
  CHECK(bytes.find("lib") == std::string::npos);
}

}  // namespace

TEST_CASE("rendezvous: a squatter on MASTER_PORT never sees the token", "[store][auth]") {
  const std::string token = "job-secret-" + crypto::to_hex(crypto::random_bytes(8));
  const std::string hex = crypto::to_hex(token);
  // It speaks the protocol as far as it can: challenge, then "Ok" with a made-up proof.
  Squatter speaking(fake_store([](const std::string&) {
    return net::Writer().u8(uint8_t(Status::Ok)).str(crypto::random_bytes(32)).bytes();
  }));
  const std::string err = user_error_of(client_opts(speaking.port(), 1, token, 3000ms));
  CHECK_THAT(err, Catch::Contains("failed to prove it knows the job token"));
  const std::string& seen = speaking.captured();
  CHECK(seen.size() > 4 + store_auth::kNonceBytes);  // it did receive the rank's hello
  CHECK(seen.find(token) == std::string::npos);
  CHECK(seen.find(hex) == std::string::npos);
  CHECK(seen.find("job-secret") == std::string::npos);
  // A silent one learns nothing at all: a rank speaks only after a challenge.
  Squatter silent([](int, std::string&) { std::this_thread::sleep_for(2s); });
  CHECK_THAT(user_error_of(client_opts(silent.port(), 1, token, 1000ms)), Catch::Contains("no answer"));
  CHECK(silent.captured().empty());
}

TEST_CASE("rendezvous: a store that cannot prove the token is refused with one clear line", "[store][auth]") {
  const std::string token = "the-real-token";
  struct Case {
    const char* what;
    std::function<std::string(const std::string& hello)> reply;
  };
  const std::vector<Case> cases = {
      {"Ok with a random proof",
       [](const std::string&) { return net::Writer().u8(uint8_t(Status::Ok)).str(crypto::random_bytes(32)).bytes(); }},
      {"a bare Ok (the old protocol)", [](const std::string&) { return net::Writer().u8(uint8_t(Status::Ok)).bytes(); }},
      {"the client's own proof reflected",
       [](const std::string& hello) {
         net::Reader r(hello);
         r.u8();
         r.str();
         r.i64();
         return net::Writer().u8(uint8_t(Status::Ok)).str(r.str()).bytes();
       }},
      {"a proof made with another token",
       [](const std::string& hello) {
         net::Reader r(hello);
         r.u8();
         const std::string cn = r.str();
         const int64_t rank = r.i64();
         return net::Writer()
             .u8(uint8_t(Status::Ok))
             .str(store_auth::server_proof("guess", std::string(32, 'x'), cn, rank, uint8_t(Status::Ok)))
             .bytes();
       }},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    Squatter fake(fake_store(c.reply));
    const std::string err = user_error_of(client_opts(fake.port(), 3, token, 3000ms));
    CHECK(err == "rank 3: rendezvous: the store at 127.0.0.1:" + std::to_string(fake.port()) +
                     " failed to prove it knows the job token (another process may hold MASTER_PORT)");
  }
  // An unproven refusal's reason is not repeated (it could say anything).
  Squatter liar(fake_store([](const std::string&) {
    return net::Writer().u8(uint8_t(Status::Refused)).str("all good\nrun this").str("").bytes();
  }));
  const std::string err = user_error_of(client_opts(liar.port(), 1, token, 3000ms));
  CHECK_THAT(err, Catch::Contains("refused this rank's proof") && Catch::Contains("DS_JOB_TOKEN"));
  CHECK(err.find("run this") == std::string::npos);
  CHECK(err.find('\n') == std::string::npos);
  // Junk instead of a challenge.
  Squatter junk([](int fd, std::string&) {
    const std::string out = frame("HTTP/1.1 200 OK");
    (void)!send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  });
  CHECK_THAT(user_error_of(client_opts(junk.port(), 1, token, 3000ms)),
             Catch::Contains("failed to prove it knows the job token"));
}

TEST_CASE("rendezvous: a client without the token gets a bare refusal and no internals", "[store][auth]") {
  TcpStoreOptions so = client_opts(0, 0, "right-token", 5000ms);
  so.is_server = true;
  TcpStore server(so);
  server.set("secret-key", "secret-value");
  auto connect = [&] {
    std::string err;
    const int fd = net::try_connect("127.0.0.1", server.port(), net::Clock::now() + 3s, err);
    REQUIRE(fd >= 0);
    return fd;
  };
  auto challenge_of = [&](int fd) {
    const std::string c = recv_one(fd);  // a code and a random nonce, nothing else
    REQUIRE(c.size() == 1 + 4 + store_auth::kNonceBytes);
    net::Reader r(c);
    REQUIRE(r.u8() == uint8_t(Op::Challenge));
    return r.str();
  };
  // A hello proven with the wrong token.
  int fd = connect();
  const std::string sn = challenge_of(fd), cn = crypto::random_bytes(32);
  const std::string hello = net::Writer()
                                .u8(uint8_t(Op::Hello))
                                .str(cn)
                                .i64(1)
                                .str(store_auth::client_proof("wrong-token", sn, cn, 1))
                                .bytes();
  REQUIRE(net::send_frame(fd, hello));
  std::string reply = recv_one(fd);
  check_nothing_internal(reply);
  CHECK(reply == net::Writer().u8(uint8_t(Status::Refused)).str("authentication failed").str("").bytes());
  CHECK(peer_closed(fd));
  close(fd);
  // Garbage before a hello: a truncated hello, a request for a key, an unknown code.
  for (const std::string& bad : {std::string(1, char(Op::Hello)),
                                 net::Writer().u8(uint8_t(Op::Wait)).u8(1).u32(1).str("secret-key").i64(100).bytes(),
                                 std::string("\x63\x00", 2)}) {
    fd = connect();
    challenge_of(fd);
    REQUIRE(net::send_frame(fd, bad));
    reply = read_until_quiet(fd, 1000ms);
    check_nothing_internal(reply);
    CHECK(reply.find("secret") == std::string::npos);
    CHECK(reply == frame(net::Writer().u8(uint8_t(Status::Refused)).str("authentication failed").str("").bytes()));
    close(fd);
  }
  // The store still serves its ranks, and their own bad requests get no internals either.
  TcpStore ok(client_opts(server.port(), 1, "right-token", 3000ms));
  CHECK(ok.get("secret-key") == "secret-value");
}

TEST_CASE("rendezvous: bad requests of an authenticated client carry no file:line", "[store][auth]") {
  TcpStoreOptions so = client_opts(0, 0, "tok", 5000ms);
  so.is_server = true;
  TcpStore server(so);
  std::string err;
  const int fd = net::try_connect("127.0.0.1", server.port(), net::Clock::now() + 3s, err);
  REQUIRE(fd >= 0);
  const std::string challenge = recv_one(fd);
  net::Reader ch_reader(challenge);
  REQUIRE(ch_reader.u8() == uint8_t(Op::Challenge));
  const std::string sn = ch_reader.str(), cn = crypto::random_bytes(32);
  REQUIRE(net::send_frame(fd, net::Writer()
                                  .u8(uint8_t(Op::Hello))
                                  .str(cn)
                                  .i64(-1)
                                  .str(store_auth::client_proof("tok", sn, cn, -1))
                                  .bytes()));
  const std::string welcome = recv_one(fd);
  net::Reader ok(welcome);
  REQUIRE(ok.u8() == uint8_t(Status::Ok));
  CHECK(crypto::constant_time_equal(ok.str(), store_auth::server_proof("tok", sn, cn, -1, uint8_t(Status::Ok))));
  server.set("word", "abc");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(1, char(Op::Set)), "malformed request"},           // truncated
      {std::string("\x63", 1), "unknown request code 99"},            // unknown code
      {net::Writer().u8(uint8_t(Op::Add)).str("word").i64(1).bytes(), "the value of 'word' is not an integer"}};
  for (const auto& [request, reason] : cases) {
    REQUIRE(net::send_frame(fd, request));
    const std::string reply = recv_one(fd);
    check_nothing_internal(reply);
    CHECK(reply == net::Writer().u8(uint8_t(Status::Bad)).str(reason).bytes());
  }
  close(fd);
}
