// Host-synchronisation counter: a process-wide test and profiling hook that
// counts every point where the host waits for outstanding work (a
// cudaDeviceSynchronize / stream synchronise / blocking copy on the GPU; a
// blocking wait for a communication thread or a blocking collective on the
// CPU backend). Tests and `--profile` read the difference over a step; no
// code makes decisions from it. Atomic, so the communication threads may
// count too.
#pragma once
#include <cstdint>

namespace ds {

void count_host_sync(int64_t n = 1);
int64_t host_sync_count();

}  // namespace ds
