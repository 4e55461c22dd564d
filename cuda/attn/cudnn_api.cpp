// Run-time loading of cuDNN (cudnn_api.h); the search is the NCCL loader's
// (lib/core/shared_library.h).
#include "cuda/attn/cudnn_api.h"

#include <cstdlib>
#include <mutex>

#include "lib/core/error.h"
#include "lib/core/shared_library.h"

namespace ds::cuda {
namespace {

// Opens `path` and fills every entry; "" on success, else why it failed.
std::string try_load(const std::string& path, CudnnApi& api) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    return e ? e : "cannot be loaded";
  }
  std::string why;
  const bool ok = resolve_symbol(lib, "cudnnGetVersion", api.GetVersion, why) &&
                  resolve_symbol(lib, "cudnnGetErrorString", api.GetErrorString, why) &&
                  resolve_symbol(lib, "cudnnGetLastErrorString", api.GetLastErrorString, why) &&
                  resolve_symbol(lib, "cudnnCreate", api.Create, why) && resolve_symbol(lib, "cudnnSetStream", api.SetStream, why) &&
                  resolve_symbol(lib, "cudnnBackendCreateDescriptor", api.BackendCreateDescriptor, why) &&
                  resolve_symbol(lib, "cudnnBackendDestroyDescriptor", api.BackendDestroyDescriptor, why) &&
                  resolve_symbol(lib, "cudnnBackendSetAttribute", api.BackendSetAttribute, why) &&
                  resolve_symbol(lib, "cudnnBackendGetAttribute", api.BackendGetAttribute, why) &&
                  resolve_symbol(lib, "cudnnBackendFinalize", api.BackendFinalize, why) &&
                  resolve_symbol(lib, "cudnnBackendExecute", api.BackendExecute, why);
  if (ok) {
    api.version = api.GetVersion();
    if (api.version < 90000) why = "version " + std::to_string(api.version) + " is older than 9.0";
  }
  if (!why.empty()) {
    ::dlclose(lib);
    return why;
  }
  api.path = path;
  return "";
}

std::once_flag g_once;
CudnnApi g_api;
std::string g_error;

void load_once() {
  std::call_once(g_once, [] {
    const char* o = std::getenv("DS_CUDNN_LIBRARY");
    try {
      g_api = load_cudnn(o ? o : "");
    } catch (const UserError& e) {
      g_error = e.what();
    }
  });
}

}  // namespace

std::vector<std::string> cudnn_library_candidates(const std::string& override_path) {
  return shared_library_candidates(override_path, "libcudnn.so.9", "nvidia/cudnn/lib/libcudnn.so.9*");
}

CudnnApi load_cudnn(const std::string& override_path) {
  std::string tried;
  for (const std::string& path : cudnn_library_candidates(override_path)) {
    CudnnApi api;
    const std::string why = try_load(path, api);
    if (why.empty()) return api;
    tried += (tried.empty() ? "" : "; ") + path + ": " + why;
  }
  throw UserError("attention backend 'cudnn': cannot load cuDNN 9 (" + tried +
                  "); install it (e.g. pip install nvidia-cudnn-cu13), set DS_CUDNN_LIBRARY to libcudnn.so.9, "
                  "or choose --attention-backend flash");
}

const CudnnApi& cudnn() {
  load_once();
  if (!g_error.empty()) throw UserError(g_error);
  return g_api;
}

std::string cudnn_load_error() {
  load_once();
  return g_error;
}

}  // namespace ds::cuda
