// Check macros for CUDA runtime and cuBLAS(Lt) calls, usable from .cu files.
// The failure path lives in check.cpp (plain C++) so kernels never pull in fmt;
// messages carry file:line, host and rank like every other ds error.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace ds::cuda {

[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void cublas_fail(int status, const char* expr, const char* file, int line);
[[noreturn]] void require_fail(const char* cond, const std::string& msg, const char* file,
                               int line);

}  // namespace ds::cuda

// lib/core may one day define the same names; keep the first definition.
#ifndef DS_CUDA_CHECK
#define DS_CUDA_CHECK(expr)                                                   \
  do {                                                                        \
    cudaError_t ds_err_ = (expr);                                             \
    if (ds_err_ != cudaSuccess) ::ds::cuda::cuda_fail(ds_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#endif

#ifndef DS_CUBLAS_CHECK
#define DS_CUBLAS_CHECK(expr)                                                 \
  do {                                                                        \
    int ds_st_ = static_cast<int>(expr);                                      \
    if (ds_st_ != 0) ::ds::cuda::cublas_fail(ds_st_, #expr, __FILE__, __LINE__); \
  } while (0)
#endif

// Argument validation inside the CUDA backend; msg is a std::string expression.
#define DS_CUDA_REQUIRE(cond, msg)                                            \
  do {                                                                        \
    if (!(cond)) ::ds::cuda::require_fail(#cond, (msg), __FILE__, __LINE__);  \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the call site.
#define DS_CUDA_CHECK_LAUNCH() DS_CUDA_CHECK(cudaGetLastError())
