// A thread that watches another thread's heartbeat and calls `on_stall` when
// it stops for longer than a limit. It makes no CUDA or NCCL call itself, so
// it keeps working when the watched thread is blocked inside one: the NCCL
// watchdog polls CUDA events, and an event query can wait behind a driver
// call of another thread (a cudaFree that synchronises with a hung kernel);
// the monitor then ends the process instead of letting the job hang
// (docs/distributed.md, "NCCL watchdog").
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace ds {

class StallMonitor {
 public:
  // on_stall(seconds since the last beat) runs on the monitor's thread, at
  // most once; `period` is how often it looks.
  StallMonitor(std::chrono::milliseconds limit, std::function<void(double)> on_stall,
               std::chrono::milliseconds period = std::chrono::seconds(1));
  ~StallMonitor();  // stops and joins the thread
  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  void beat();  // lock-free: the watched thread calls it every pass
  // The watched thread is done (it stopped on purpose): no stall is reported
  // from now on. Callable from any thread, the watched one included.
  void pause();
  void set_limit(std::chrono::milliseconds limit);

 private:
  void loop();
  std::atomic<int64_t> last_ns_;
  std::atomic<int64_t> limit_ns_;
  std::atomic<bool> paused_{false};
  std::function<void(double)> on_stall_;
  std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ds
