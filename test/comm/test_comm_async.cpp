// The communication thread and handles in one process: functions run in
// submission order, errors come back through wait() and fail what was queued
// behind them, drain() waits for everything, and a one-member Gloo group's
// async forms check their arguments at issue time.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "lib/comm/comm_handle.h"
#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/core/sync_counter.h"

using namespace ds;

TEST_CASE("CommWorker runs functions in submission order", "[cpu]") {
  std::vector<int> seen;
  std::vector<CommHandle> hs;
  {
    CommWorker w("g");
    for (int i = 0; i < 500; ++i)
      hs.push_back(w.submit("op", [&seen, i] {
        if (i % 97 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        seen.push_back(i);
      }));
    hs[250].wait();
    REQUIRE(seen.size() >= 251);
    w.drain();
    REQUIRE(w.idle());
    REQUIRE(seen.size() == 500);
  }
  for (int i = 0; i < 500; ++i) REQUIRE(seen[i] == i);
  for (auto& h : hs) REQUIRE(h.ready());
}

TEST_CASE("CommWorker: an error surfaces through wait() and fails the ops queued behind it", "[cpu]") {
  CommWorker w("world/dp/0");
  std::atomic<int> ran{0};
  std::atomic<bool> go{false};
  CommHandle first = w.submit("all_reduce", [&] {
    while (!go) std::this_thread::yield();
    ++ran;
  });
  CommHandle bad = w.submit("reduce_scatter", [] { throw Error("peer 3 went away"); });
  CommHandle after = w.submit("all_gather", [&] { ++ran; });
  REQUIRE_FALSE(after.ready());
  go = true;
  first.wait();
  REQUIRE_THROWS_WITH(bad.wait(), "peer 3 went away");
  REQUIRE_THROWS_WITH(bad.wait(), "peer 3 went away");  // waiting again rethrows
  REQUIRE_THROWS_WITH(after.wait(), Catch::Contains("asynchronous all_gather on group 'world/dp/0' not run") &&
                                        Catch::Contains("peer 3 went away"));
  REQUIRE(ran == 1);
}

TEST_CASE("the first wait on an operation counts as a host synchronisation; a repeated or empty one does not",
          "[cpu]") {
  CommWorker w("g");
  std::atomic<bool> go{false};
  CommHandle slow = w.submit("op", [&] {
    while (!go) std::this_thread::yield();
  });
  const int64_t before = host_sync_count();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    go = true;
  });
  slow.wait();
  release.join();
  REQUIRE(host_sync_count() - before == 1);
  slow.wait();  // already waited for: not counted again
  CommHandle().wait();  // an empty handle is complete
  REQUIRE(host_sync_count() - before == 1);
}

TEST_CASE("async forms on a one-member Gloo group: argument errors at issue, results after wait", "[cpu]") {
  RendezvousInfo info;  // world of 1
  auto c = make_world_communicator(Backend::Gloo, info);
  Tensor a = Tensor::empty({10}, DType::F32), out = Tensor::empty({7}, DType::F32);
  for (int i = 0; i < 10; ++i) a.data<float>()[i] = static_cast<float>(i);
  REQUIRE_THROWS_WITH(c->iall_gather(a, out), Catch::Contains("all_gather on group 'world'"));
  REQUIRE_THROWS_WITH(c->isend(a, 0), Catch::Contains("send to 0 from rank 0"));
  Tensor rs = Tensor::empty({10}, DType::F32);
  CommHandle h1 = c->iall_reduce(a);
  CommHandle h2 = c->ireduce_scatter(a, rs);
  h1.wait();
  h2.wait();
  for (int i = 0; i < 10; ++i) REQUIRE(rs.data<float>()[i] == static_cast<float>(i));
  c->ibarrier().wait();
  c->wait_all();
}
