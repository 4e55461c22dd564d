// The CUDA DeviceRuntime (lib/core/device_runtime.h): the cuda_api.h entry
// points behind the device-neutral interface, and the step graph behind
// DeviceGraph. Registered by the op dispatcher (lib/ops/ops.cpp).
#include "cuda/cuda_api.h"
#include "lib/core/device_runtime.h"

namespace ds::cuda {
namespace {

class CudaGraph final : public DeviceGraph {
 public:
  void begin_capture() override { g_.begin_capture(); }
  size_t end_capture() override { return g_.end_capture(); }
  void abort_capture() override { g_.abort_capture(); }
  void replay() override { g_.replay(); }
  bool ready() const override { return g_.ready(); }
  bool stale() const override { return g_.stale(); }
  size_t pool_bytes() const override { return g_.pool_bytes(); }

 private:
  StepGraph g_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  bool available() const override { return device_available(); }
  std::string unavailable_reason() const override { return cuda::unavailable_reason(); }
  int device_count() const override { return cuda::device_count(); }
  void init_device(int index) override { cuda::init_device(index); }
  std::string device_name() const override { return cuda::device_name(); }
  double peak_bf16_tflops() const override { return cuda::peak_bf16_tflops(); }
  void set_attention_backend(AttentionBackend b) override {
    cuda::set_attention_backend(b);
  }
  void* alloc_pinned(size_t bytes) override { return cuda::alloc_pinned(bytes); }
  void free_pinned(void* p) override { cuda::free_pinned(p); }
  void upload_async(void* dst, const void* src, size_t bytes) override { cuda::upload_async(dst, src, bytes); }
  void copy_pinned_async(void* dst, const void* src, size_t bytes) override {
    cuda::copy_pinned_async(dst, src, bytes);
  }
  void synchronize() override { cuda::synchronize(); }
  size_t max_allocated_bytes() const override { return cuda::max_allocated_bytes(); }
  std::unique_ptr<DeviceGraph> make_graph() override { return std::make_unique<CudaGraph>(); }
};

}  // namespace

DeviceRuntime& device_runtime_instance() {
  static CudaRuntime rt;
  return rt;
}

}  // namespace ds::cuda
