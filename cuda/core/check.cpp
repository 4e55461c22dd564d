// Failure paths of the CUDA check macros: format the message with the
// library's error string and throw ds::Error through the common helper.
#include "cuda/core/check.h"

#include "lib/core/error.h"

namespace ds::cuda {

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  throw_error(file, line, fmt::format("CUDA error {} ({}): {}", static_cast<int>(err),
                                      cudaGetErrorString(err), expr));
}

void cublas_fail(int status, const char* expr, const char* file, int line) {
  throw_error(file, line,
              fmt::format("cuBLAS error {} ({}): {}", status,
                          cublasLtGetStatusString(static_cast<cublasStatus_t>(status)), expr));
}

void require_fail(const char* cond, const std::string& msg, const char* file, int line) {
  throw_error(file, line, fmt::format("check failed: {}: {}", cond, msg));
}

}  // namespace ds::cuda
