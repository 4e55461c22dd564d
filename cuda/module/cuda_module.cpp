// The CUDA backend module's one entry point (libds_cuda_backend.so; the
// loader and the table are in lib/core/cuda_module.h): the CUDA device
// runtime, the op table with every ds::cuda op of DS_OP_LIST, the NCCL
// communicator factory and the offload copier. The program loads this module
// with dlopen only when a CUDA device is asked for, so only then are
// libcudart, cuBLAS(Lt) (and later NCCL and cuDNN, loaded by their own
// loaders) mapped into it.
#include <type_traits>

#include "cuda/cuda_api.h"
#include "lib/core/cuda_module.h"
#include "lib/core/device_runtime.h"
#include "lib/ops/op_table.h"
#include "lib/ops/ops.h"
#include "lib/runtime/offload_pipeline.h"
#ifdef DS_WITH_NCCL
#include "lib/comm/nccl/nccl_communicator.h"
#include "lib/comm/nccl_module.h"
#endif

namespace ds {
// lib/runtime/cuda/offload_copier_cuda.cpp (built into this module).
std::unique_ptr<OffloadCopier> make_cuda_offload_copier();
}  // namespace ds

namespace {

const ds::ops::OpTable kOps = {
    .n_ops = ds::ops::kOpCount,
#define DS_OP_TABLE_ENTRY(name, Args) .name = &::ds::cuda::name,
    DS_OP_LIST(DS_OP_TABLE_ENTRY)
#undef DS_OP_TABLE_ENTRY
    .lowp = {},                  // the CPU backend's (CUDA kernels take bf16 as it is)
    .lowp_description = nullptr,
};

const ds::OffloadModuleApi kOffload = {.make_copier = &ds::make_cuda_offload_copier};

#ifdef DS_WITH_NCCL
std::unique_ptr<ds::Communicator> nccl_create_world(std::shared_ptr<ds::TcpStore> store, int rank, int size,
                                                    int local_rank, std::chrono::milliseconds op_timeout) {
  return ds::NcclCommunicator::create_world(std::move(store), rank, size, local_rank, op_timeout);
}
const ds::NcclModuleApi kNccl = {.create_world = &nccl_create_world};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) bool ds_cuda_module_init(uint32_t abi, ds::CudaModuleTable* out) {
  out->abi = ds::kCudaModuleAbi;
  if (abi != ds::kCudaModuleAbi) return false;
  auto set = [&](ds::CudaModulePart p, const void* v) {
    out->parts[static_cast<size_t>(p)] = const_cast<void*>(v);
  };
  set(ds::CudaModulePart::Runtime, &ds::cuda::device_runtime_instance());
  set(ds::CudaModulePart::Ops, &kOps);
#ifdef DS_WITH_NCCL
  set(ds::CudaModulePart::Nccl, &kNccl);
#endif
  set(ds::CudaModulePart::Offload, &kOffload);
  return true;
}

// The entry point's type is the loader's (a mismatch is a compile error here).
static_assert(std::is_same_v<decltype(&ds_cuda_module_init), ds::CudaModuleInit>);
