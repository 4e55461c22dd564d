// The CUDA copy engine of the offloaded optimizer step (lib/runtime/
// offload_pipeline.h): gradient copies to the host on one non-blocking
// stream, weight copies to the device on another (the GPU's two copy
// engines), each copy followed by an event the host can wait on. Both
// streams first wait for the compute stream's work at begin(), so the
// gradients they read are final. Host buffers are page-locked in place
// (cudaHostRegister) when pin_memory asks for it: an asynchronous copy from
// pageable memory would be staged through a driver buffer and not overlap.
#include <cuda_runtime.h>

#include <map>
#include <vector>

#include "cuda/core/check.h"
#include "lib/core/error.h"
#include "lib/core/sync_counter.h"
#include "lib/runtime/offload_pipeline.h"

namespace ds {

namespace {

class CudaCopier : public OffloadCopier {
 public:
  CudaCopier() {
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&to_host_, cudaStreamNonBlocking));
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&to_device_, cudaStreamNonBlocking));
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
  }
  ~CudaCopier() override {
    // Teardown: nothing useful to do with an error here.
    cudaStreamSynchronize(to_host_);
    cudaStreamSynchronize(to_device_);
    for (auto& [ticket, e] : events_) cudaEventDestroy(e);
    cudaEventDestroy(computed_);
    cudaStreamDestroy(to_host_);
    cudaStreamDestroy(to_device_);
    for (Tensor& t : pinned_) cudaHostUnregister(t.raw());
  }

  Tensor host_buffer(int64_t numel, bool pinned) override {
    Tensor t = Tensor::empty({numel}, DType::F32, Device::cpu());
    if (pinned && t.nbytes() > 0) {
      DS_CUDA_CHECK(cudaHostRegister(t.raw(), t.nbytes(), cudaHostRegisterDefault));
      pinned_.push_back(t);  // keeps the memory alive until it is unregistered
    }
    return t;
  }

  void begin() override {
    DS_CUDA_CHECK(cudaEventRecord(computed_, nullptr));  // the compute stream (legacy default)
    DS_CUDA_CHECK(cudaStreamWaitEvent(to_host_, computed_, 0));
    DS_CUDA_CHECK(cudaStreamWaitEvent(to_device_, computed_, 0));
  }

  void to_host(const Tensor& dst, const Tensor& src, int ticket) override {
    check(dst, src, true);
    DS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, to_host_));
    DS_CUDA_CHECK(cudaEventRecord(event(ticket), to_host_));
  }

  void to_device(const Tensor& dst, const Tensor& src, int ticket) override {
    check(src, dst, false);
    DS_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, to_device_));
    DS_CUDA_CHECK(cudaEventRecord(event(ticket), to_device_));
  }

  void wait(int ticket) override {
    auto it = events_.find(ticket);
    DS_CHECK(it != events_.end(), "offload copy {} was never issued", ticket);
    count_host_sync();
    DS_CUDA_CHECK(cudaEventSynchronize(it->second));
  }

  void finish() override {
    count_host_sync(2);
    DS_CUDA_CHECK(cudaStreamSynchronize(to_host_));
    DS_CUDA_CHECK(cudaStreamSynchronize(to_device_));
  }

 private:
  static void check(const Tensor& host, const Tensor& device, bool to_host) {
    DS_CHECK(host.device().is_cpu() && device.device().is_cuda() && host.nbytes() == device.nbytes(),
             "offload copy {}: host {} bytes, device {} bytes", to_host ? "to the host" : "to the device",
             host.nbytes(), device.nbytes());
  }
  cudaEvent_t event(int ticket) {
    auto it = events_.find(ticket);
    if (it != events_.end()) return it->second;  // reused every step: re-recording is allowed
    cudaEvent_t e;
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_[ticket] = e;
    return e;
  }

  cudaStream_t to_host_ = nullptr, to_device_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  std::map<int, cudaEvent_t> events_;
  std::vector<Tensor> pinned_;
};

}  // namespace

std::unique_ptr<OffloadCopier> make_cuda_offload_copier() { return std::make_unique<CudaCopier>(); }

}  // namespace ds
