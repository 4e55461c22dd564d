// The CPU runtime, the stand-in for a device type this build has no backend
// for, and the registry (device_runtime.h).
#include "lib/core/device_runtime.h"

#include <array>
#include <cstdlib>
#include <cstring>

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
  void set_attention_backend(const std::string&) override {}
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

// A device type this build has no backend for: every use is a user error.
class MissingRuntime final : public DeviceRuntime {
 public:
  explicit MissingRuntime(DeviceType t) : type_(t) {}
  DeviceType type() const override { return type_; }
  bool available() const override { return false; }
  std::string unavailable_reason() const override {
    return "this build has no CUDA backend (nvcc was not found at configure time); use --device cpu";
  }
  int device_count() const override { return 0; }
  void init_device(int) override { fail(); }
  std::string device_name() const override { return "none"; }
  double peak_bf16_tflops() const override { return 0; }
  void set_attention_backend(const std::string&) override { fail(); }
  void* alloc_pinned(size_t) override { fail(); }
  void free_pinned(void*) override {}
  void upload_async(void*, const void*, size_t) override { fail(); }
  void copy_pinned_async(void*, const void*, size_t) override { fail(); }
  void synchronize() override {}
  size_t max_allocated_bytes() const override { return 0; }
  std::unique_ptr<DeviceGraph> make_graph() override { fail(); }

 private:
  [[noreturn]] void fail() const { throw UserError("--device cuda: " + unavailable_reason()); }
  DeviceType type_;
};

constexpr size_t kTypes = 2;  // DeviceType::CPU, DeviceType::CUDA

std::array<DeviceRuntime*, kTypes>& registry() {
  static CpuRuntime cpu;
  static MissingRuntime cuda(DeviceType::CUDA);
  static std::array<DeviceRuntime*, kTypes> r{&cpu, &cuda};
  return r;
}

}  // namespace

DeviceRuntime& device_runtime(DeviceType type) {
  const auto i = static_cast<size_t>(type);
  DS_CHECK(i < kTypes, "device type {} has no runtime", i);
  return *registry()[i];
}

void register_device_runtime(DeviceType type, DeviceRuntime& rt) {
  const auto i = static_cast<size_t>(type);
  DS_CHECK(i < kTypes && rt.type() == type, "registering a runtime for device type {}", i);
  registry()[i] = &rt;
}

}  // namespace ds
