// TcpStore tests inside one process (server + clients as threads): the key
// operations, blocking get, token refusal, timeouts that name missing keys and
// ranks, lost ranks, port in use, unreachable server. Also the single-process
// world communicator and the rank environment parser.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <cstdlib>
#include <future>
#include <thread>

#include "lib/comm/communicator.h"
#include "lib/comm/socket_util.h"
#include "lib/comm/tcp_store.h"
#include "lib/comm/tcp_store_server.h"
#include "lib/core/error.h"
#include "test/comm/store_test_util.h"

using namespace ds;
using namespace std::chrono_literals;
using ds::test::client_opts;

namespace {

TcpStoreOptions server_opts(const std::string& token = "tok", std::chrono::milliseconds t = 5000ms) {
  TcpStoreOptions o;
  o.port = 0;
  o.is_server = true;
  o.token = token;
  o.rank = 0;
  o.timeout = t;
  return o;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("store: set, get, add, check, wait", "[store]") {
  TcpStore server(server_opts());
  TcpStore a(client_opts(server.port(), 1)), b(client_opts(server.port(), 2));
  a.set("k", "v");
  CHECK(b.get("k") == "v");
  std::string bin("a\0b\xff", 4);
  b.set("bin", bin);
  CHECK(a.get("bin") == bin);
  std::string big(1 << 20, 'x');
  a.set("big", big);
  CHECK(server.get("big") == big);
  CHECK(a.add("n", 5) == 5);
  CHECK(b.add("n", -2) == 3);
  CHECK(server.get("n") == "3");
  CHECK(a.check({"k", "n"}));
  CHECK_FALSE(a.check({"k", "absent"}));
  // A blocking get is answered when another client sets the key.
  auto fut = std::async(std::launch::async, [&] { return a.get("later"); });
  std::this_thread::sleep_for(50ms);
  b.set("later", "here");
  CHECK(fut.get() == "here");
  auto w = std::async(std::launch::async, [&] { b.wait({"x", "y"}); return true; });
  a.set("x", "1");
  server.set("y", "2");
  CHECK(w.get());
}

TEST_CASE("store: wait timeout names the missing keys", "[store]") {
  TcpStore server(server_opts());
  TcpStore a(client_opts(server.port(), 1));
  a.set("present", "1");
  auto t0 = std::chrono::steady_clock::now();
  std::string err = error_of([&] { a.wait({"present", "absent/one"}, 300ms); });
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THAT(err, Catch::Contains("timed out") && Catch::Contains("'absent/one'"));
  CHECK_THAT(err, !Catch::Contains("'present'"));
  CHECK_THAT(error_of([&] { a.get("nope", 200ms); }), Catch::Contains("'nope'"));
}

TEST_CASE("store: barrier timeout lists the ranks that never arrived", "[store]") {
  TcpStore server(server_opts("tok", 800ms));
  TcpStore r1(client_opts(server.port(), 1, "tok", 800ms));
  auto f1 = std::async(std::launch::async, [&] { return error_of([&] { r1.barrier("join", 1, 4); }); });
  std::string e0 = error_of([&] { server.barrier("join", 0, 4); });
  CHECK_THAT(e0, Catch::Contains("ranks never arrived: 2, 3") && Catch::Contains("world size 4"));
  CHECK_THAT(f1.get(), Catch::Contains("ranks never arrived: 2, 3"));
}

TEST_CASE("store: a barrier completes when all ranks arrive", "[store]") {
  TcpStore server(server_opts());
  std::vector<std::future<void>> fs;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int r = 1; r < 4; ++r) clients.push_back(std::make_unique<TcpStore>(client_opts(server.port(), r)));
  for (int r = 1; r < 4; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] { clients[r - 1]->barrier("b", r, 4); }));
  server.barrier("b", 0, 4);
  for (auto& f : fs) f.get();
}

TEST_CASE("store: a rank that dies fails the waiters at once", "[store]") {
  TcpStore server(server_opts("tok", 10000ms));
  auto t0 = std::chrono::steady_clock::now();
  auto waiter = std::async(std::launch::async, [&] {
    return error_of([&] { server.barrier("join", 0, 2); });
  });
  std::this_thread::sleep_for(100ms);
  try {
    TcpStore doomed(client_opts(server.port(), 1, "tok", 10000ms));
    throw std::runtime_error("simulated crash");  // unwinding: no goodbye is sent
  } catch (const std::runtime_error&) {
  }
  std::string err = waiter.get();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK_THAT(err, Catch::Contains("rank(s) 1 dropped their connection") &&
                      Catch::Contains("never arrived: 1"));
}

TEST_CASE("store: the job token is checked", "[store]") {
  TcpStore server(server_opts("secret"));
  std::string err = error_of([&] { TcpStore c(client_opts(server.port(), 1, "wrong")); });
  CHECK_THAT(err, Catch::Contains("refused") && Catch::Contains("DS_JOB_TOKEN"));
  CHECK_THAT(error_of([&] { TcpStore c(client_opts(server.port(), 1, "")); }), Catch::Contains("refused"));
  TcpStore ok(client_opts(server.port(), 1, "secret"));
  ok.set("a", "b");
  TcpStore open_server(server_opts(""));
  TcpStore anon(client_opts(open_server.port(), 1, ""));
  anon.set("a", "b");
  CHECK_THAT(error_of([&] { TcpStore c(client_opts(open_server.port(), 2, "x")); }),
             Catch::Contains("refused"));
}

TEST_CASE("store: port in use and unreachable server are user errors", "[store]") {
  TcpStore server(server_opts());
  TcpStoreOptions again = server_opts();
  again.port = server.port();
  CHECK_THROWS_AS(TcpStore(again), UserError);
  CHECK_THAT(error_of([&] { TcpStore s(again); }), Catch::Contains("already in use"));
  int dead_port = server.port();
  {
    TcpStoreOptions o = server_opts();
    TcpStore tmp(o);
    dead_port = tmp.port();
  }  // closed: nobody listens there now
  auto t0 = std::chrono::steady_clock::now();
  std::string err = error_of([&] { TcpStore c(client_opts(dead_port, 3, "tok", 500ms)); });
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THAT(err, Catch::Contains("rank 3: cannot reach the rendezvous store") &&
                      Catch::Contains("MASTER_ADDR"));
}

TEST_CASE("world of one: no sockets, collectives are identities", "[comm]") {
  RendezvousInfo info;  // defaults: rank 0 of 1
  auto c = make_world_communicator(Backend::Gloo, info);
  CHECK(c->size() == 1);
  CHECK(c->store() == nullptr);
  Tensor t = Tensor::empty({5}, DType::F32);
  for (int i = 0; i < 5; ++i) t.data<float>()[i] = float(i);
  c->all_reduce(t);
  Tensor out = Tensor::empty({5}, DType::F32);
  c->reduce_scatter(t, out);
  c->all_gather(t, out);
  c->broadcast(t, 0);
  c->barrier();
  for (int i = 0; i < 5; ++i) CHECK(out.data<float>()[i] == float(i));
  auto g = c->split({0}, "solo");
  CHECK(g->size() == 1);
  CHECK(g->name() == "world/solo");
  g->all_reduce(t, ReduceOp::Max);
  CHECK_THROWS(c->split({0}, "solo"));     // tag reuse
  CHECK_THROWS(c->split({1}, "outside"));  // not a member
  CHECK_THROWS(c->all_reduce(Tensor::empty({2}, DType::F32, Device::cuda(0))));
}

TEST_CASE("rendezvous info from the environment", "[comm]") {
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "3", 1);
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "1234", 1);
  setenv("DS_JOB_TOKEN", "abc", 1);
  RendezvousInfo r = RendezvousInfo::from_env();
  CHECK(r.rank == 3);
  CHECK(r.world_size == 4);
  CHECK(r.master_addr == "10.1.2.3");
  CHECK(r.master_port == 1234);
  CHECK(r.token == "abc");
  setenv("RANK", "4", 1);
  CHECK_THAT(error_of([] { RendezvousInfo::from_env(); }), Catch::Contains("RANK=4"));
  setenv("RANK", "x", 1);
  CHECK_THAT(error_of([] { RendezvousInfo::from_env(); }), Catch::Contains("RANK='x'"));
  setenv("RANK", "0", 1);
  unsetenv("MASTER_ADDR");
  CHECK_THAT(error_of([] { RendezvousInfo::from_env(); }), Catch::Contains("MASTER_ADDR"));
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_PORT", "DS_JOB_TOKEN"}) unsetenv(v);
  r = RendezvousInfo::from_env();
  CHECK(r.world_size == 1);
  CHECK(r.rank == 0);
  CHECK(backend_from_name("gloo") == Backend::Gloo);
  CHECK_THROWS_AS(backend_from_name("mpi"), UserError);
}

namespace {

// Local address of the TCP socket listening on `port` ("" if none), from
// /proc/net/tcp and /proc/net/tcp6 (state 0A = LISTEN), as the kernel prints it.
std::string listening_address(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(table, "r");
    if (!f) continue;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      char local[128] = {0}, remote[128] = {0}, state[8] = {0};
      if (std::sscanf(line, " %*d: %127s %127s %7s", local, remote, state) != 3) continue;
      std::string l = local;
      const size_t colon = l.rfind(':');
      if (colon == std::string::npos || std::string(state) != "0A") continue;
      if (std::stoi(l.substr(colon + 1), nullptr, 16) == port) {
        std::fclose(f);
        return l.substr(0, colon);
      }
    }
    std::fclose(f);
  }
  return "";
}

// This host's first non-loopback IPv4 address ("" if none).
std::string own_ipv4() {
  ifaddrs* ifs = nullptr;
  std::string out;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a->sin_addr.s_addr) >> 24) != 127 && inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) out = buf;
  }
  freeifaddrs(ifs);
  return out;
}

// /proc/net/tcp's spelling of an IPv4 address (little-endian hex).
std::string proc_hex(const std::string& ipv4) {
  in_addr a{};
  inet_pton(AF_INET, ipv4.c_str(), &a);
  return fmt::format("{:08X}", a.s_addr);
}

}  // namespace

TEST_CASE("store: the server listens at the master address, loopback for a local job", "[store]") {
  TcpStoreOptions o = server_opts();
  o.host = "127.0.0.1";  // a single local node: what dsrun sets
  TcpStore local(o);
  CHECK(listening_address(local.port()) == "0100007F");  // 127.0.0.1, little-endian hex
  CHECK(net::is_loopback_literal("127.0.0.1"));
  CHECK(net::is_loopback_literal("127.5.6.7"));
  CHECK(net::is_loopback_literal("localhost"));
  CHECK(net::is_loopback_literal("::1"));
  CHECK_FALSE(net::is_loopback_literal("10.0.0.1"));
  CHECK_FALSE(net::is_loopback_literal("worker-0"));
  struct Case {
    std::string master_addr, want;  // want: /proc/net/tcp address, "any" for every interface
  };
  std::vector<Case> cases = {{"127.0.0.2", "0200007F"},  // exactly the loopback alias the ranks use
                             {"localhost", "0100007F"},
                             {"10.1.2.3", "any"},  // not an address of this host (NAT): every interface
                             {"worker-0", "any"}};  // a name may mean a loopback alias here
  if (const std::string own = own_ipv4(); !own.empty()) cases.push_back({own, proc_hex(own)});
  for (const auto& c : cases) {
    INFO(c.master_addr);
    int err = 0;
    const int fd = net::listen_for(c.master_addr, 0, err);
    REQUIRE(fd >= 0);
    const std::string addr = listening_address(net::bound_port(fd));
    if (c.want == "any")
      CHECK((addr == "00000000" || addr == "00000000000000000000000000000000"));
    else
      CHECK(addr == c.want);
    close(fd);
  }
}

TEST_CASE("store: a client with the token but a rank outside the job is refused and cannot abort the rendezvous",
          "[store]") {
  TcpStoreOptions so = server_opts();
  so.world_size = 2;
  TcpStore server(so);
  auto waiter = std::async(std::launch::async, [&] { return server.get("ready"); });
  TcpStoreOptions bogus = client_opts(server.port(), 7);
  bogus.timeout = 2000ms;
  CHECK_THAT(error_of([&] { TcpStore s(bogus); }), Catch::Contains("rank 7 is not one of this job's 2 ranks"));
  TcpStore one(client_opts(server.port(), 1));
  TcpStoreOptions twin = client_opts(server.port(), 1);
  twin.timeout = 2000ms;
  CHECK_THAT(error_of([&] { TcpStore s(twin); }), Catch::Contains("rank 1 is already connected"));
  one.set("ready", "yes");  // the refused clients' departure did not fail the waiting rank 0
  CHECK(waiter.get() == "yes");
}

TEST_CASE("store: idle connections cannot starve the rendezvous", "[store]") {
  TcpStoreOptions so = server_opts();
  so.hello_timeout = 300ms;
  TcpStore server(so);
  // More idle connections than the server keeps waiting for a hello.
  std::vector<int> idle;
  for (size_t i = 0; i < TcpStoreServer::kMaxPending + 44; ++i) {
    std::string err;
    const int fd = net::try_connect("127.0.0.1", server.port(), net::Clock::now() + 2s, err);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  TcpStore client(client_opts(server.port(), 1));
  client.set("k", "v");
  CHECK(server.get("k") == "v");
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // A client that floods bytes instead of a hello is cut off at once.
  std::string err;
  const int flood = net::try_connect("127.0.0.1", server.port(), net::Clock::now() + 2s, err);
  REQUIRE(flood >= 0);
  const std::string junk(1 << 16, 'A');
  size_t sent = 0;
  while (sent < (64u << 20)) {
    const ssize_t n = ::send(flood, junk.data(), junk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  CHECK(sent < (32u << 20));  // refused after the kernel's buffers, not after 64 MB
  close(flood);
  client.set("k2", "v2");
  CHECK(server.get("k2") == "v2");
  // And an idle connection is closed once the hello deadline has passed
  // (after the challenge the server sent when it accepted it).
  std::this_thread::sleep_for(600ms);
  char b[256];
  ssize_t got = 0, n = 0;
  while ((n = ::recv(idle.back(), b, sizeof(b), 0)) > 0) got += n;
  CHECK(n == 0);  // EOF from the server
  CHECK(got == 4 + 1 + 4 + 32);  // the challenge frame, nothing else
  for (int fd : idle) close(fd);
}

// A job of more ranks than the server keeps waiting for a hello, all starting
// at once (thousands at scale): each is admitted in turn, none is turned away
// (it once closed the oldest pending connections, hellos already on their
// way, and those ranks failed to start), and the barrier and waits complete.
TEST_CASE("store: a burst of ranks beyond the pending-hello limit is admitted; barrier and waits at 768 ranks",
          "[store]") {
  constexpr int kWorld = 768;
  static_assert(kWorld > static_cast<int>(TcpStoreServer::kMaxPending));
  TcpStoreOptions so = server_opts("tok", 60000ms);
  so.world_size = kWorld;
  TcpStore server(so);
  std::vector<std::thread> ranks;
  std::atomic<int> failed{0};
  auto body = [&](TcpStore& s, int r) {
    s.set("addr/" + std::to_string(r), std::to_string(r));
    s.barrier("join", r, kWorld);
    const int peer = (r + 7) % kWorld;
    if (s.get("addr/" + std::to_string(peer)) != std::to_string(peer)) ++failed;
  };
  for (int r = 1; r < kWorld; ++r)
    ranks.emplace_back([&, r] {
      try {
        TcpStore s(client_opts(server.port(), r, "tok", 60000ms));
        body(s, r);
      } catch (const std::exception& e) {
        UNSCOPED_INFO("rank " << r << ": " << e.what());
        ++failed;
      }
    });
  body(server, 0);
  for (auto& t : ranks) t.join();
  CHECK(failed == 0);
}

// Parked waits, indexed by the keys they still miss: each completes when its
// last key is set, whatever the order and with repeated keys; one on a key
// that never comes times out naming that key only.
TEST_CASE("store: parked waits complete when their last key arrives, in any order", "[store]") {
  TcpStore server(server_opts());
  TcpStore setter(client_opts(server.port(), 1));
  const std::vector<std::vector<std::string>> waits = {
      {"a"}, {"a", "b"}, {"c", "b", "a"}, {"d", "d", "a"}, {"e"}, {"b", "e", "c", "d"}, {"a", "never"}};
  std::vector<std::future<TcpStore::WaitResult>> results;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (size_t i = 0; i < waits.size(); ++i) {
    clients.push_back(std::make_unique<TcpStore>(client_opts(server.port(), -1)));
    TcpStore* c = clients.back().get();
    const auto keys = waits[i];
    results.push_back(std::async(std::launch::async, [c, keys] { return c->try_wait(keys, 3000ms, false); }));
  }
  std::this_thread::sleep_for(100ms);  // all parked
  for (const char* k : {"d", "b", "e", "a", "c"}) {
    setter.set(k, "1");
    std::this_thread::sleep_for(20ms);
  }
  for (size_t i = 0; i + 1 < waits.size(); ++i) {
    INFO("wait " << i);
    CHECK(results[i].get().ok);
  }
  const TcpStore::WaitResult never = results.back().get();
  CHECK_FALSE(never.ok);
  CHECK(never.missing == std::vector<std::string>{"never"});
  // A wait on keys that exist answers at once; an add that creates a key completes a wait too.
  CHECK(setter.try_wait({"a", "e"}, 100ms, false).ok);
  auto counter = std::async(std::launch::async, [&] { return clients[0]->try_wait({"n"}, 3000ms, true); });
  std::this_thread::sleep_for(50ms);
  CHECK(setter.add("n", 5) == 5);
  const TcpStore::WaitResult n = counter.get();
  CHECK(n.ok);
  CHECK(n.value == "5");
}
