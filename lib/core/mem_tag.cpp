// Live bytes of tagged tensor allocations (see mem_tag.h).
#include "lib/core/mem_tag.h"

#include <sys/resource.h>

#include <atomic>

namespace ds {
namespace {

thread_local MemTag t_tag = MemTag::None;

std::atomic<int64_t>& counter(MemTag tag, DeviceType dev) {
  static std::atomic<int64_t> c[kMemTags][2];  // [tag][CPU, CUDA]
  return c[static_cast<int>(tag)][dev == DeviceType::CUDA ? 1 : 0];
}

}  // namespace

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

MemTagScope::MemTagScope(MemTag t) : prev_(t_tag) { t_tag = t; }
MemTagScope::~MemTagScope() { t_tag = prev_; }

MemTag current_mem_tag() { return t_tag; }

int64_t live_tagged_bytes(MemTag tag, DeviceType dev) { return counter(tag, dev).load(std::memory_order_relaxed); }

void count_tagged_bytes(MemTag tag, DeviceType dev, int64_t bytes) {
  if (tag != MemTag::None) counter(tag, dev).fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace ds
