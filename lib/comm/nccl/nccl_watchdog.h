// NCCL watchdog: lets blocking NCCL operations be stream-ordered (enqueued on
// the compute stream and returned from without a host wait) while keeping
// the guarantee that a dead or stuck peer never hangs a GPU job.
//
// One watchdog thread per world communicator, shared by every group split
// from it (one per process in dstrain; no global state, so tests may build
// several worlds). Each NCCL operation, blocking or asynchronous, is tracked
// by two events recorded around it: its DS_COMM_TIMEOUT deadline runs from
// when the first completes (the op could start: the work queued before it on
// its stream is done, however far the host ran ahead) until the second does.
// The thread polls those events and ncclCommGetAsyncError of every group, and
// also bounds the time the training thread spends inside an NCCL enqueue
// call. On an NCCL error or a missed deadline it records one clear error
// naming the op, the group and the rank, and then either
// - ends the process (the default): prints the line to stderr and exits with
//   kNcclWatchdogExitCode without aborting the communicators, since the
//   process exit releases them and ncclCommAbort itself can block; dsrun
//   then tears the job down. The training thread, if it touches a group
//   meanwhile, waits for the exit instead of racing it, so the exit code and
//   the message are always the watchdog's; or
// - (DS_NCCL_WATCHDOG_EXIT=0) aborts every communicator of the world and
//   leaves the error for the training thread, which throws it where it next
//   touches a group (an op, synchronize, a handle's wait).
// A second thread (StallMonitor), which makes no CUDA call, ends the process
// if the watchdog thread itself stops making passes for the longest group
// timeout (its event queries blocked behind another thread's driver call).
// This header stays free of CUDA/NCCL headers.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/stall_monitor.h"

namespace ds {

// The exit code of a process ended by the watchdog (EX_TEMPFAIL: the job may
// succeed when restarted, e.g. by dsrun --max_restarts).
inline constexpr int kNcclWatchdogExitCode = 75;

// One group's communicator as the watchdog and the training thread share it.
// `mu` guards `comm`: the training thread holds it while calling NCCL on the
// group, the watchdog while querying or aborting it, so an abort never frees
// a communicator under a running call.
struct NcclGroupState {
  std::mutex mu;
  void* comm = nullptr;  // ncclComm_t; null once aborted or destroyed
  std::string name;
  int rank = 0, size = 1, device = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(1800)};
  // Set (steady-clock ns) while the training thread is inside an NCCL call on
  // the group; a call that never returns (a peer lost while connecting) is
  // reported as a timeout of `enqueue_what`.
  std::atomic<int64_t> enqueue_since_ns{0};
  std::atomic<const char*> enqueue_what{""};
};

class NcclWatchdog {
 public:
  // `exit_process`: the default failure handling above (false: abort and throw).
  NcclWatchdog(int device, bool exit_process);
  ~NcclWatchdog();  // stops the thread; the events of pending ops are released
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Watches the group from now on (its enqueue clock and, once `comm` is set,
  // its asynchronous error); starts the thread with the first group.
  void add_group(std::shared_ptr<NcclGroupState> g);
  // Before the group's communicator is destroyed: forgets it and its pending ops.
  void remove_group(const NcclGroupState* g);
  // Records an event on `stream` (cudaStream_t) before an op is enqueued there;
  // pass it to track() (or to release() if the op was not enqueued).
  void* mark_start(void* stream);
  void release(void* start_event);
  // Records an event after the op just enqueued on `stream` and watches the
  // pair. Call it without g->mu held.
  void track(const std::shared_ptr<NcclGroupState>& g, const char* what, void* stream, void* start_event);
  // The training thread's view of a failure: throws it (abort mode) or waits
  // for the process to end (exit mode). Cheap when nothing failed.
  void check();
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  bool exits_process() const { return exit_process_; }
  // Ops tracked and not yet seen complete (tests).
  size_t pending();

 private:
  struct Entry {
    std::shared_ptr<NcclGroupState> group;
    const char* what;
    void* stream;  // cudaStream_t the op was enqueued on
    void* start;  // cudaEvent_t before the op; null once seen complete
    void* event;  // cudaEvent_t after it
    std::chrono::steady_clock::time_point deadline;  // set when `start` completed
  };
  void loop();
  std::string check_ops(std::chrono::steady_clock::time_point now, bool* cuda_error);
  std::string check_groups();
  void fail(const std::string& message);
  void* take_event();  // from the free list, or a new one
  void start_thread_locked();  // with mu_ held

  int device_;
  bool exit_process_;
  std::mutex mu_;  // guards everything below except failed_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<NcclGroupState>> groups_;
  std::vector<Entry> pending_;  // in issue order (per stream, completion order)
  std::vector<void*> free_events_;
  std::string failure_;
  std::atomic<bool> failed_{false};
  bool stop_ = false;
  std::thread thread_;
  // Ends the process when the thread makes no pass for the longest group
  // timeout (its CUDA event queries blocked behind another thread's driver
  // call); started with the thread.
  std::unique_ptr<StallMonitor> monitor_;
  std::chrono::milliseconds longest_timeout_{0};
};

}  // namespace ds
