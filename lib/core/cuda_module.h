// The CUDA backend module (libds_cuda_backend.so, built from cuda/module/):
// found and loaded with dlopen the first time a CUDA device is asked for
// (device_runtime(CUDA), an op on a CUDA tensor, the NCCL backend, the CUDA
// offload copier), so that a CPU process never maps libcudart, cuBLAS(Lt),
// cuDNN or NCCL (~200 MB resident). The module exports one C entry point,
// ds_cuda_module_init, that checks the ABI version and fills a
// CudaModuleTable: one pointer per part, each part's type owned by the layer
// that uses it, so lib/core knows none of them.
// Search order: $DS_CUDA_BACKEND (only that, when set); libds_cuda_backend.so
// next to the program (/proc/self/exe) and in ../lib from there; the build
// tree's cuda/ folder (programs and tests run from the build); the bare name
// through the loader's search path (LD_LIBRARY_PATH: the GPU bundle).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds {

// Bumped whenever CudaModuleTable or a part's type changes.
inline constexpr uint32_t kCudaModuleAbi = 1;
inline constexpr const char* kCudaModuleName = "libds_cuda_backend.so";
inline constexpr const char* kCudaModuleEntry = "ds_cuda_module_init";

enum class CudaModulePart : uint32_t {
  Runtime = 0,  // DeviceRuntime* (lib/core/device_runtime.h)
  Ops,          // const OpTable* (lib/ops/op_table.h)
  Nccl,         // const NcclModuleApi* (lib/comm/nccl_module.h); null in a module built without NCCL
  Offload,      // const OffloadModuleApi* (lib/runtime/offload_pipeline.h)
  Count
};
inline constexpr size_t kCudaModuleParts = static_cast<size_t>(CudaModulePart::Count);

struct CudaModuleTable {
  uint32_t abi = 0;  // the module's kCudaModuleAbi, set even when it differs from the caller's
  void* parts[kCudaModuleParts] = {};
};
// The entry point: sets out->abi; fills out->parts and returns true only when
// `abi` is the module's own.
using CudaModuleInit = bool (*)(uint32_t abi, CudaModuleTable* out);

// Whether this build has a CUDA backend at all (nvcc was found at configure time).
bool cuda_module_built();
// The paths tried, in the order above; `override_path` is $DS_CUDA_BACKEND ("" when unset).
std::vector<std::string> cuda_module_candidates(const std::string& override_path);
// Loads the module on the first call (thread-safe; never unloaded). "" when
// it loaded, else the reason: "cannot load the CUDA backend PATH: dlerror",
// or that the build has no CUDA backend.
const std::string& cuda_module_error();
// Part `p` of the module, loading it first. UserError "--device cuda: <the
// reason>" when the module does not load. Null for a part the module was
// built without.
void* cuda_module_part(CudaModulePart p);
// The path it was loaded from; "" when it is not loaded (never loads it:
// tests check that a CPU run leaves it alone).
std::string cuda_module_loaded_path();

}  // namespace ds
