// The caching device allocator behind CUDA tensors, and a per-stream scratch
// workspace for kernels that need temporary buffers (reduction partials, the
// cuBLASLt workspace). Host-only header.
#pragma once
#include <cstddef>

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

}  // namespace ds::cuda
