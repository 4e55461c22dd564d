// The communication thread of a group (CommWorker) and its handles.
#include "lib/comm/comm_handle.h"

#include "lib/core/error.h"
#include "lib/core/sync_counter.h"

namespace ds {

struct CommWorker::Task : CommHandle::State {
  std::string what;
  std::function<void()> fn;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool waited = false;  // wait() was called (counted once)
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    error = e;
    done = true;
    fn = nullptr;  // releases the buffers the op captured
    cv.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu);
    // The first wait is a point where the host may block on communication:
    // counted whether or not the operation has already finished, so that the
    // count is a property of the code rather than of thread timing.
    if (!waited) {
      waited = true;
      count_host_sync();
    }
    cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool ready() override {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

CommWorker::CommWorker(std::string group) : group_(std::move(group)) {
  thread_ = std::thread([this] { loop(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CommHandle CommWorker::submit(std::string what, std::function<void()> fn) {
  auto t = std::make_shared<Task>();
  t->what = std::move(what);
  t->fn = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(mu_);
    DS_CHECK(!stop_, "asynchronous {} on group '{}' after its communicator was destroyed", t->what, group_);
    queue_.push_back(t);
  }
  cv_.notify_all();
  return CommHandle(t);
}

bool CommWorker::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && !running_;
}

void CommWorker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !running_) return;
  count_host_sync();
  idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
}

void CommWorker::loop() {
  while (true) {
    std::shared_ptr<Task> t;
    std::string failed;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      t = queue_.front();
      queue_.pop_front();
      running_ = true;
      failed = failed_;
    }
    std::exception_ptr err;
    if (!failed.empty()) {
      err = std::make_exception_ptr(Error(fmt::format(
          "asynchronous {} on group '{}' not run: an earlier asynchronous operation on the group failed: {}",
          t->what, group_, failed)));
    } else {
      try {
        t->fn();
      } catch (const std::exception& e) {
        err = std::current_exception();
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = e.what();
      } catch (...) {
        err = std::current_exception();
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = "unknown error";
      }
    }
    // The handle completes and the thread turns idle in one critical
    // section: a caller that saw the handle done and then issues a blocking
    // op finds nothing to drain, so the host synchronisations counted do not
    // depend on thread timing. (Lock order: mu_, then the task's mu.)
    {
      std::lock_guard<std::mutex> lock(mu_);
      t->finish(err);
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
}

}  // namespace ds
