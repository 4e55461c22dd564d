// Counts what the host submits to the GPU (kernel launches, graph launches,
// copies, memsets) while a LaunchCounter is alive, through CUPTI's callback
// API on the CUDA runtime and driver entry points: every launch our code,
// cuBLAS(Lt) or the runtime itself issues, not only the ones that pass
// through our launch helpers. CUPTI is loaded at run time (the CUDA
// toolkit's or pip's libcupti), so only the test that asks for it needs it.
// For test_cuda_graph.cpp: what a replayed step submits outside its graph.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace ds::test {

struct LaunchCounts {
  // Runtime API (cudaLaunchKernel..., cudaGraphLaunch, cudaMemcpy..., cudaMemset...).
  int64_t kernels = 0, graphs = 0, memsets = 0, async_copies = 0, sync_copies = 0;
  // Driver API kernel launches (cuLaunchKernel...: libraries that launch through the driver).
  int64_t driver_kernels = 0;
  LaunchCounts operator-(const LaunchCounts& o) const {
    return {kernels - o.kernels,           graphs - o.graphs,           memsets - o.memsets,
            async_copies - o.async_copies, sync_copies - o.sync_copies, driver_kernels - o.driver_kernels};
  }
  std::string str() const;
};

class LaunchCounter {
 public:
  // Subscribes to CUPTI's runtime and driver API callbacks; throws (naming
  // the libraries tried, or CUPTI's error) when that is not possible.
  LaunchCounter();
  ~LaunchCounter();
  LaunchCounter(const LaunchCounter&) = delete;
  LaunchCounter& operator=(const LaunchCounter&) = delete;
  LaunchCounts counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::test
