// DeviceRuntime: what the trainer, the data pipeline and the tools need from
// a device beyond its ops (lib/ops): start-up, page-locked host buffers,
// asynchronous uploads, synchronisation, allocator statistics and captured
// step graphs. The CPU runtime lives here; the CUDA one (cuda/core/
// device_runtime_cuda.cpp) comes from the CUDA backend module, loaded the
// first time device_runtime(CUDA) is called (lib/core/cuda_module.h), so
// nothing above lib/core needs `#ifdef DS_WITH_CUDA` and a CPU process never
// loads it. Where the module is missing (a build without CUDA, a module that
// does not load) the runtime answers available() == false with the reason.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "lib/core/attention_backend.h"
#include "lib/core/dtype.h"

namespace ds {

// A step recorded once and replayed (CUDA graphs). Between begin_capture and
// end_capture the host's work on the compute stream is recorded, not run.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void begin_capture() = 0;
  // Ends the capture and instantiates the graph; returns its node count.
  // Throws (the capture discarded) if the capture was invalidated.
  virtual size_t end_capture() = 0;
  virtual void abort_capture() = 0;  // after an exception in the region; no-op otherwise
  virtual void replay() = 0;
  virtual bool ready() const = 0;
  virtual bool stale() const = 0;        // memory it may address was reallocated: capture again
  virtual size_t pool_bytes() const = 0;  // device bytes the graph's memory pool holds
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;
  // Whether a device of this type can be used; the reason when not. Never throw.
  virtual bool available() const = 0;
  virtual std::string unavailable_reason() const = 0;
  virtual int device_count() const = 0;
  // Selects device `index` for this process (idempotent).
  virtual void init_device(int index) = 0;
  virtual std::string device_name() const = 0;
  // Dense bf16 peak in TFLOP/s for MFU (0: unknown).
  virtual double peak_bf16_tflops() const = 0;
  // The attention kernels a run asks for; a no-op where the device has one
  // implementation.
  virtual void set_attention_backend(AttentionBackend b) = 0;

  // Page-locked host memory (plain host memory on the CPU).
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  // Host -> device memory `dst` in stream order; the caller may reuse `src` at once.
  virtual void upload_async(void* dst, const void* src, size_t bytes) = 0;
  // Pinned host -> device in stream order (recorded during a capture);
  // `pinned_src` must stay unchanged until the copy ran.
  virtual void copy_pinned_async(void* dst, const void* pinned_src, size_t bytes) = 0;
  // Waits for all work queued on the device.
  virtual void synchronize() = 0;
  // Peak bytes the device allocator handed out (0 where it keeps none).
  virtual size_t max_allocated_bytes() const = 0;
  // A new, empty step graph; UserError where the device has none.
  virtual std::unique_ptr<DeviceGraph> make_graph() = 0;
};

// The runtime of `type`: the CPU's, the CUDA module's (loaded on the first
// call for CUDA), or one that is not available and says why.
DeviceRuntime& device_runtime(DeviceType type);
inline DeviceRuntime& device_runtime(Device d) { return device_runtime(d.type); }
// Installs `rt` for `type` in place of the module's (tests); `rt` must outlive the process.
void register_device_runtime(DeviceType type, DeviceRuntime& rt);

}  // namespace ds
