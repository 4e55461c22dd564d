// Host-synchronisation counter (see sync_counter.h).
#include "lib/core/sync_counter.h"

#include <atomic>

namespace ds {
namespace {
std::atomic<int64_t>& counter() {
  static std::atomic<int64_t> c{0};
  return c;
}
}  // namespace

void count_host_sync(int64_t n) { counter().fetch_add(n, std::memory_order_relaxed); }
int64_t host_sync_count() { return counter().load(std::memory_order_relaxed); }

}  // namespace ds
