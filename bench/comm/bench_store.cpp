// The rendezvous store under the load of an N-rank job's start-up: one
// TcpStore server (in this process, as on rank 0) and N client threads on
// loopback, each doing what a rank does before training: connect (the
// challenge-response handshake), set its address key, join the world barrier,
// then read one key that rank 0 set (an NCCL unique id). With --mesh each
// rank also reads every other rank's address key, as Gloo's full-mesh
// rendezvous does (N^2 requests in all). Prints, per N: when the last client
// was admitted, when the last one left the barrier, when the last one had
// the id (and the mesh), all from the start, and the process's resident set
// growth (server map, connections and the clients' buffers and stacks).
//   bench_store [--clients 256,1024,4096] [--mesh]
// Results and the machine: docs/benchmarks.md, "Rendezvous store under load".
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  return 0;
}

struct Times {
  double admitted = 0, barrier = 0, id = 0, mesh = 0;  // seconds from the start
};

void run(int n, bool mesh) {
  ds::TcpStoreOptions so;
  so.is_server = true;
  so.port = 0;
  so.token = "bench";
  so.rank = 0;
  so.world_size = n;
  so.timeout = std::chrono::seconds(600);
  const int64_t rss0 = rss_kb();
  const auto t0 = Clock::now();
  ds::TcpStore server(so);  // rank 0's own client too
  std::vector<Times> times(n);
  std::atomic<bool> failed{false};
  auto secs = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto rank_body = [&](int r, ds::TcpStore& s) {
    times[r].admitted = secs();
    s.set("addr/" + std::to_string(r), std::string(64, 'a'));
    s.barrier("world/join", r, n);
    times[r].barrier = secs();
    if (r == 0) s.set("nccl/world/unique_id", std::string(128, 'u'));
    (void)s.get("nccl/world/unique_id");
    times[r].id = secs();
    if (mesh)
      for (int p = 0; p < n; ++p)
        if (p != r) (void)s.get("addr/" + std::to_string(p));
    times[r].mesh = secs();
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 1; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ds::TcpStoreOptions c = so;
        c.is_server = false;
        c.port = server.port();
        c.rank = r;
        ds::TcpStore s(c);
        rank_body(r, s);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        failed = true;
      }
    });
  int64_t peak = rss_kb();
  rank_body(0, server);
  for (auto& t : threads) t.join();
  peak = std::max(peak, rss_kb());
  if (failed) {
    std::printf("%6d clients: FAILED\n", n);
    return;
  }
  auto last = [&](double Times::*f) {
    double m = 0;
    for (const Times& t : times) m = std::max(m, t.*f);
    return m;
  };
  std::printf("%6d clients: all admitted %7.3f s | barrier done %7.3f s | id read %7.3f s%s | RSS +%lld MB\n", n,
              last(&Times::admitted), last(&Times::barrier), last(&Times::id),
              mesh ? (" | mesh done " + std::to_string(last(&Times::mesh)) + " s").c_str() : "",
              static_cast<long long>((peak - rss0) / 1024));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts = {64, 256, 1024};
  bool mesh = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mesh")) {
      mesh = true;
    } else if (!std::strcmp(argv[i], "--clients") && i + 1 < argc) {
      counts.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) counts.push_back(std::atoi(item.c_str()));
    } else {
      std::fprintf(stderr, "usage: bench_store [--clients N[,N...]] [--mesh]\n");
      return 2;
    }
  }
  for (int n : counts) {
    if (n < 1) {
      std::fprintf(stderr, "bench_store: --clients needs positive counts\n");
      return 2;
    }
    run(n, mesh);
  }
  return 0;
}
