// The CPU runtime, the stand-in for a device type whose backend is missing,
// and the registry (device_runtime.h). The CUDA runtime comes from the CUDA
// backend module (cuda_module.h), loaded the first time it is asked for.
#include "lib/core/device_runtime.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "lib/core/cuda_module.h"
#include "lib/core/error.h"

namespace ds {

namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  bool available() const override { return true; }
  std::string unavailable_reason() const override { return ""; }
  int device_count() const override { return 1; }
  void init_device(int) override {}
  std::string device_name() const override { return "cpu"; }
  double peak_bf16_tflops() const override { return 0; }
  void set_attention_backend(AttentionBackend) override {}
  void* alloc_pinned(size_t bytes) override {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void free_pinned(void* p) override { std::free(p); }
  void upload_async(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_pinned_async(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  size_t max_allocated_bytes() const override { return 0; }
  std::unique_ptr<DeviceGraph> make_graph() override {
    DS_USER_ERROR("step graphs (--cuda-graph) need --device cuda");
  }
};

// A device type whose backend is missing (a build without CUDA, a module
// that does not load): every use is a user error naming the reason.
class MissingRuntime final : public DeviceRuntime {
 public:
  MissingRuntime(DeviceType t, std::string reason) : type_(t), reason_(std::move(reason)) {}
  DeviceType type() const override { return type_; }
  bool available() const override { return false; }
  std::string unavailable_reason() const override { return reason_; }
  int device_count() const override { return 0; }
  void init_device(int) override { fail(); }
  std::string device_name() const override { return "none"; }
  double peak_bf16_tflops() const override { return 0; }
  void set_attention_backend(AttentionBackend) override { fail(); }
  void* alloc_pinned(size_t) override { fail(); }
  void free_pinned(void*) override {}
  void upload_async(void*, const void*, size_t) override { fail(); }
  void copy_pinned_async(void*, const void*, size_t) override { fail(); }
  void synchronize() override {}
  size_t max_allocated_bytes() const override { return 0; }
  std::unique_ptr<DeviceGraph> make_graph() override { fail(); }

 private:
  [[noreturn]] void fail() const { throw UserError("--device cuda: " + reason_); }
  DeviceType type_;
  std::string reason_;
};

constexpr size_t kTypes = 2;  // DeviceType::CPU, DeviceType::CUDA

// The CUDA module's runtime, or a MissingRuntime saying why it did not load.
DeviceRuntime* load_cuda_runtime() {
  if (cuda_module_error().empty())
    if (auto* rt = static_cast<DeviceRuntime*>(cuda_module_part(CudaModulePart::Runtime)))
      return rt;
  static MissingRuntime missing(DeviceType::CUDA, cuda_module_error().empty()
                                                      ? "the CUDA backend module has no device runtime"
                                                      : cuda_module_error());
  return &missing;
}

struct Registry {
  std::mutex mu;
  std::array<DeviceRuntime*, kTypes> rt{};
};

Registry& registry() {
  static CpuRuntime cpu;
  static Registry r;
  static const bool init = (r.rt[0] = &cpu, true);
  (void)init;
  return r;
}

}  // namespace

DeviceRuntime& device_runtime(DeviceType type) {
  const auto i = static_cast<size_t>(type);
  DS_CHECK(i < kTypes, "device type {} has no runtime", i);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.rt[i]) return *r.rt[i];
  }
  // Only CUDA starts unset. The module loads outside the lock: its static
  // initializers run during dlopen.
  DeviceRuntime* rt = load_cuda_runtime();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.rt[i]) r.rt[i] = rt;
  return *r.rt[i];
}

void register_device_runtime(DeviceType type, DeviceRuntime& rt) {
  const auto i = static_cast<size_t>(type);
  DS_CHECK(i < kTypes && rt.type() == type, "registering a runtime for device type {}", i);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rt[i] = &rt;
}

}  // namespace ds
