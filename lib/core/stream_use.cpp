// The stream-use hook (see stream_use.h).
#include "lib/core/stream_use.h"

#include <atomic>

namespace ds {
namespace {
std::atomic<StreamUseHook>& hook() {
  static std::atomic<StreamUseHook> h{nullptr};
  return h;
}
}  // namespace

void set_stream_use_hook(StreamUseHook h) { hook().store(h); }

void record_stream_use(const void* p, int device_index, void* stream) {
  if (StreamUseHook h = hook().load()) h(p, device_index, stream);
}

}  // namespace ds
