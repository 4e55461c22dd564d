// Stream-aware freeing of device memory: work queued on a stream other than
// the compute stream (NCCL's communication stream) declares the device blocks
// it uses, so that the caching allocator does not hand such a block to a new
// owner before that work has finished. The CUDA backend installs the hook
// (cuda/core/allocator.cpp); without it (CPU builds) the call does nothing.
#pragma once

namespace ds {

using StreamUseHook = void (*)(const void* p, int device_index, void* stream);
void set_stream_use_hook(StreamUseHook hook);
// Work on `stream` (a cudaStream_t) reads or writes the device block holding `p`.
void record_stream_use(const void* p, int device_index, void* stream);

}  // namespace ds
