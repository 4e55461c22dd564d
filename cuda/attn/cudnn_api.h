// The cuDNN entry points the cudnn attention backend uses (cudnn_sdpa.cpp),
// loaded from libcudnn at run time (dlopen) the first time a GPU job runs
// attention with the cudnn backend, so that no binary links libcudnn: builds,
// CPU runs and the other attention backends never need it, and the GPU bundle
// uses the cuDNN installed on the device. Only cudnn_graph.h is needed at
// build time. Search order (as the NCCL loader, lib/comm/nccl/nccl_api.h):
// $DS_CUDNN_LIBRARY (only that, when set); libcudnn.so.9 through the loader's
// path (LD_LIBRARY_PATH, ld.so.cache); /usr/local/cuda/lib64 and
// /usr/lib/x86_64-linux-gnu; the pip package nvidia-cudnn-cu* (nvidia/cudnn/lib)
// under the usual Python site-packages directories ($VIRTUAL_ENV, $PYTHONPATH,
// ~/.local, /usr/local/lib, /usr/lib, /opt/conda).
#pragma once
#include <cudnn_graph.h>

#include <string>
#include <vector>

namespace ds::cuda {

struct CudnnApi {
  decltype(&::cudnnGetVersion) GetVersion = nullptr;
  decltype(&::cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&::cudnnCreate) Create = nullptr;
  decltype(&::cudnnSetStream) SetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) BackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) BackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendSetAttribute) BackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) BackendGetAttribute = nullptr;
  decltype(&::cudnnBackendFinalize) BackendFinalize = nullptr;
  decltype(&::cudnnBackendExecute) BackendExecute = nullptr;
  std::string path;    // the library that was loaded
  size_t version = 0;  // cudnnGetVersion(): 91900 for 9.19.0
};

// The libraries tried, in order, for `override_path` ($DS_CUDNN_LIBRARY; ""
// when unset): just that one when given, else the search order above.
std::vector<std::string> cudnn_library_candidates(const std::string& override_path);
// Loads the first candidate that opens, resolves every symbol and reports a
// major version of 9 or later. UserError naming each path tried and why it
// failed when none does.
CudnnApi load_cudnn(const std::string& override_path);
// The process-wide table, loaded on first use from $DS_CUDNN_LIBRARY or the
// search order (a failure is thrown again on every call).
const CudnnApi& cudnn();
// "" when cudnn() loads, else its error (for tests that skip without cuDNN).
std::string cudnn_load_error();

}  // namespace ds::cuda
