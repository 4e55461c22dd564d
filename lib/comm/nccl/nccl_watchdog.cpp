// The NCCL watchdog thread (nccl_watchdog.h): event polling, deadlines,
// ncclCommGetAsyncError, and the one failure path.
#include "lib/comm/nccl/nccl_watchdog.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "lib/comm/nccl/nccl_api.h"
#include "lib/core/error.h"

namespace ds {
namespace {

using Clock = std::chrono::steady_clock;

// How often the thread looks: a failure is seen within this of its deadline;
// completed events go back to the free list at this pace.
constexpr auto kPollPeriod = std::chrono::milliseconds(5);
// Abort mode: how long the failure path waits for a group's lock, which the
// training thread holds only while it is inside an NCCL call on the group.
constexpr auto kAbortLockWait = std::chrono::seconds(5);

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::string where(const NcclGroupState& g) {
  return fmt::format("group '{}' (rank {} of {}, device {})", g.name, g.rank, g.size, g.device);
}

}  // namespace

NcclWatchdog::NcclWatchdog(int device, bool exit_process) : device_(device), exit_process_(exit_process) {}

NcclWatchdog::~NcclWatchdog() {
  if (monitor_) monitor_->pause();  // the thread stops on purpose
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  monitor_.reset();
  // Destroying an event whose work is still queued is allowed: CUDA releases it once done.
  for (const Entry& e : pending_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
    if (e.start) cudaEventDestroy(static_cast<cudaEvent_t>(e.start));
  }
  for (void* ev : free_events_) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}

// The thread runs from the first group on, so the enqueue clock also bounds
// the world's first calls (ncclCommInitRank, the first collective's
// connection set-up), before any op was tracked.
void NcclWatchdog::add_group(std::shared_ptr<NcclGroupState> g) {
  std::lock_guard<std::mutex> lk(mu_);
  longest_timeout_ = std::max(longest_timeout_, g->timeout);
  if (monitor_) monitor_->set_limit(longest_timeout_);
  groups_.push_back(std::move(g));
  start_thread_locked();
}

void NcclWatchdog::start_thread_locked() {
  if (thread_.joinable() || stop_) return;
  if (!monitor_) {
    const std::chrono::milliseconds limit =
        longest_timeout_.count() > 0 ? longest_timeout_ : std::chrono::milliseconds(std::chrono::minutes(30));
    monitor_ = std::make_unique<StallMonitor>(limit, [](double idle_s) {
      std::fprintf(stderr,
                   "NCCL watchdog (%s): the watchdog thread made no progress for %.0f s (DS_COMM_TIMEOUT; it is "
                   "blocked inside a CUDA call, probably behind a hung device operation); ending the process "
                   "(exit code %d)\n",
                   error_origin().c_str(), idle_s, kNcclWatchdogExitCode);
      std::fflush(nullptr);
      std::_Exit(kNcclWatchdogExitCode);
    });
  }
  thread_ = std::thread([this] { loop(); });
}

void NcclWatchdog::remove_group(const NcclGroupState* g) {
  std::lock_guard<std::mutex> lk(mu_);
  // Stable: the watchdog relies on pending_ being in issue order per stream.
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].group.get() == g) {
      free_events_.push_back(pending_[i].event);  // re-recording a pending event is allowed
      if (pending_[i].start) free_events_.push_back(pending_[i].start);
      continue;
    }
    if (keep != i) pending_[keep] = std::move(pending_[i]);
    ++keep;
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(keep), pending_.end());
  for (size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].get() == g) {
      groups_.erase(groups_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
}

void* NcclWatchdog::take_event() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_events_.empty()) {
      void* ev = free_events_.back();
      free_events_.pop_back();
      return ev;
    }
  }
  cudaEvent_t ev = nullptr;
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
}

void* NcclWatchdog::mark_start(void* stream) {
  void* ev = take_event();
  const cudaError_t r = cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream));
  if (r != cudaSuccess) {
    release(ev);
    DS_CUDA_CHECK(r);
  }
  return ev;
}

void NcclWatchdog::release(void* start_event) {
  if (!start_event) return;
  std::lock_guard<std::mutex> lk(mu_);
  free_events_.push_back(start_event);
}

void NcclWatchdog::track(const std::shared_ptr<NcclGroupState>& g, const char* what, void* stream,
                         void* start_event) {
  void* ev = take_event();
  // Not yet in pending_, so the thread cannot be querying it.
  const cudaError_t r = cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream));
  std::lock_guard<std::mutex> lk(mu_);
  if (r != cudaSuccess) {
    free_events_.push_back(ev);
    if (start_event) free_events_.push_back(start_event);
    DS_CUDA_CHECK(r);
  }
  pending_.push_back({g, what, stream, start_event, ev, Clock::time_point::max()});
  start_thread_locked();
}

size_t NcclWatchdog::pending() {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.size();
}

void NcclWatchdog::check() {
  if (!failed()) return;
  if (exit_process_) {
    // The watchdog has printed the error and is ending the process: waiting
    // here keeps the training thread from racing it with another exit path
    // (or computing on the results of failed operations).
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(mu_);
    msg = failure_;
  }
  throw Error(msg);
}

void NcclWatchdog::loop() {
  // Every way out of the loop is on purpose: the monitor stops watching.
  struct Done {
    StallMonitor* m;
    ~Done() { m->pause(); }
  } done{monitor_.get()};
  // CUDA calls of this thread (event queries) need the communicators' device.
  if (cudaSetDevice(device_) != cudaSuccess) {
    fail(fmt::format("NCCL watchdog: cudaSetDevice({}) failed", device_));
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kPollPeriod);
    if (stop_) break;
    monitor_->beat();
    bool cuda_error = false;
    std::string failure = check_ops(Clock::now(), &cuda_error);
    // A CUDA error in an event query is sticky (a kernel faulted): every CUDA
    // call of the training thread now fails at once with it, naming where,
    // so nothing can hang on the device any more; it is that thread's error
    // to report (not a peer failure), and the watchdog stops.
    if (cuda_error) return;
    if (failure.empty()) failure = check_groups();
    if (!failure.empty()) {
      lk.unlock();
      fail(failure);
      return;
    }
  }
}

// With mu_ held: the pending ops; "" or the failure (`cuda_error` set when it
// is a CUDA error rather than a missed deadline).
std::string NcclWatchdog::check_ops(std::chrono::steady_clock::time_point now, bool* cuda_error) {
  std::string failure;
  // Completed ops release their events. Events of one stream complete in
  // issue order, so per stream only the oldest pending op is queried (the
  // host may be thousands of ops ahead; this keeps a pass short and mu_,
  // which track() needs, free). Its deadline starts when its start event
  // completes; past it the op fails (a CUDA error, a sticky one from any
  // kernel, is reported too). The later ops of its stream have not
  // started, so they have no deadline yet.
  std::vector<void*> blocked;  // streams whose oldest pending op is incomplete
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Entry& e = pending_[i];
    bool look = failure.empty();
    for (void* st : blocked) look = look && st != e.stream;
    if (look) {
      const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e.event));
      if (r == cudaSuccess) {
        free_events_.push_back(e.event);
        if (e.start) free_events_.push_back(e.start);
        continue;  // dropped
      }
      blocked.push_back(e.stream);
      cudaError_t rs = cudaErrorNotReady;
      if (r == cudaErrorNotReady && e.start) {
        rs = cudaEventQuery(static_cast<cudaEvent_t>(e.start));
        if (rs == cudaSuccess) {
          free_events_.push_back(e.start);
          e.start = nullptr;
          e.deadline = now + e.group->timeout;
        }
      }
      // r is "not ready" or an error; rs "not ready", success or an error.
      cudaError_t bad = r != cudaErrorNotReady ? r : cudaSuccess;
      if (bad == cudaSuccess && rs != cudaSuccess && rs != cudaErrorNotReady) bad = rs;
      if (bad != cudaSuccess) *cuda_error = true;
      if (bad != cudaSuccess)
        failure = fmt::format("NCCL {} on {}: CUDA error while waiting for it: {}", e.what, where(*e.group),
                              cudaGetErrorString(bad));
      else if (now > e.deadline)
        failure = fmt::format("NCCL {} on {} timed out after {} s (DS_COMM_TIMEOUT): a peer probably died or "
                              "stopped calling collectives", e.what, where(*e.group),
                              e.group->timeout.count() / 1000);
    }
    if (keep != i) pending_[keep] = std::move(e);
    ++keep;
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(keep), pending_.end());
  return failure;
}

// With mu_ held: each group's enqueue clock and NCCL's asynchronous error.
std::string NcclWatchdog::check_groups() {
  std::string failure;
  const int64_t t = now_ns();
  for (size_t i = 0; i < groups_.size() && failure.empty(); ++i) {
    NcclGroupState& g = *groups_[i];
    const int64_t since = g.enqueue_since_ns.load(std::memory_order_acquire);
    if (since != 0 && t - since > std::chrono::duration_cast<std::chrono::nanoseconds>(g.timeout).count()) {
      failure = fmt::format("NCCL {} on {} did not return from its enqueue call within {} s (DS_COMM_TIMEOUT): a "
                            "peer probably died", g.enqueue_what.load(), where(g), g.timeout.count() / 1000);
      break;
    }
    // try_lock: the training thread may be inside a (slow) NCCL call on the
    // group; the error is seen on a later pass, the hang by the check above.
    std::unique_lock<std::mutex> gl(g.mu, std::try_to_lock);
    if (!gl.owns_lock() || !g.comm) continue;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = nccl().CommGetAsyncError(static_cast<ncclComm_t>(g.comm), &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclSuccess && async != ncclInProgress) {
      const char* last = nccl().GetLastError(static_cast<ncclComm_t>(g.comm));
      const char* what = "operation";
      for (const Entry& e : pending_)
        if (e.group.get() == &g) {
          what = e.what;
          break;
        }
      failure = fmt::format("NCCL {} on {} failed: {}{}{}; a peer probably failed", what, where(g),
                            nccl().GetErrorString(async), last && *last ? ": " : "", last ? last : "");
    }
  }
  return failure;
}

// Called on the watchdog thread without mu_ held (an abort takes the groups'
// locks, which the training thread holds while it calls NCCL and then takes
// mu_ in track()).
void NcclWatchdog::fail(const std::string& message) {
  std::vector<std::shared_ptr<NcclGroupState>> groups;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failure_ = message;
    groups = groups_;
  }
  failed_.store(true, std::memory_order_release);
  auto end_process = [](const std::string& why) {
    std::fprintf(stderr, "NCCL watchdog (%s): %s; ending the process (exit code %d)\n", error_origin().c_str(),
                 why.c_str(), kNcclWatchdogExitCode);
    std::fflush(nullptr);
    std::_Exit(kNcclWatchdogExitCode);
  };
  if (exit_process_) end_process(message);
  // Abort mode: every group of the world (ops on any of them may wait on the
  // failed one), so nothing queued behind the failure can hang; the training
  // thread throws `message` where it next touches a group. A training thread
  // stuck inside an NCCL call (it holds the group's lock, or it is creating
  // the communicator) cannot be reached by an abort: the process ends as in
  // exit mode rather than hang.
  for (const auto& g : groups) {
    std::unique_lock<std::mutex> gl(g->mu, std::defer_lock);
    const auto until = Clock::now() + kAbortLockWait;
    while (!gl.try_lock() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!gl.owns_lock() || (!g->comm && g->enqueue_since_ns.load(std::memory_order_acquire) != 0))
      end_process(fmt::format("{} (the training thread is stuck inside NCCL {} on {}, which no abort reaches)",
                              message, g->enqueue_what.load(), where(*g)));
    if (g->comm) nccl().CommAbort(static_cast<ncclComm_t>(g->comm));
    g->comm = nullptr;
  }
}

}  // namespace ds
