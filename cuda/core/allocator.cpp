// Caching device allocator: freed blocks go to a per-device free list keyed by
// size and are handed out again without cudaMalloc, so the step loop does not
// allocate from the driver after the first iterations.
// Semantics: a block freed while work that uses it is still queued may be
// handed to the next allocation at once; this is safe when that work and the
// new owner's work run on the same stream (stream order), which is how the
// compute stream uses it. Work on another stream (NCCL's communication
// stream) declares its blocks with record_stream_use: the allocator records
// an event on that stream, and a freed block with unfinished events waits in
// a pending list (not reusable) until every event completed; each alloc
// first returns the completed ones to the free list.
// CUDA graph capture (cuda/core/step_graph.cpp): while the step is captured,
// allocations come from a pool owned by the graph, filled only from blocks
// already cached (cudaMalloc is illegal while capturing: a miss throws), and
// every block freed during the capture joins the pool too, since the graph's
// kernels still address it on every replay. Pool blocks are never handed to
// an allocation outside a capture; they go back to the cache when the graph
// is released.
#include "cuda/core/allocator.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "lib/core/error.h"
#include "lib/core/stream_use.h"
#include "lib/core/sync_counter.h"

namespace ds::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kSmallLimit = size_t(1) << 20;     // <= 1 MiB: 512-byte granules
constexpr size_t kLargeGranule = size_t(2) << 20;   // > 1 MiB: 2 MiB granules

size_t round_size(size_t bytes) {
  if (bytes <= kSmallLimit) return (bytes + 511) / 512 * 512;
  return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

// Sets the current device for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    DS_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != dev) DS_CUDA_CHECK(cudaSetDevice(dev));
    dev_ = dev;
  }
  ~DeviceGuard() {
    if (prev_ != dev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0, dev_ = 0;
};

class CachingAllocator final : public Allocator {
 public:
  void* alloc(size_t bytes, int dev) override {
    DS_CHECK(dev >= 0 && dev < kMaxDevices, "CUDA device index {} out of range", dev);
    size_t size = round_size(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_) return alloc_captured(size, bytes, dev);
    reclaim_pending(-1);
    auto& fl = free_[dev];
    auto it = fl.lower_bound(size);
    // Reuse a cached block unless it would waste more than half of itself.
    if (it != fl.end() && it->first <= 2 * size) {
      void* p = it->second;
      size_t got = it->first;
      fl.erase(it);
      return take(p, got, dev);
    }
    DeviceGuard g(dev);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    // Only "out of memory" is retried after returning the cache: any other
    // error (a sticky one left by a faulting kernel) is that error, named.
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the (non-sticky) allocation failure
      release_cached(dev);
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      // The configuration's doing (as out of host memory): one line.
      cudaGetLastError();
      DS_USER_ERROR("CUDA out of memory on device {}: allocating {} bytes ({:.2f} GiB) failed with {:.2f} GiB in "
                    "use; the model, micro batch or sequence length is too large for this GPU (a smaller "
                    "--micro-batch-size, activation recomputation or a ZeRO stage needs less)",
                    dev, bytes, bytes / 1073741824.0, in_use_ / 1073741824.0);
    }
    DS_CUDA_CHECK(err);
    reserved_[dev] += size;
    return take(p, size, dev);
  }

  void free(void* p, int dev) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours (should not happen)
    size_t size = it->second;
    live_.erase(it);
    in_use_ -= size;
    if (capturing_ || pool_owned_.count(p)) {  // the graph addresses it: stays reserved for the graph
      pool_owned_.insert(p);
      pool_free_.emplace(size, p);
      return;
    }
    auto u = uses_.find(p);
    if (u != uses_.end()) {  // another stream may still use it: reusable once its events completed
      pending_.push_back(Pending{p, size, dev, events_of(u->second)});
      uses_.erase(u);
      return;
    }
    free_[dev].emplace(size, p);
  }

  void record_stream_use(const void* p, int dev, void* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(const_cast<void*>(p));
    if (it == live_.begin()) return;  // not a block of ours (host memory, a blob)
    --it;
    if (static_cast<const char*>(p) >= static_cast<char*>(it->first) + it->second) return;
    DeviceGuard g(dev);
    // One event per (block, stream), recorded again on every use: a stream
    // runs in order, so its newest record covers the older ones (a long-lived
    // block, such as the gradients every all-reduce reads, keeps one event
    // per stream instead of one per collective).
    std::vector<StreamUse>& uses = uses_[it->first];
    for (StreamUse& u : uses)
      if (u.stream == stream) {
        DS_CUDA_CHECK(cudaEventRecord(u.event, static_cast<cudaStream_t>(stream)));
        return;
      }
    cudaEvent_t ev = nullptr;
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t r = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (r != cudaSuccess) cudaEventDestroy(ev);
    DS_CUDA_CHECK(r);
    uses.push_back({stream, ev});
  }

  // zero and copy are queued on the compute stream (the legacy default
  // stream, which every op uses) and do not block the host: the kernels
  // queued after them see their result in stream order, and a communication
  // stream is ordered after the compute stream by the event its collective
  // waits on (lib/comm/nccl). The gradients and the residual gradient are
  // zeroed every micro-batch, so a device synchronisation here would be
  // several per step.
  void zero(void* p, size_t bytes, int dev) override {
    DeviceGuard g(dev);
    DS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_stream()));
  }
  void to_host(void* dst, const void* src, size_t bytes, int dev) override {
    require_not_capturing("a device-to-host copy");
    DeviceGuard g(dev);
    count_host_sync();
    DS_CUDA_CHECK(cudaDeviceSynchronize());  // results of work on any stream
    DS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void from_host(void* dst, const void* src, size_t bytes, int dev) override {
    require_not_capturing("a blocking host-to-device copy");
    DeviceGuard g(dev);
    count_host_sync();
    DS_CUDA_CHECK(cudaDeviceSynchronize());  // earlier readers of dst are done
    DS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void copy(void* dst, const void* src, size_t bytes, int dev) override {
    DeviceGuard g(dev);
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
               int dev) override {
    if (width == 0 || height == 0) return;
    DeviceGuard g(dev);
    if (height == 1) {  // a pitch below the width is fine for one row, not for cudaMemcpy2D
      DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice, compute_stream()));
      return;
    }
    DS_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice,
                                    compute_stream()));
  }

  void begin_capture_pool(int dev) {
    std::lock_guard<std::mutex> lock(mu_);
    DS_CHECK(!capturing_, "a CUDA graph capture pool is already active");
    DS_CHECK(pool_owned_.empty() || pool_dev_ == dev, "one CUDA graph pool per process (device {} vs {})", dev,
             pool_dev_);
    capturing_ = true;
    pool_dev_ = dev;
  }
  void end_capture_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = false;
  }
  // The graph is gone: its free blocks return to the cache; its live ones
  // will when their tensors free them.
  void release_capture_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = false;
    for (auto& [size, p] : pool_free_) {
      auto u = uses_.find(p);
      if (u != uses_.end()) {  // another stream used it before it joined the pool: reusable once done
        pending_.push_back(Pending{p, size, pool_dev_, events_of(u->second)});
        uses_.erase(u);
        continue;
      }
      free_[pool_dev_].emplace(size, p);
    }
    pool_free_.clear();
    pool_owned_.clear();
  }
  size_t capture_pool_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (void* p : pool_owned_) {
      auto it = live_.find(p);
      if (it != live_.end()) n += it->second;
    }
    for (auto& [size, p] : pool_free_) n += size;
    return n;
  }

  size_t in_use() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  size_t max_in_use() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_use_;
  }
  void reset_max() {
    std::lock_guard<std::mutex> lock(mu_);
    max_in_use_ = in_use_;
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int d = 0; d < kMaxDevices; ++d)
      if (!free_[d].empty()) release_cached(d);
  }

 private:
  void* take(void* p, size_t size, int dev) {
    live_[p] = size;
    in_use_ += size;
    if (in_use_ > max_in_use_) max_in_use_ = in_use_;
    return p;
  }
  // Caller holds mu_. During a capture: a pool block, else a cached block that
  // joins the pool; never the driver. Pending blocks are not reclaimed (their
  // events are not queried while the stream is captured).
  void* alloc_captured(size_t size, size_t bytes, int dev) {
    DS_CHECK(dev == pool_dev_, "CUDA graph capture on device {} allocates on device {}", pool_dev_, dev);
    // The smallest fitting block of the two lists, as an eager allocation
    // picks from one cache holding both: the capture repeats the warm-up's choices.
    std::multimap<size_t, void*>* best = nullptr;
    std::multimap<size_t, void*>::iterator best_it;
    for (auto* fl : {&pool_free_, &free_[dev]}) {
      auto it = fl->lower_bound(size);
      if (it == fl->end() || it->first > 2 * size) continue;
      if (!best || it->first < best_it->first) {
        best = fl;
        best_it = it;
      }
    }
    if (best) {
      void* p = best_it->second;
      size_t got = best_it->first;
      best->erase(best_it);
      pool_owned_.insert(p);
      return take(p, got, dev);
    }
    DS_THROW("CUDA graph capture needs a new device block of {} bytes and cudaMalloc is not allowed while "
             "capturing (the warm-up steps did not allocate this size)", bytes);
  }
  struct Pending {
    void* p;
    size_t size;
    int dev;
    std::vector<cudaEvent_t> events;
  };
  // Caller holds mu_. Pending blocks whose events all completed go back to
  // the free list; `synced_dev` >= 0: that device was just synchronised, so
  // its blocks are free whatever their events say.
  void reclaim_pending(int synced_dev) {
    for (size_t i = 0; i < pending_.size();) {
      Pending& b = pending_[i];
      bool done = true;
      for (cudaEvent_t e : b.events)
        if (b.dev != synced_dev && query_status(cudaEventQuery(e)) != cudaSuccess) done = false;
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : b.events) cudaEventDestroy(e);
      free_[b.dev].emplace(b.size, b.p);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }
  // Caller holds mu_.
  void release_cached(int dev) {
    DeviceGuard g(dev);
    cudaDeviceSynchronize();
    reclaim_pending(dev);
    for (auto& [size, p] : free_[dev]) {
      cudaFree(p);
      reserved_[dev] -= size;
    }
    free_[dev].clear();
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_[kMaxDevices];
  std::map<void*, size_t> live_;  // ordered: record_stream_use finds the block holding a view
  struct StreamUse {
    void* stream;
    cudaEvent_t event;  // recorded after the stream's latest use of the block
  };
  static std::vector<cudaEvent_t> events_of(const std::vector<StreamUse>& uses) {
    std::vector<cudaEvent_t> e;
    for (const StreamUse& u : uses) e.push_back(u.event);
    return e;
  }
  std::unordered_map<void*, std::vector<StreamUse>> uses_;  // live blocks used by other streams
  std::vector<Pending> pending_;  // freed, waiting for their events
  size_t reserved_[kMaxDevices] = {};
  size_t in_use_ = 0, max_in_use_ = 0;
  // CUDA graph capture pool (one graph per process).
  bool capturing_ = false;
  int pool_dev_ = 0;
  std::set<void*> pool_owned_;               // every block the graph may address
  std::multimap<size_t, void*> pool_free_;   // free pool blocks (reused only by a capture)
};

CachingAllocator& instance() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed: tensors may outlive main
  return *a;
}

struct WorkspaceKey {
  void* stream;
  int device;
  int slot;
  bool operator==(const WorkspaceKey& o) const {
    return stream == o.stream && device == o.device && slot == o.slot;
  }
};
struct WorkspaceKeyHash {
  size_t operator()(const WorkspaceKey& k) const {
    return std::hash<void*>()(k.stream) ^ (size_t(k.device) << 8) ^ size_t(k.slot);
  }
};
struct WorkspaceBuf {
  void* p = nullptr;
  size_t bytes = 0;
};

}  // namespace

Allocator& caching_allocator() {
  set_stream_use_hook([](const void* p, int dev, void* stream) { instance().record_stream_use(p, dev, stream); });
  return instance();
}

size_t allocated_bytes() { return instance().in_use(); }
size_t max_allocated_bytes() { return instance().max_in_use(); }
void reset_max_allocated_bytes() { instance().reset_max(); }
void empty_cache() { instance().empty_cache(); }
void begin_capture_pool(int dev) { instance().begin_capture_pool(dev); }
void end_capture_pool() { instance().end_capture_pool(); }
void release_capture_pool() { instance().release_capture_pool(); }
size_t capture_pool_bytes() { return instance().capture_pool_bytes(); }

namespace {
std::atomic<uint64_t> g_workspace_generation{0};
}  // namespace

uint64_t stream_workspace_generation() { return g_workspace_generation.load(); }

void* stream_workspace(const Stream& s, size_t bytes, WorkspaceSlot slot) {
  static std::mutex mu;
  static auto* bufs = new std::unordered_map<WorkspaceKey, WorkspaceBuf, WorkspaceKeyHash>();
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  WorkspaceBuf& b = (*bufs)[WorkspaceKey{s.handle, dev, static_cast<int>(slot)}];
  if (b.bytes >= bytes && b.p) return b.p;
  require_not_capturing("allocating a stream workspace (cudaMalloc)");
  g_workspace_generation.fetch_add(1);  // a captured graph holding the old pointer is stale now
  size_t want = round_size(bytes < 4096 ? 4096 : bytes + bytes / 4);
  if (b.p) {  // grows in the first steps only (shapes repeat)
    count_host_sync();
    DS_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
    DS_CUDA_CHECK(cudaFree(b.p));
    b.p = nullptr;
    b.bytes = 0;
  }
  cudaError_t err = cudaMalloc(&b.p, want);
  if (err == cudaErrorMemoryAllocation) {  // the cache may hold what is missing: return it, then once more
    cudaGetLastError();
    empty_cache();
    err = cudaMalloc(&b.p, want);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      b.p = nullptr;
      DS_USER_ERROR("CUDA out of memory on device {}: a {}-byte stream workspace does not fit (after returning "
                    "the allocator's cache); the model, micro batch or sequence length is too large for this GPU",
                    dev, want);
    }
  }
  DS_CUDA_CHECK(err);
  b.bytes = want;
  return b.p;
}

}  // namespace ds::cuda
