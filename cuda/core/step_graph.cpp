// CUDA graph of the training step (docs/cuda.md, "CUDA graphs"): the
// compute-stream override used while capturing, the capture itself (global
// mode, checked end, instantiate), the replay, and the fixed pinned buffers
// a captured step copies its tokens from.
//
// Why a second stream: every launch uses the legacy default stream, which
// cannot be captured. While capturing, compute_stream() is a blocking stream
// of our own, so the same launches land in the graph. The replay runs on the
// legacy stream, ordered after the eager work before it and before the eager
// work after it with no event of ours. The capture stream is blocking on
// purpose: a launch that still went to the legacy stream during the capture
// fails the capture (cudaErrorStreamCaptureImplicit) instead of running
// outside the graph unnoticed.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/core/allocator.h"
#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "cuda/cuda_api.h"
#include "lib/core/error.h"

namespace ds::cuda {
namespace {

std::atomic<cudaStream_t> g_capture_stream{nullptr};  // set only between begin_capture and its end

}  // namespace

cudaStream_t compute_stream() { return g_capture_stream.load(std::memory_order_relaxed); }

void require_not_capturing(const char* what) {
  cudaStream_t s = g_capture_stream.load(std::memory_order_relaxed);
  if (!s) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  DS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  DS_CHECK(st == cudaStreamCaptureStatusNone,
           "{} inside the captured CUDA graph region (--cuda-graph): the step up to its one host read must not "
           "wait for the device or allocate from the driver",
           what);
}

struct StepGraph::Impl {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool capturing = false;
  size_t nodes = 0;
  uint64_t workspace_generation = 0;  // stream_workspace_generation() at the capture
  void drop() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
    nodes = 0;
  }
};

StepGraph::StepGraph() : impl_(new Impl) {}

StepGraph::~StepGraph() {
  abort_capture();
  const bool had_pool = impl_->exec != nullptr;
  impl_->drop();
  // A replay still running was launched on the legacy stream, so any later
  // owner of these blocks (its work is on that stream too) runs after it.
  if (had_pool) release_capture_pool();
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void StepGraph::begin_capture() {
  DS_CHECK(!impl_->capturing, "StepGraph::begin_capture: already capturing");
  DS_CHECK(!g_capture_stream.load(), "StepGraph::begin_capture: another capture is in progress");
  if (impl_->exec) {  // re-capture: the old graph and its pool go first
    impl_->drop();
    release_capture_pool();
  }
  if (!impl_->stream) DS_CUDA_CHECK(cudaStreamCreate(&impl_->stream));  // blocking (see the file comment)
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  begin_capture_pool(dev);
  const cudaError_t err = cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeGlobal);
  if (err != cudaSuccess) {  // nothing is capturing: the allocator leaves capture mode too
    cudaGetLastError();
    release_capture_pool();
    DS_THROW("CUDA graph capture of the step could not begin: {}", cudaGetErrorString(err));
  }
  g_capture_stream.store(impl_->stream);
  impl_->capturing = true;
}

size_t StepGraph::end_capture() {
  DS_CHECK(impl_->capturing, "StepGraph::end_capture without begin_capture");
  cudaGraph_t g = nullptr;
  const cudaError_t err = cudaStreamEndCapture(impl_->stream, &g);
  g_capture_stream.store(nullptr);
  impl_->capturing = false;
  end_capture_pool();
  if (err != cudaSuccess || !g) {
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    release_capture_pool();
    DS_THROW("CUDA graph capture of the step failed: {} (an operation in the step cannot be captured)",
             cudaGetErrorString(err));
  }
  impl_->graph = g;
  impl_->workspace_generation = stream_workspace_generation();
  DS_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &impl_->nodes));
  const cudaError_t inst = cudaGraphInstantiate(&impl_->exec, g, 0);
  if (inst != cudaSuccess) {
    impl_->exec = nullptr;
    impl_->drop();
    cudaGetLastError();
    release_capture_pool();
    DS_THROW("CUDA graph instantiation of the step failed: {}", cudaGetErrorString(inst));
  }
  return impl_->nodes;
}

void StepGraph::abort_capture() {
  if (!impl_->capturing) return;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(impl_->stream, &g);  // the capture may already be invalidated: errors are expected
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  g_capture_stream.store(nullptr);
  impl_->capturing = false;
  release_capture_pool();  // the graph never ran: its blocks are free for anyone
}

void StepGraph::replay() {
  DS_CHECK(impl_->exec, "StepGraph::replay before a successful capture");
  DS_CUDA_CHECK(cudaGraphLaunch(impl_->exec, nullptr));  // the legacy stream: ordered with the eager work
}

bool StepGraph::ready() const { return impl_->exec != nullptr; }
bool StepGraph::stale() const {
  return impl_->exec && impl_->workspace_generation != stream_workspace_generation();
}
size_t StepGraph::nodes() const { return impl_->nodes; }
size_t StepGraph::pool_bytes() const { return capture_pool_bytes(); }

void* alloc_pinned(size_t bytes) {
  require_not_capturing("cudaMallocHost");
  void* p = nullptr;
  DS_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return p;
}

void free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

void copy_pinned_async(void* dst, const void* pinned_src, size_t bytes) {
  if (bytes == 0) return;
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, compute_stream()));
}

}  // namespace ds::cuda
