// One family of check macros for the GPU libraries: DS_CUDA_CHECK (CUDA
// runtime), DS_CUBLAS_CHECK (cuBLAS / cuBLASLt), DS_NCCL_CHECK (NCCL through
// its run-time loaded table, lib/comm/nccl/nccl_api.h) and DS_CUDA_REQUIRE
// (argument checks the CUDA backend keeps). Every failure is one ds::Error
// "<library> error <code> (<library's text>): <expression>" with file:line,
// host and rank (ds::throw_error). Header-only and free of fmt, so .cu files
// and lib/comm/nccl use it without linking anything beyond the library they call.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace ds {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);  // lib/core/error.h
}  // namespace ds

namespace ds::cuda {

// The failure path of every macro of the family.
[[noreturn]] inline void check_fail(const char* lib, long code, const char* text, const char* expr,
                                    const char* file, int line) {
  ::ds::throw_error(file, line, std::string(lib) + " error " + std::to_string(code) + " (" +
                                    (text ? text : "?") + "): " + expr);
}
[[noreturn]] inline void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  check_fail("CUDA", static_cast<long>(err), cudaGetErrorString(err), expr, file, line);
}
[[noreturn]] inline void cublas_fail(int status, const char* expr, const char* file, int line) {
  check_fail("cuBLAS", status, cublasLtGetStatusString(static_cast<cublasStatus_t>(status)), expr,
             file, line);
}
[[noreturn]] inline void require_fail(const char* cond, const std::string& msg, const char* file,
                                      int line) {
  ::ds::throw_error(file, line, "check failed: " + std::string(cond) + ": " + msg);
}

// The result of cudaEventQuery / cudaStreamQuery, with a "not ready" answer
// taken out of the thread's last-error slot: left there, the next
// DS_CUDA_CHECK_LAUNCH (cudaGetLastError after a launch) would report it as
// that launch's failure. Every event or stream query goes through it.
inline cudaError_t query_status(cudaError_t e) {
  if (e == cudaErrorNotReady) (void)cudaGetLastError();
  return e;
}

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
