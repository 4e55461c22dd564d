// Asynchronous communication: the handle an asynchronously issued operation
// returns, and the per-group communication thread that runs blocking
// operations in issue order (the CPU backend's async form of every op).
//
// Any blocking operation of a Communicator becomes asynchronous through
// Communicator::submit(what, op): the Gloo backend queues `op` on the group's
// CommWorker thread; the NCCL backend enqueues it on the group's own stream
// (see nccl_communicator.h). A new blocking collective therefore needs no
// async code of its own: submit("x", [=] { x(...); }).
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ds {

// Completion of one asynchronous operation. Copyable; a default-constructed
// handle is already complete.
// - wait(): the op's results may be used by what the caller does next. CPU:
//   blocks until the op ran, rethrowing its error (a peer failure or a
//   DS_COMM_TIMEOUT expiry, named with the op and group). NCCL: the caller's
//   compute stream waits on the op's event (the host does not block) and
//   NCCL's asynchronous error state is checked.
// - wait_host(): blocks the host until the op finished (both backends).
// - ready(): non-blocking test.
// Every handle should be waited for before its buffers are reused; waiting
// twice is allowed (the second wait returns at once, or rethrows the error).
class CommHandle {
 public:
  struct State {
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual void wait_host() { wait(); }
    virtual bool ready() = 0;
  };
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : s_(std::move(s)) {}
  void wait() {
    if (s_) s_->wait();
  }
  void wait_host() {
    if (s_) s_->wait_host();
  }
  bool ready() const { return !s_ || s_->ready(); }

 private:
  std::shared_ptr<State> s_;
};

// One thread that runs submitted functions one at a time, in submission order.
// After a function throws, the functions queued behind it are not run: their
// handles rethrow "an earlier asynchronous operation on group G failed: ...",
// so a failed group never hangs waiting for peers that gave up.
class CommWorker {
 public:
  explicit CommWorker(std::string group);
  ~CommWorker();  // runs what is queued (or fails it after an error), then joins
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  CommHandle submit(std::string what, std::function<void()> fn);
  // Blocks until every function submitted so far has finished (errors stay
  // in their handles).
  void drain();
  bool on_worker_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  bool idle();

 private:
  struct Task;
  void loop();

  std::string group_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool running_ = false;  // a task is executing
  bool stop_ = false;
  std::string failed_;  // first error message, once a task failed
  std::thread thread_;
};

}  // namespace ds
