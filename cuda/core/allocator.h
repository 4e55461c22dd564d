// The caching device allocator behind CUDA tensors, and a per-stream scratch
// workspace for kernels that need temporary buffers (reduction partials, the
// cuBLASLt workspace). Host-only header.
#pragma once
#include <cstddef>
#include <cstdint>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds::cuda {

// Returns the process-wide caching allocator (created on first use).
Allocator& caching_allocator();

// Workspace slots: buffers that may be live at the same time use different slots.
enum class WorkspaceSlot { Ops = 0, Blas = 1, Attn = 2 };

// A device buffer of at least `bytes` on the current device, private to stream
// `s` and `slot`. Valid until the next call with the same (stream, slot); work
// queued on `s` may use it. Growing synchronizes `s` before freeing the old one.
void* stream_workspace(const Stream& s, size_t bytes, WorkspaceSlot slot = WorkspaceSlot::Ops);
// Changes whenever a workspace is (re)allocated: a CUDA graph captured before
// may address a freed workspace (StepGraph::stale).
uint64_t stream_workspace_generation();

// The CUDA graph capture pool (see allocator.cpp; used by StepGraph): begin
// routes every allocation to the pool until end; release hands the pool's
// free blocks back to the cache (the graph is gone). Bytes the pool holds.
void begin_capture_pool(int dev);
void end_capture_pool();
void release_capture_pool();
size_t capture_pool_bytes();

}  // namespace ds::cuda
