// StallMonitor (lib/comm/stall_monitor.h): the NCCL watchdog's own guard. A
// thread that keeps beating is never reported; one that stops is, once, with
// how long it has been idle; a paused monitor reports nothing.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "lib/comm/stall_monitor.h"

using namespace ds;
using namespace std::chrono_literals;

TEST_CASE("StallMonitor: a beating thread is never reported; a stopped one once, after the limit", "[cpu]") {
  std::atomic<int> stalls{0};
  std::atomic<double> idle{0};
  StallMonitor m(500ms, [&](double s) { idle = s; ++stalls; }, 10ms);
  const auto until = std::chrono::steady_clock::now() + 1200ms;
  auto stopped = std::chrono::steady_clock::now();  // the last beat
  while (std::chrono::steady_clock::now() < until) {  // 2.4x the limit, beating every 20 ms
    m.beat();
    stopped = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(20ms);
  }
  CHECK(stalls == 0);
  while (stalls == 0 && std::chrono::steady_clock::now() - stopped < 5s) std::this_thread::sleep_for(5ms);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  REQUIRE(stalls == 1);
  CHECK(idle >= 0.5);
  CHECK(waited >= 0.5);
  std::this_thread::sleep_for(300ms);
  CHECK(stalls == 1);  // reported once
}

TEST_CASE("StallMonitor: a paused monitor reports nothing; the limit can be raised", "[cpu]") {
  std::atomic<int> stalls{0};
  {
    StallMonitor m(100ms, [&](double) { ++stalls; }, 10ms);
    m.pause();
    std::this_thread::sleep_for(400ms);
  }
  CHECK(stalls == 0);
  {
    StallMonitor m(100ms, [&](double) { ++stalls; }, 10ms);
    m.set_limit(10s);
    std::this_thread::sleep_for(400ms);
  }
  CHECK(stalls == 0);
}
