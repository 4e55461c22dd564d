// Host-synchronisation counter: a process-wide test and profiling hook that
// counts every point where the host waits for outstanding work (a
// cudaDeviceSynchronize / stream or event synchronise / blocking copy / NCCL
// poll on the GPU; a blocking collective, or the first wait on an operation
// of a communication thread, whether or not it had finished, on the CPU
// backend). Tests and `--profile` read the difference over a step
// (docs/distributed.md); no code makes decisions from it. Atomic, so the
// communication threads may count too.
#pragma once
#include <cstdint>

namespace ds {

void count_host_sync(int64_t n = 1);
int64_t host_sync_count();

}  // namespace ds
