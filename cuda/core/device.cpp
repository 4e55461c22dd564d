// Device discovery and runtime helpers of the CUDA backend: availability,
// init (device selection + allocator registration), name, peak throughput for
// MFU, synchronisation, and the attention backend switch.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "cuda/core/allocator.h"
#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "cuda/cuda_api.h"
#include "lib/core/error.h"
#include "lib/core/sync_counter.h"

namespace ds::cuda {
namespace {

std::atomic<double> g_peak_override{0.0};
std::atomic<int> g_attn_backend{static_cast<int>(AttentionBackend::Flash)};
std::atomic<int> g_flash2_dq{static_cast<int>(Flash2Dq::Recompute)};

// Dense bf16 tensor-core FLOPs per SM per clock (fp32 accumulate) by
// architecture; 0 when we do not know the architecture.
double bf16_flops_per_sm_per_clock(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;  // A100 (3rd-gen tensor cores)
  if (major == 8) return 1024;                // GA10x / Ada (sm_86, sm_87, sm_89)
  if (major == 9) return 4096;                // H100 / H200
  if (major == 10) return 8192;               // B200 / GB200
  return 0;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool device_available() { return device_count() > 0; }

std::string unavailable_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(err);
  }
  return n > 0 ? "" : "no CUDA device";
}

void init_device(int device_index) {
  int n = device_count();
  DS_CHECK(device_index >= 0 && device_index < n,
           "CUDA device {} requested but {} device(s) are visible ({})", device_index, n,
           n == 0 ? unavailable_reason() : "check CUDA_VISIBLE_DEVICES / LOCAL_RANK");
  DS_CUDA_CHECK(cudaSetDevice(device_index));
  static std::once_flag once;
  std::call_once(once, [] { register_allocator(DeviceType::CUDA, &caching_allocator()); });
}

std::string device_name() {
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

// NVIDIA's datasheet dense bf16 peaks of the common training parts, by
// device name: what MFU figures in the field (Megatron, llm.c) divide by.
// They assume a tensor-core clock below the maximum boost clock the driver
// reports (H100 SXM: 1830 vs 1980 MHz), so the computed figure would be ~8%
// high there. 0: not a listed part.
static double datasheet_bf16_tflops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") || has("H200")) {
    if (has("PCIe")) return 756.0;
    if (has("NVL")) return 835.5;
    return 989.4;  // SXM (the name is e.g. "NVIDIA H100 80GB HBM3"), H200, GH200
  }
  if (has("A100")) return 312.0;
  return 0;
}

double peak_bf16_tflops() {
  double o = g_peak_override.load();
  if (o > 0) return o;
  if (const char* env = std::getenv("DS_PEAK_BF16_TFLOPS")) {
    double v = std::atof(env);
    if (v > 0) return v;
  }
  if (const double d = datasheet_bf16_tflops(device_name()); d > 0) return d;
  int dev = 0, major = 0, minor = 0, sms = 0, clock_khz = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  double per_clock = bf16_flops_per_sm_per_clock(major, minor);
  return per_clock * sms * (clock_khz * 1e3) / 1e12;
}

void set_peak_bf16_tflops(double tflops) { g_peak_override.store(tflops > 0 ? tflops : 0.0); }

void synchronize() {
  require_not_capturing("cuda::synchronize");
  count_host_sync();
  DS_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_flash2_dq_mode(Flash2Dq m) { g_flash2_dq.store(static_cast<int>(m)); }
Flash2Dq flash2_dq_mode() { return static_cast<Flash2Dq>(g_flash2_dq.load()); }

void set_attention_backend(AttentionBackend b) { g_attn_backend.store(static_cast<int>(b)); }
AttentionBackend attention_backend() {
  return static_cast<AttentionBackend>(g_attn_backend.load());
}
AttentionBackend attention_backend_from_name(const std::string& name) {
  if (const auto b = ds::attention_backend_from_name(name)) return *b;
  DS_USER_ERROR("attention_backend: unknown value '{}' (expected flash, flash2, plain or cudnn)", name);
}

}  // namespace ds::cuda
