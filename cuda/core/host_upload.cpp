// Host-to-device uploads that do not block the host (the training tokens and
// targets of every micro-batch). A copy from pageable memory makes the host
// wait for the device, so each upload first copies the data into a pinned
// staging buffer and queues an asynchronous copy from there on the compute
// stream. The staging buffers form a ring; each records an event after its
// copy, and a buffer is only written again once that event completed, so a
// copy still in flight never sees its source change.
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>

#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "cuda/cuda_api.h"
#include "lib/core/sync_counter.h"

namespace ds::cuda {
namespace {

// Two uploads per micro-batch: 16 buffers let the host run 8 micro-batches
// ahead of the device before it has to wait for a copy to finish.
constexpr int kRingSlots = 16;

struct StagingSlot {
  void* host = nullptr;  // pinned, StagingRing::capacity bytes
  cudaEvent_t copied = nullptr;  // recorded after the copy that reads `host`
  int device = -1;               // device of `copied`
};

struct StagingRing {
  std::mutex mu;
  StagingSlot slots[kRingSlots];
  size_t capacity = 0;  // bytes of every slot's buffer
  int next = 0;
};

StagingRing& ring() {
  static StagingRing* r = new StagingRing();  // never destroyed: uploads may run during exit
  return *r;
}

// Blocks until the slot's previous copy finished (counted: a host wait), which
// only happens when the device is far behind the host.
void wait_for_slot(StagingSlot& s) {
  if (!s.copied) return;
  const cudaError_t q = query_status(cudaEventQuery(s.copied));
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) DS_CUDA_CHECK(q);
  count_host_sync();
  DS_CUDA_CHECK(cudaEventSynchronize(s.copied));
}

// Gives every slot a buffer of `bytes` at once, so that all of them are
// allocated by the first upload (pinned allocation and release may
// synchronise the device: counted, and only when a larger micro-batch
// arrives, i.e. in the first step or when a curriculum lengthens the sequence).
void grow(StagingRing& r, size_t bytes) {
  count_host_sync();
  for (StagingSlot& s : r.slots) {
    wait_for_slot(s);
    if (s.host) DS_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
  }
  r.capacity = 0;
  for (StagingSlot& s : r.slots) DS_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
  r.capacity = bytes;
}

}  // namespace

void upload_async(void* dst, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  // The ring's events and host waits cannot be captured; a captured step
  // copies from its own fixed pinned buffers (copy_pinned_async).
  require_not_capturing("upload_async (the pinned staging ring)");
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  StagingRing& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  if (bytes > r.capacity) grow(r, bytes);
  StagingSlot& s = r.slots[r.next];
  r.next = (r.next + 1) % kRingSlots;
  wait_for_slot(s);
  if (s.copied && s.device != dev) {  // events belong to a device
    DS_CUDA_CHECK(cudaEventDestroy(s.copied));
    s.copied = nullptr;
  }
  if (!s.copied) {
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    s.device = dev;
  }
  std::memcpy(s.host, src_host, bytes);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, nullptr));
  DS_CUDA_CHECK(cudaEventRecord(s.copied, nullptr));
}

}  // namespace ds::cuda
