// The compute stream as the CUDA code sees it, and the guard that keeps host
// synchronisations out of a CUDA graph capture (cuda/core/step_graph.cpp,
// docs/cuda.md "CUDA graphs"). Internal to cuda/ (includes the runtime).
#pragma once
#include <cuda_runtime.h>

namespace ds::cuda {

// The stream that a null Stream handle means: the legacy default stream,
// except while StepGraph captures the step, when it is the graph's capture
// stream (the legacy stream cannot be captured). Every launch and async
// copy that used the null stream goes through here.
cudaStream_t compute_stream();
inline cudaStream_t resolve_stream(void* handle) {
  return handle ? static_cast<cudaStream_t>(handle) : compute_stream();
}
// Throws (naming `what`) if the compute stream is being captured: `what`
// would wait for the device, allocate from the driver or use the staging
// ring's events, none of which a graph can hold.
void require_not_capturing(const char* what);

}  // namespace ds::cuda
