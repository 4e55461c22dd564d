// StallMonitor (stall_monitor.h).
#include "lib/comm/stall_monitor.h"

namespace ds {
namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StallMonitor::StallMonitor(std::chrono::milliseconds limit, std::function<void(double)> on_stall,
                           std::chrono::milliseconds period)
    : last_ns_(steady_now_ns()),
      limit_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count()),
      on_stall_(std::move(on_stall)),
      period_(period),
      thread_([this] { loop(); }) {}

StallMonitor::~StallMonitor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallMonitor::beat() { last_ns_.store(steady_now_ns(), std::memory_order_relaxed); }

void StallMonitor::pause() { paused_.store(true, std::memory_order_release); }

void StallMonitor::set_limit(std::chrono::milliseconds limit) {
  limit_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count(), std::memory_order_relaxed);
}

void StallMonitor::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, period_);
    if (stop_ || paused_.load(std::memory_order_acquire)) continue;
    const int64_t idle = steady_now_ns() - last_ns_.load(std::memory_order_relaxed);
    if (idle <= limit_ns_.load(std::memory_order_relaxed)) continue;
    paused_.store(true, std::memory_order_release);  // once
    lk.unlock();
    on_stall_(static_cast<double>(idle) * 1e-9);
    lk.lock();
  }
}

}  // namespace ds
