// Dynamic shared memory beyond the default 48 KiB per block: a kernel's
// launch may use the device's opt-in limit (227 KiB on Hopper) once its
// cudaFuncAttributeMaxDynamicSharedMemorySize is raised, and that limit
// covers the kernel's static shared memory (__shared__ arrays) too, so the
// dynamic part a launch can ask for is the opt-in limit less the static part.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "cuda/core/check.h"

namespace ds::cuda {

// Readies `kernel` for launches with `bytes` of dynamic shared memory:
// returns "" (the kernel's limit raised where the 48 KiB default would not
// hold it beside its static memory), or, when the device cannot give one
// block that much, the reason ("needs N bytes of shared memory per block (S
// static + D dynamic), the device allows M").
template <class K>
std::string fit_dynamic_smem(K kernel, size_t bytes) {
  int dev = 0, optin = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes fa{};
  DS_CUDA_CHECK(cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(kernel)));
  const size_t total = fa.sharedSizeBytes + bytes;
  if (total > size_t(optin))
    return "needs " + std::to_string(total) + " bytes of shared memory per block (" +
           std::to_string(fa.sharedSizeBytes) + " static + " + std::to_string(bytes) +
           " dynamic), the device allows " + std::to_string(optin);
  if (total > size_t(48) * 1024)
    DS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return "";
}

}  // namespace ds::cuda
