// Live bytes of tagged tensor allocations: a process-wide counter that lets
// the trainer report the model-state bytes it really allocated (and tests
// compare them with the arithmetic of zero_model_state_bytes), rather than a
// second computation from tensor sizes. A MemTagScope marks the allocations
// its thread makes while it is alive (the persistent parameter, gradient and
// optimizer buffers, allocated by the stores' and the optimizer's
// constructors); each tagged storage adds its bytes when allocated and takes
// them back when its last reference goes. Transient buffers (unit gradients,
// gathered units, communication buckets) are allocated outside any scope and
// are not counted. Like the host-synchronisation counter, no code makes
// decisions from it.
#pragma once
#include <cstdint>

#include "lib/core/dtype.h"

namespace ds {

enum class MemTag : uint8_t { None, Params, Grads, Optimizer };
inline constexpr int kMemTags = 4;

// Peak resident set size of this process so far (getrusage), in bytes.
int64_t peak_rss_bytes();

// Tags the allocations of the calling thread until destroyed (scopes nest; the
// innermost wins).
class MemTagScope {
 public:
  explicit MemTagScope(MemTag t);
  ~MemTagScope();
  MemTagScope(const MemTagScope&) = delete;
  MemTagScope& operator=(const MemTagScope&) = delete;

 private:
  MemTag prev_;
};

MemTag current_mem_tag();
// Bytes of live storages allocated under `tag` on devices of type `dev`.
int64_t live_tagged_bytes(MemTag tag, DeviceType dev);
// Called by Tensor's storage (allocation: +bytes, release: -bytes).
void count_tagged_bytes(MemTag tag, DeviceType dev, int64_t bytes);

}  // namespace ds
