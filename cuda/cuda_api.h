// Public entry points of the CUDA backend that code outside cuda/ may call.
// A plain C++ header (no CUDA includes) so the trainer, tests and benchmarks can
// use it from .cpp files. The ops themselves are declared in lib/ops/ops.h.
#pragma once
#include "lib/core/attention_backend.h"
#include <cstddef>
#include <memory>
#include <string>

namespace ds {
class DeviceRuntime;
}

namespace ds::cuda {

// This backend's DeviceRuntime (lib/core/device_runtime.h), for the op
// dispatcher to register; code above lib/ops reaches it through
// ds::device_runtime(DeviceType::CUDA).
DeviceRuntime& device_runtime_instance();

// True when the CUDA runtime sees at least one device. Never throws.
bool device_available();
// Number of visible devices (0 when the driver or device is missing). Never throws.
int device_count();
// The reason no device is usable ("no CUDA device", driver message), or "" if one is.
std::string unavailable_reason();

// Selects the device for this thread and registers the caching allocator for
// DeviceType::CUDA (idempotent). Call once per rank before creating CUDA tensors.
void init_device(int device_index);

// Name of the current device ("NVIDIA H200").
std::string device_name();

// Dense bf16 tensor-core peak of the current device in TFLOP/s: NVIDIA's
// datasheet figure for the A100, H100 (SXM, PCIe, NVL) and H200, else SM
// count x clock x per-SM rate of its architecture. DS_PEAK_BF16_TFLOPS in the
// environment or set_peak_bf16_tflops() overrides; 0 means unknown (MFU off).
double peak_bf16_tflops();
void set_peak_bf16_tflops(double tflops);  // <= 0 clears the override

// Allocator statistics (bytes handed out to tensors, not counting the cache).
size_t allocated_bytes();
size_t max_allocated_bytes();
void reset_max_allocated_bytes();
// Returns cached, unused blocks to the driver.
void empty_cache();

// Waits for all work on the current device.
void synchronize();

// Copies `bytes` of host memory to device memory `dst` on the current device
// without blocking the host: the data goes through a pinned staging buffer
// (the caller may reuse `src_host` at once) and the copy is queued on the
// compute stream, so later kernels see it in stream order. The host waits
// (counted as a host synchronisation) only when all staging buffers still
// have copies in flight. Used for the tokens and targets of every micro-batch.
void upload_async(void* dst, const void* src_host, size_t bytes);

// The training step as a CUDA graph (--cuda-graph; cuda/core/step_graph.cpp,
// docs/cuda.md "CUDA graphs"). Between begin_capture and end_capture the
// work the host issues on the compute stream is recorded, not run; device
// allocations come from a pool owned by the graph (filled from cached blocks
// only: a block the warm-up never allocated is an error, as is any host
// synchronisation). replay() runs the recorded work on the compute stream.
// Destroying the graph (or capturing again) returns its pool to the cache.
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  void begin_capture();
  // Ends the capture and instantiates the graph; returns its node count.
  // Throws (the capture discarded) if the capture was invalidated.
  size_t end_capture();
  // Discards a capture in progress (after an exception in the region); no-op otherwise.
  void abort_capture();
  void replay();
  bool ready() const;
  // True when a stream workspace the graph may address was reallocated since
  // the capture (work outside the graph needed a larger one): capture again.
  bool stale() const;
  size_t nodes() const;
  size_t pool_bytes() const;  // device bytes the graph's pool holds

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Page-locked host memory: the fixed buffers a captured step copies its
// tokens from (the host refills them before each replay).
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);
// Queues a copy from pinned host memory to device memory on the compute
// stream (recorded into the graph during a capture). `pinned_src` must stay
// unchanged until the copy ran.
void copy_pinned_async(void* dst, const void* pinned_src, size_t bytes);

// Attention implementation used by attention_forward/backward.
//  Flash: our fused FA2-style kernels (bf16/f16, head dim 64 or 128; other
//         cases fall back to Plain).
//  Flash2: the register-resident second generation (mma.sync, cp.async
//         double buffering; cuda/attn/flash2_*.cu). Opt-in until it has been
//         verified on a device; unsupported cases fall back to Flash, then Plain.
//  Plain: non-fused reference kernels (any dtype / head dim; for debugging).
//  Cudnn: cuDNN's fused SDPA graphs (cuda/attn/cudnn_sdpa.cpp; cuDNN 9 loaded
//         at run time, a missing one is an error); unsupported cases (f32,
//         head dim, attention dropout, no engine) fall back to Flash, then Plain.
using ds::AttentionBackend;  // lib/core/attention_backend.h
void set_attention_backend(AttentionBackend b);
AttentionBackend attention_backend();
// "flash" | "flash2" | "plain" | "cudnn" -> backend; throws UserError on anything else.
AttentionBackend attention_backend_from_name(const std::string& name);
// How the flash2 backward computes dQ (both deterministic, no float atomics):
//  Recompute: a separate dQ kernel per query tile recomputes S and dP
//             (7 GEMMs per tile pair). The default.
//  Ordered:   the dK/dV kernel also computes dS K and adds it to an f32
//             accumulator in key-tile order, waiting on a per-query-tile
//             counter (5 GEMMs). Relies on in-order dispatch of the grid's
//             key tiles; opt-in until verified on a device (docs/cuda.md).
enum class Flash2Dq { Recompute, Ordered };
void set_flash2_dq_mode(Flash2Dq m);
Flash2Dq flash2_dq_mode();
// Embedding backward (wte) algorithm:
//  Sorted: the call's tokens are bucketed by vocabulary row once (a stable
//          radix sort on the device), then each row sums its own positions
//          (O(N*C) work). The default.
//  Scan:   every block of 32 rows scans all N tokens (O(V/32 * N)); the
//          earlier kernel, kept as the benchmark's baseline.
// Both are deterministic (no float atomics).
enum class EmbeddingBackward { Sorted, Scan };
void set_embedding_backward(EmbeddingBackward a);
EmbeddingBackward embedding_backward_algorithm();
// Attention calls (non-empty) by the path that ran, since the process
// started: a flash call that fell back (logged once per shape with the
// reason) counts as the path that finally ran (flash2 or cudnn -> flash ->
// plain).
// Tests use it to assert that flash (or flash2) really ran.
struct AttentionPathCounts {
  int64_t flash_forward = 0, plain_forward = 0, flash_backward = 0, plain_backward = 0;
  int64_t flash2_forward = 0, flash2_backward = 0;
  int64_t cudnn_forward = 0, cudnn_backward = 0;
};
AttentionPathCounts attention_path_counts();

}  // namespace ds::cuda
